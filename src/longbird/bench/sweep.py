"""`longbird bench`: latency and peak memory vs length for longbird presets and transformers baselines.

All models run in one process, random init, on one device (CPU or CUDA), for each size (base, large), batch
(a number, or "max": the largest power of two up to `max_batch` that fits), dtype and mode. A model is skipped at
longer lengths once one call took longer than `max_seconds`, its projected memory passes `max_memory_gib`, or it
ran out of GPU memory (each recorded as a skip with the reason). Timed calls of different models alternate, so
machine noise hits them alike; on CUDA each call is synchronised before the clock is read.
"""

from __future__ import annotations

import gc
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .memory import peak_allocated_bytes, peak_cuda_bytes
from .models import (
    BASELINES,
    HF_BIGBIRD_BLOCK,
    PRESET_SETTINGS,
    SIZES,
    build_model,
    compiled_name,
    forward_fn,
    linear_flops,
    matmul_throughput,
    synchronize,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODES = ("forward", "forward+backward")
# torch.compile modes a sweep can add beside eager: "reduce-overhead" records CUDA graphs (removes the host's kernel
# launches, the GPU's batch-1 bottleneck); on a CPU it compiles like "default".
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


@dataclass
class SweepSettings:
    models: list[str] = field(default_factory=lambda: ["littlebird", "kobigbird", "full", "hf-bigbird",
                                                        "hf-longformer", "sdpa-roberta"])
    lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384])
    modes: list[str] = field(default_factory=lambda: ["forward", "forward+backward"])
    dtypes: list[str] = field(default_factory=lambda: ["fp32"])
    repeats: int = 3
    max_seconds: float = 60.0
    max_memory_gib: float = 16.0
    device: str = "cpu"
    sizes: list[str] = field(default_factory=lambda: ["base"])
    batches: list[str] = field(default_factory=lambda: ["1"])
    max_batch: int = 64
    gradient_checkpointing: bool = False
    # Each longbird preset also runs as torch.compile(model, fullgraph=True, dynamic=False, mode=MODE), named
    # "PRESET+compile" ("PRESET+compile:MODE" for a mode other than default), timed alternately with eager.
    compile_modes: list[str] = field(default_factory=list)

    def __post_init__(self):
        for mode in self.modes:
            if mode not in MODES:
                raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
        for dtype in self.dtypes:
            if dtype not in DTYPES:
                raise ValueError(f"dtype must be one of {tuple(DTYPES)}; got {dtype!r}")
        for size in self.sizes:
            if size not in SIZES:
                raise ValueError(f"size must be one of {tuple(SIZES)}; got {size!r}")
        for compile_mode in self.compile_modes:
            if compile_mode not in COMPILE_MODES:
                raise ValueError(f"compile mode must be one of {COMPILE_MODES}; got {compile_mode!r}")
        for batch in self.batches:
            if batch != "max" and not (str(batch).isdigit() and int(batch) >= 1):
                raise ValueError(f"batch must be a positive number or 'max'; got {batch!r}")
        if self.repeats < 1:
            raise ValueError(f"--repeats must be at least 1 (timed calls per point); got {self.repeats}")
        for name in self.models:  # refused here, before the progress bar and the first model, not at its turn
            if name not in PRESET_SETTINGS and name not in BASELINES:
                raise ValueError(f"unknown benchmark model {name!r}; choose from {tuple(PRESET_SETTINGS) + BASELINES}")
            block = HF_BIGBIRD_BLOCK if name == "hf-bigbird" else PRESET_SETTINGS.get(name, {}).get("block_size")
            for length in self.lengths:
                if length < 2 or (block and length % block):
                    fix = f"use {-(-length // block) * block}" if block and length >= 2 else "use 512 or more"
                    raise ValueError(f"--length {length} does not fit {name}, which reads whole blocks of {block} "
                                     f"tokens; {fix}" if block else f"--length {length} is too short; {fix}")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()


def run_sweep(settings: SweepSettings, progress: Callable[[str], None] = lambda message: None,
              checkpoint: Callable[[dict], None] = lambda report: None) -> dict:
    """Returns a JSON-ready report: environment, matmul throughput, one row per (size, batch, model, dtype, mode,
    length). `checkpoint(report)` is called after every length so a long sweep that is stopped keeps what it
    measured."""
    import transformers

    # The objects alive now (torch, transformers, ...) never become garbage: freezing them keeps each gc.collect()
    # between timed calls to the benchmark's own objects (0.3 s per collect otherwise, most of a smoke run).
    gc.freeze()
    device = torch.device(settings.device)
    sizes = {name: SIZES[name] for name in settings.sizes}
    report = {
        "settings": asdict(settings), "sizes": sizes, "torch": torch.__version__,
        "transformers": transformers.__version__, "threads": torch.get_num_threads(), "cpu": cpu_model(),
        "device": device.type, "device_name": device_name(device),
        "matmul_tflops": {name: matmul_throughput(DTYPES[name], device) / 1e12 for name in settings.dtypes},
        "rows": [],
    }
    max_length = max(settings.lengths)
    for size, architecture in sizes.items():
        for dtype_name in settings.dtypes:
            for mode in settings.modes:
                models = {name: _prepared(build_model(name, max_length, architecture), device, DTYPES[dtype_name],
                                          mode, settings) for name in settings.models}
                models |= _compiled_variants(models, settings.compile_modes)
                for batch in settings.batches:
                    _sweep_lengths(models, settings, architecture, dict(size=size, dtype=dtype_name, mode=mode,
                                                                        batch_setting=str(batch)),
                                   report, progress, checkpoint)
                del models
                if settings.compile_modes:
                    torch._dynamo.reset()  # the next group's models are new objects: their graphs start afresh
                _release(device)
    return report


