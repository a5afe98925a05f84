"""The C allocator's settings for tensor-sized blocks: freed activations are kept and reused, not unmapped.

PyTorch on CPU allocates every tensor through the C library's `malloc`. glibc serves a block larger than its mmap
threshold (128 KiB, rising with use to at most 32 MiB) with a fresh `mmap` and returns it with `munmap` when freed,
so the next forward pays again for mapping it and for the kernel zeroing each page on first touch. A long forward
frees and re-allocates such blocks in every layer (at 4,096 tokens an e5-small feed-forward activation is 24 MiB in
fp32, 48 MiB at base size). Measured on a 2-core AMD EPYC, fp32, 4,096 tokens, random weights
(docs/benchmarks.md, "The C allocator"; benchmarks/allocator.py): LittleBird e5-small 1.40 → 1.23 s per forward
(152,000 page faults → 72), base 4.77 → 4.30 s (437,000 → 1); the model's own matrix products run as fast either way.

`keep_freed_memory()` asks glibc (`mallopt`) to serve every block from its heaps (`M_MMAP_MAX` 0) and not to give
their free memory back to the system below 2 GiB (`M_TRIM_THRESHOLD`). A thread other than the main one allocates
from an arena of its own, made of heaps of at most 64 MiB: there a block of more than about 63 MiB is still mapped
(glibc's fallback), so the server's batching thread keeps its blocks up to that size (e5-small at 8K tokens, base
at 4K). One arena for all threads (`M_ARENA_MAX` 1) would keep every block, but SDPA's flash-attention backward
allocates in each of its threads, and with one arena a bf16 kobigbird training step at 4K took 5.3 s instead of 2.7.
The price: the process keeps the memory of its largest forward after it, as PyTorch's GPU caching allocator does,
plus free chunks it cannot reuse for an aligned block of the same size (glibc 2.36, this machine's, serves torch's
64-byte aligned allocations from a free chunk 96 bytes larger than the block: `_int_memalign`). The `longbird`
command line (every command, the server included) calls it at start; `LONGBIRD_MALLOC=system` leaves the C
library's defaults. A Python program calls it itself, before it loads a model. On a C library other than glibc
(macOS, musl) it changes nothing.
"""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache

# glibc's <malloc.h> parameter numbers (stable ABI).
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
TRIM_THRESHOLD_BYTES = 2**31 - 1  # mallopt takes an int: 2 GiB, the largest it accepts
CHOICES = ("keep", "system")
_applied: str | None = None  # what keep_freed_memory last did in this process


class _MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (2.33+): every field a size_t, in this order."""

    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


@lru_cache(maxsize=1)
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it: musl and macOS have mallopt-less or other mallocs
    except (OSError, AttributeError):
        return None
    if hasattr(libc, "mallinfo2"):  # glibc 2.33+
        libc.mallinfo2.restype = _MallInfo2
    return libc


def requested(environ=os.environ) -> str:
    """`LONGBIRD_MALLOC` (keep, the default, or system); an unknown value is an error naming the choices."""
    value = environ.get("LONGBIRD_MALLOC", "keep").strip().lower() or "keep"
    if value not in CHOICES:
        raise ValueError(f"LONGBIRD_MALLOC={environ['LONGBIRD_MALLOC']!r} is not one of {', '.join(CHOICES)}: "
                         "'keep' reuses freed tensor memory (the default), 'system' leaves the C library's settings")
    return value


def keep_freed_memory(environ=os.environ) -> str:
    """Apply the settings above unless `LONGBIRD_MALLOC=system`; returns what was done, for reports: "kept",
    "system (LONGBIRD_MALLOC=system)", "system (not glibc)", or, when asked for "system" after "kept" in the same
    process, "kept (earlier in this process; ...)"."""
    global _applied
    choice = requested(environ)
    if choice == "system" and _applied == "kept":  # mallopt's settings cannot be taken back within a process
        return "kept (earlier in this process; LONGBIRD_MALLOC=system applies to a new one)"
    _applied = _apply(choice)
    return _applied


def _apply(choice: str) -> str:
    if choice == "system":
        return "system (LONGBIRD_MALLOC=system)"
    libc = _glibc()
    if libc is None:
        return "system (not glibc)"
    for parameter, value in ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)):
        if libc.mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) != 1:  # mallopt returns 1 on success
            return f"system (mallopt({parameter}, {value}) refused)"
    return "kept"


def heap_bytes() -> dict[str, int] | None:
    """glibc's own account (mallinfo2, summed over arenas): "heap" bytes its heaps hold from the system, "mapped"
    bytes in blocks it mapped alone, "free" bytes free in its heaps; None without glibc 2.33+. For
    benchmarks/allocator.py and the tests: whether a block came from a heap or a mapping of its own."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    info = libc.mallinfo2()
    return {"heap": info.arena, "mapped": info.hblkhd, "free": info.fordblks}


def applied() -> str:
    """What this process's allocator does, for `longbird env` and reports (the last keep_freed_memory's result)."""
    return _applied or "system (keep_freed_memory not called)"
