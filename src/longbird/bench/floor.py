"""The GEMM floor of a forward pass: the model's own `nn.Linear` calls replayed alone, and where the rest goes.

A forward of a longbird encoder is, in FLOPs, mostly its dense projections and feed-forward layers (the attention
arithmetic at 4K adds about 22 % at e5-small size, about 512 keys per query). The floor of a forward on a machine is
therefore the time of those same matrix products with nothing around them: this module records every `nn.Linear`
call of one forward (input shape, weight, bias, dtype), replays exactly those calls on fresh inputs of the same shape
in the same process, and reports forward / floor. What is above 1 is data movement, masks, softmax, small kernels
and Python; `op_profile` says which operators take it (torch.profiler, self time per operator).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .sweep import _timed, alternating_times  # timed calls, synchronised on CUDA


@dataclass(frozen=True, eq=False)  # tensors inside: identity, not value, equality
class LinearCall:
    """One `nn.Linear` call of a forward: the module's weight and bias and the input's shape and dtype."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    input_shape: tuple[int, ...]
    input_dtype: torch.dtype

    @property
    def flops(self) -> float:
        rows = 1
        for size in self.input_shape[:-1]:
            rows *= size
        out_features, in_features = self.weight.shape
        return 2.0 * rows * in_features * out_features


def record_linear_calls(model: torch.nn.Module, run: Callable[[], object]) -> list[LinearCall]:
    """Every `nn.Linear` call one `run()` of `model` makes, in order (hooks removed afterwards)."""
    calls: list[LinearCall] = []

    def hook(module, inputs):
        (hidden, *_) = inputs
        calls.append(LinearCall(module.weight.detach(), None if module.bias is None else module.bias.detach(),
                                tuple(hidden.shape), hidden.dtype))

    handles = [module.register_forward_pre_hook(hook) for module in model.modules()
               if isinstance(module, torch.nn.Linear)]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return calls


def replay_fn(calls: list[LinearCall]) -> Callable[[], None]:
    """A closure running exactly `calls` (the same weights, shapes and dtypes) on inputs made once, outside the timing.

    Inputs are random (the values do not change a dense product's time); each product's output is allocated as in
    the forward, since a forward pays for its allocations too."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    inputs = [torch.randn(call.input_shape, generator=generator).to(call.weight.device, call.input_dtype)
              for call in calls]

    def replay():
        with torch.inference_mode():
            for call, hidden in zip(calls, inputs):
                F.linear(hidden, call.weight, call.bias)

    return replay


def floor_measurement(model: torch.nn.Module, run: Callable[[], object], repeats: int = 3,
                      variants: dict[str, Callable[[], object]] | None = None) -> dict:
    """Forward time, the model's own GEMM floor and their ratio, measured alternately in this process.

    The forward, each of `variants` (other ways of running the same forward, e.g. compiled: NAME_seconds, NAME_ratio
    and NAME_first_call_seconds, the first call's time with its compilation) and the replay alternate (F V R F V R
    ...), so a change of machine load hits all alike."""
    device = next(model.parameters()).device
    variants = variants or {}
    calls = record_linear_calls(model, run)
    replay = replay_fn(calls)
    first_calls = {name: _timed(variant, device) for name, variant in variants.items()}
    run()
    replay()  # warm-ups
    times = alternating_times({"forward": run, **{f"variant {name}": v for name, v in variants.items()},
                               "floor": replay}, repeats, device, warm_up=False)
    forward_times, floor_times = times["forward"], times["floor"]
    variant_times = {name: times[f"variant {name}"] for name in variants}
    forward, floor = statistics.median(forward_times), statistics.median(floor_times)
    flops = sum(call.flops for call in calls)
    result = {"forward_seconds": forward, "floor_seconds": floor, "ratio": forward / floor,
              "linear_calls": len(calls), "linear_gflop": flops / 1e9, "floor_gflops": flops / floor / 1e9,
              "forward_samples": forward_times, "floor_samples": floor_times}
    for name, times in variant_times.items():
        median = statistics.median(times)
        result.update({f"{name}_seconds": median, f"{name}_ratio": median / floor, f"{name}_samples": times,
                       f"{name}_first_call_seconds": first_calls[name]})
    return result


def op_profile(run: Callable[[], object], top: int = 12) -> list[dict]:
    """The operators of one `run()` by self CPU time, largest first (torch.profiler), with their share of the total.

    Self time counts an operator's own work, not that of the operators it calls, so the shares add up to 1 over
    all operators and a composite (e.g. `aten::linear`) does not hide its `aten::addmm`."""
    from torch.profiler import ProfilerActivity, profile

    run()  # warm-up outside the profile
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        run()
    events = [event for event in profiler.key_averages() if event.self_cpu_time_total > 0]
    total = sum(event.self_cpu_time_total for event in events)
    events.sort(key=lambda event: event.self_cpu_time_total, reverse=True)
    return [{"op": event.key, "self_ms": event.self_cpu_time_total / 1e3, "calls": event.count,
             "share": event.self_cpu_time_total / total} for event in events[:top]]