def _compiled_variants(models: dict, compile_modes: list[str]) -> dict:
    """The longbird presets among `models`, each compiled whole (one graph: fullgraph=True) in every mode, sharing
    the eager model's weights. Static shapes: every length is its own graph (and CUDA graph), as a server that pads
    to a few lengths would run it."""
    if not compile_modes:
        return {}
    # Every compiled variant and length is a separate entry on the same forward code: allow them all (the default
    # limit of 8 would silently fall back to eager beyond it).
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 4096)
    variants = {}
    for mode in compile_modes:
        for name, model in models.items():
            if name in PRESET_SETTINGS:
                compiled = torch.compile(model, fullgraph=True, dynamic=False, mode=mode)
                compiled.compile_may_fail = True  # a failed compile is a result (a skip with its reason), not a crash
                variants[compiled_name(name, mode)] = compiled
    return variants


def _prepared(model, device, dtype, mode, settings):
    model = model.to(device=device, dtype=dtype)
    if mode != "forward" and settings.gradient_checkpointing:
        from ..modeling import enable_checkpointing

        enable_checkpointing(model)
        model.train()  # checkpointing is active in training mode only (dropout is 0 in every benchmark size)
    return model


def _sweep_lengths(models, settings, architecture, key, report, progress, checkpoint):
    device = torch.device(settings.device)
    skipped: dict[str, str] = {}
    last_peak: dict[str, tuple[int, float]] = {}
    backward = key["mode"] != "forward"
    for length in sorted(settings.lengths):
        active, batches = {}, {}
        for name, model in models.items():
            reason = skipped.get(name) or _projected_over_memory(last_peak.get(name), length, settings)
            batch = None
            if not reason:
                batch, reason = _batch_for(model, length, backward, key["batch_setting"], settings, architecture)
            if reason:
                skipped[name] = reason
                report["rows"].append(dict(key, model=name, length=length, skipped=reason))
                continue
            batches[name] = batch
            active[name] = forward_fn(model, length, backward, batch, architecture)
        progress(f"{key['size']} batch {key['batch_setting']} {key['dtype']} {key['mode']} {length}: "
                 f"{', '.join(active) or 'all skipped'}")
        for name, row in _measure(active, settings.repeats, device,
                                  interleave=key["batch_setting"] != "max").items():
            if "skipped" in row:
                skipped[name] = row["skipped"]
                report["rows"].append(dict(key, model=name, length=length, skipped=row["skipped"]))
                continue
            batch = batches[name]
            factor = 3 if backward else 1  # backward costs two forwards' worth of matmuls
            achieved = linear_flops(length, architecture) * batch * factor / row["median_seconds"] / 1e12
            row.update(key, model=name, length=length, batch=batch, tokens_per_second=batch * length
                       / row["median_seconds"], linear_tflops_achieved=achieved,
                       linear_fraction_of_matmul=achieved / report["matmul_tflops"][key["dtype"]])
            backend = _sparse_backend(models[name], length, backward, device)
            if backend and backend != "full (SDPA)" and getattr(models[name], "compile_may_fail", False):
                backend = "blocked"  # a traced model takes the blocked kernels whatever eager takes (dispatch.py)
            if backend:
                row["attention_backend"] = backend
            report["rows"].append(row)
            last_peak[name] = (length, row["peak_mib"] / batch)
            if row["median_seconds"] > settings.max_seconds:
                skipped[name] = f"one call took {row['median_seconds']:.0f} s > max_seconds {settings.max_seconds:.0f}"
        checkpoint(report)


def _batch_for(model, length, backward, batch_setting, settings, architecture) -> tuple[int | None, str | None]:
    """(batch, None), or (None, reason) when even the smallest batch does not fit. "max" doubles the batch until a
    call runs out of memory and keeps the last that ran."""
    if batch_setting != "max":
        return int(batch_setting), None
    device = torch.device(settings.device)
    fits = None
    batch = 1
    while batch <= settings.max_batch:
        if not _fits(model, length, backward, batch, architecture, device):
            break
        fits = batch
        batch *= 2
    if fits is None:
        return None, f"out of memory at batch 1, {length} tokens"
    return fits, None


