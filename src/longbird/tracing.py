"""Tracing (torch.export, torch.compile, torch.jit / ONNX): what the model must do differently while traced.

Two rules. Caches (block patterns, block indices) may only ever hold real tensors: a tensor made under FakeTensorMode
and kept in an lru_cache would make every later model in the process return FakeTensors. And a traced graph cannot
branch on tensor data, so the per-row attention plan (which reads each row's real length from the mask) falls back to
one decision for the whole batch from its length.
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


def real_tensors():
    """A context in which tensors are real even inside a fake-tensor trace (for values that are cached)."""
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
    except ImportError:  # pragma: no cover - older torch
        return contextlib.nullcontext()
    return unset_fake_temporarily()
