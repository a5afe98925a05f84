"""Peak resident memory of a code block on CPU, sampled from /proc (torch has no CPU allocator statistics)."""

from __future__ import annotations

import os
import resource
import threading
import time

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as stream:
            return int(stream.read().split()[1]) * _PAGE
    except OSError:  # not Linux: process-lifetime peak is the best available
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class PeakMemory:
    """`with PeakMemory() as peak: ...; peak.bytes` = max RSS during the block minus RSS at entry."""

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.bytes = 0

    def _sample(self):
        while not self._stop.is_set():
            self._peak = max(self._peak, resident_bytes())
            time.sleep(self.interval)

    def __enter__(self):
        self._start = resident_bytes()
        self._peak = self._start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, resident_bytes())
        self.bytes = self._peak - self._start
        return False