def _fits(model, length, backward, batch, architecture, device) -> bool:
    try:
        forward_fn(model, length, backward, batch, architecture)()
        synchronize(device)
        return True
    except (torch.OutOfMemoryError, RuntimeError) as error:
        if not _out_of_memory(error):
            raise
        return False
    finally:
        # A backward that ran out of memory leaves partial gradients behind: drop them before the next try.
        model.zero_grad(set_to_none=True)
        _release(device)


def _sparse_backend(model, length, backward, device) -> str | None:
    """The longbird sparse kernel a call at this length used (flex or blocked), for the report."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "longbird" or config.attention == "full":
        return None
    if config.attention == "bigbird" and length <= config.full_attention_threshold:
        return "full (SDPA)"
    from ..dispatch import choose_backend

    repeated = config.attention == "bigbird" and config.random_blocks == "transformers"
    with torch.set_grad_enabled(backward):
        return choose_backend(config.attention_backend, device, length, config.block_size,
                              repeated_blocks=repeated, dtype=next(model.parameters()).dtype,
                              kernel=config.sparse_kernel).name


def _out_of_memory(error: Exception) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def _release(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _projected_over_memory(last, length, settings) -> str | None:
    if last is None:
        return None
    previous_length, peak_mib = last
    projected_gib = peak_mib * (length / previous_length) ** 2 / 1024  # quadratic bound: safe for every model
    if projected_gib > settings.max_memory_gib:
        return f"projected peak {projected_gib:.1f} GiB > max_memory_gib {settings.max_memory_gib:.0f}"
    return None


def _timed(run, device) -> float:
    synchronize(device)
    start = time.perf_counter()
    run()
    synchronize(device)
    return time.perf_counter() - start


def alternating_times(calls: dict[str, Callable[[], object]], repeats: int, device: torch.device | str = "cpu",
                      warm_up: bool = True) -> dict[str, list[float]]:
    """Seconds of each call (`_timed`: synchronised on CUDA) over `repeats` rounds that run every call in turn (A B A
    B ...), so a machine whose speed drifts (a shared VM) slows all of them alike; with `warm_up`, one untimed call
    each first. The caller takes the median of each list."""
    device = torch.device(device)
    if warm_up:
        for call in calls.values():
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            times[name].append(_timed(call, device))
    return times


def _measure(runs: dict[str, Callable], repeats: int, device: torch.device, interleave: bool = True) -> dict[str, dict]:
    """Median time and peak memory per run. Interleaved (A B A B ...) so machine noise hits all alike; with
    `interleave=False` one model after the other, its cached memory released in between (largest batches: each fills
    the GPU on its own)."""
    if not interleave:
        rows = {}
        for name, run in runs.items():
            rows.update(_measure({name: run}, repeats, device))
            _drop_gradients({name: run}, device)
        return rows
    rows: dict[str, dict] = {}
    times: dict[str, list[float]] = {}
    first_calls: dict[str, float] = {}
    for name, run in runs.items():
        try:
            first_calls[name] = _timed(run, device)  # warm-up (and compilation, where a backend compiles)
            times[name] = []
        except Exception as error:
            if _out_of_memory(error):
                rows[name] = {"skipped": "out of GPU memory"}
            elif getattr(getattr(run, "model", None), "compile_may_fail", False):
                rows[name] = {"skipped": f"compile failed: {type(error).__name__}: {_first_line(error)}"}
            else:
                raise
            _drop_gradients(runs, device)
    for _ in range(repeats):
        for name in list(times):
            if device.type != "cuda":
                gc.collect()
            try:
                times[name].append(_timed(runs[name], device))
            except (torch.OutOfMemoryError, RuntimeError) as error:  # a batch that fit once may not fit again
                if not _out_of_memory(error):
                    raise
                rows[name] = {"skipped": "out of GPU memory while timing"}
                del times[name]
                _drop_gradients(runs, device)
    for name, samples in times.items():
        if device.type == "cuda":
            peak, absolute, _ = peak_cuda_bytes(runs[name], device)
        else:
            (peak, _), absolute = peak_allocated_bytes(runs[name]), None
        rows[name] = {"median_seconds": statistics.median(samples), "min_seconds": min(samples),
                      "first_call_seconds": first_calls[name], "peak_mib": peak / 2**20}
        if absolute is not None:
            rows[name]["peak_total_mib"] = absolute / 2**20
    return rows


def _first_line(error: Exception) -> str:
    """The first non-empty line of an error (Inductor's carry pages of generated code after it)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def _drop_gradients(runs, device) -> None:
    """Partial gradients of a failed backward and cached blocks go before the next model runs."""
    for run in runs.values():
        model = getattr(run, "model", None)
        if model is not None:
            model.zero_grad(set_to_none=True)
    _release(device)
