"""Tracing (torch.export, torch.compile, torch.jit / ONNX): what the model must do differently while traced.

Two rules. Values that depend only on Python ints (block patterns, block indices) are computed outside the trace
(`outside_the_trace`): real tensors that are not recorded as graph ops. A tensor made under FakeTensorMode and kept in
an lru_cache would make every later model in the process return FakeTensors, and a random plan drawn while being
recorded would be redrawn by the exported graph on every call. And a traced graph cannot branch on tensor data, so the
per-row attention plan (which reads each row's real length from the mask) falls back to one decision for the whole
batch from its length.
"""

from __future__ import annotations

import contextlib

import torch


def is_tracing() -> bool:
    """True while torch.export, torch.compile (dynamo) or torch.jit (the legacy ONNX exporter) traces the model."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return True
    if getattr(torch.compiler, "is_exporting", lambda: False)():
        return True
    return fake_mode_active()


def graph_cannot_branch_on_data() -> bool:
    """True under torch.export (the dynamo ONNX exporter uses it) and torch.jit tracing, where reading tensor values
    (the rows' real lengths) fails or freezes them into the graph. torch.compile is not included: dynamo breaks the
    graph there and runs that bit eagerly, so compiled models keep the per-row plan."""
    return torch.jit.is_tracing() or getattr(torch.compiler, "is_exporting", lambda: False)()


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
    torch._C._set_tracing_state(None)
    try:
        with _disable_current_modes():
            yield
    finally:
        torch._C._set_tracing_state(jit_state)


def real_tensors():
    """A context in which tensors are real even inside a fake-tensor trace (ops are still recorded by a tracer)."""
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
    except ImportError:  # pragma: no cover - older torch
        return contextlib.nullcontext()
    return unset_fake_temporarily()

