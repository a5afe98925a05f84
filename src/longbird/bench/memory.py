"""Peak tensor memory of a call on CPU.

torch has no CPU allocator statistics and RSS deltas hide reuse of freed heap, so we read the
profiler's memory events: "Total Allocated" after every allocation/free, relative to the start.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Callable

from torch.profiler import ProfilerActivity, profile


def peak_allocated_bytes(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Run `fn()` once under the profiler; return (peak bytes allocated above the starting point, result)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        result = fn()
    with tempfile.TemporaryDirectory() as directory:
        trace = Path(directory) / "trace.json"
        profiler.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    totals = [event["args"]["Total Allocated"] for event in events if event.get("name") == "[memory]"]
    return max([0, *totals]), result
