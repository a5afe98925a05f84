"""Tracing (torch.export, torch.compile, torch.jit / ONNX): what the model must do differently while traced.

Two rules. Values that depend only on Python ints (block patterns, block indices) are computed outside the trace
(`outside_the_trace`): real tensors that are not recorded as graph ops. A tensor made under FakeTensorMode and kept in
an lru_cache would make every later model in the process return FakeTensors, and a random plan drawn while being
recorded would be redrawn by the exported graph on every call. And a traced graph cannot branch on tensor data, so
BigBird's per-row attention plan (which reads each row's real length from the mask) is made in the graph instead:
on the device under torch.export and torch.compile (`device_rows`; torch.compile on CPU uses an opaque op by
default), while a torch.jit trace (the legacy ONNX exporter) takes one decision for the whole batch from its length.
An exported dynamic sequence length is accepted only where one graph can serve every length (`check_dynamic_length`).
"""

from __future__ import annotations

import contextlib

import torch


def is_tracing() -> bool:
    """True while torch.export, torch.compile (dynamo) or torch.jit (the legacy ONNX exporter) traces the model."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return True
    if exporting():
        return True
    return fake_mode_active()


def exporting() -> bool:
    """True under torch.export only. Reads the flag torch.export sets instead of calling torch.compiler.is_exporting():
    Dynamo before torch 2.13 answered that call with True inside every torch.compile trace (fixed in 2.13, which reads
    the same flag), so on torch 2.11 a compiled kobigbird took the export path and failed (H100, 2026-11-27:
    "Unsupported: torch.* op returned non-Tensor"). A module global is read by Dynamo as a guarded constant."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    if flag is not None:
        return bool(flag)
    return getattr(torch.compiler, "is_exporting", lambda: False)()


def graph_cannot_branch_on_data() -> bool:
    """True under torch.export (the dynamo ONNX exporter uses it) and torch.jit tracing, where reading tensor values
    (the rows' real lengths) fails or freezes them into the graph. torch.compile is not included: there the per-row
    plan is made in the graph (dispatch.PlanInGraph: on the device, or inside one opaque op per layer)."""
    return torch.jit.is_tracing() or exporting()


def fake_mode_active() -> bool:
    """True under FakeTensorMode (non-strict torch.export, the dynamo-based ONNX exporter)."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode() is not None


@contextlib.contextmanager
def outside_the_trace():
    """A context in which tensor ops are neither faked nor recorded, even inside a trace: for values that depend only
    on Python ints (the random-block plan, its block indices) and are cached.

    Keeping fake tensors out is not enough. Non-strict torch.export (and the dynamo ONNX exporter built on it) records
    every op through a proxy dispatch mode, and torch.jit records through its tracing state: a plan drawn on a cache
    miss while tracing put `aten::rand` (with its torch.Generator) into the graph, so the exported program drew a new
    plan on every call and the ONNX exporter failed on the generator. With every mode off the plan is computed once,
    eagerly, and the trace sees only the finished tensors, which it keeps as constants.
    """
    try:
        from torch.utils._python_dispatch import _disable_current_modes
    except ImportError:  # pragma: no cover - older torch: at least keep fake tensors out of the caches
        _disable_current_modes = real_tensors
    jit_state = torch._C._get_tracing_state()
    # Only touch the jit state when a jit trace is on: inside a custom op's kernel (the compiled per-row plan, drawing
    # on a cache miss) setting it at all, even to None, is refused by torch's NoTracerDispatchMode.
    if jit_state is not None:
        torch._C._set_tracing_state(None)
    try:
        with _disable_current_modes():
            yield
    finally:
        if jit_state is not None:
            torch._C._set_tracing_state(jit_state)


def real_tensors():
    """A context in which tensors are real even inside a fake-tensor trace (ops are still recorded by a tracer)."""
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
    except ImportError:  # pragma: no cover - older torch
        return contextlib.nullcontext()
    return unset_fake_temporarily()


def is_dynamic(size) -> bool:
    """True for a symbolic size: a dimension exported with `dynamic_shapes` (Dim / Dim.AUTO / dynamic_axes)."""
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    return isinstance(size, torch.SymInt) and not is_concrete_int(size)


def check_dynamic_length(length, block_size: int, attention: str, full_max_length: int) -> None:
    """What a graph with a dynamic sequence length can compute, as a clear error at export instead of a graph that
    silently holds one length (or a page of guards).

    full: any length. littlebird: multiples of block_size (`block_size * Dim("blocks", ...)`; torch.export checks
    that itself, as a guard on the length). bigbird: a range within full attention (lengths <= full_max_length), or
    one wholly above it in multiples of block_size: there each row's plan is made in the graph on the device
    (`device_rows`), with the random blocks of every block count in one table per layer, so one graph serves every
    sparse length. A range across the threshold would need both paths in one graph (a branch on the length).
    """
    if not (graph_cannot_branch_on_data() and is_dynamic(length)):
        return  # torch.compile is left alone: dynamo guards on the length and recompiles per block count itself
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if attention != "bigbird" or statically_known_true(length <= full_max_length):
        return
    if not statically_known_true(length > full_max_length):
        raise ValueError(
            f"A dynamic sequence length of a kobigbird model must lie wholly at or below its full-attention threshold "
            f"({full_max_length} tokens) or wholly above it (there in multiples of block_size {block_size}): give the "
            f"range min={full_max_length + block_size} (with seq = {block_size} * Dim('blocks', min="
            f"{full_max_length // block_size + 1}, ...)) and pad shorter inputs up to it with attention_mask 0 "
            f"(each row is still read as alone), or max={full_max_length}")
