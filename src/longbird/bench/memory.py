"""Peak tensor memory of a call, on CPU (profiler events) or CUDA (allocator statistics).

torch has no CPU allocator statistics and RSS deltas hide reuse of freed heap, so we read the
profiler's memory events: "Total Allocated" after every allocation/free, relative to the start.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.profiler import ProfilerActivity, profile


def peak_allocated_bytes(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Run `fn()` once under the profiler; return (peak bytes allocated above the starting point, result)."""
    profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _native_stderr_silenced():  # kineto writes "USDT ... profiler_start" to fd 2 (KINETO_LOG_LEVEL keeps it)
        profiler.__enter__()
    try:
        result = fn()
    finally:
        with _native_stderr_silenced():
            profiler.__exit__(None, None, None)
    with tempfile.TemporaryDirectory() as directory:
        trace = Path(directory) / "trace.json"
        profiler.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    totals = [event["args"]["Total Allocated"] for event in events if event.get("name") == "[memory]"]
    return max([0, *totals]), result


@contextlib.contextmanager
def _native_stderr_silenced():
    """Send file descriptor 2 to /dev/null for the duration (C++ libraries write there directly); `--verbose`
    (LONGBIRD_VERBOSE=1) keeps it."""
    if os.environ.get("LONGBIRD_VERBOSE") == "1":
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_cuda_bytes(fn: Callable[[], Any], device) -> tuple[int, int, Any]:
    """Run `fn()` once on a CUDA device; return (peak bytes above the starting point, absolute peak bytes, result).

    The absolute peak counts the weights (and their gradients) too: it is what must fit in the GPU.
    """
    import torch

    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    result = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    return peak - start, peak, result
