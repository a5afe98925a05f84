"""Where compiled flex_attention failed, remembered across processes, so a failure is paid once per machine.

Compiling flex_attention can fail for reasons no retry fixes: no C++ compiler, or an Inductor code-generation bug for
one shape (torch 2.13 on an AVX2 CPU with 32-wide heads: `'cur_kvSplitSize8' was not declared`). Each failed attempt
costs seconds of compiling before the blocked kernels take over, and a CLI call is a new process, so remembering the
failure only in memory made every `longbird answer` pay it again. A failure is recorded under a *family*: the things
that decide whether the same compilation fails again (the kernel, device type and its capability, torch version, head
dimension and dtype). A later process skips flex for that family at once; another head size, dtype, kernel family,
torch version or GPU is tried afresh.

The record is `flex_failures.json` in longbird's cache directory (`longbird.sources.cache_root()`: $LONGBIRD_CACHE,
else $XDG_CACHE_HOME/longbird, else ~/.cache/longbird); delete it to try flex again (after installing a compiler, say).
It is written through a temporary file and a rename, merged with what other processes wrote; an unreadable record is
ignored and an unwritable cache keeps the memory in this process only.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import torch

RECORD_NAME = "flex_failures.json"
logger = logging.getLogger("longbird.attention")
_in_process: dict[str, dict] = {}  # family -> failure, including those read from the record


def family(kernel: str, query: torch.Tensor) -> str:
    """The key of one compilation: `kernel` ("bigbird" or "usw"), the device type and capability, torch version, head
    dimension and dtype of `query` (B, H, l, d)."""
    device = query.device
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        capability = f"sm{major}{minor}"
    elif device.type == "cpu":
        capability = torch.backends.cpu.get_cpu_capability()  # follows ATEN_CPU_CAPABILITY
    else:
        capability = "-"
    dtype = str(query.dtype).removeprefix("torch.")
    return f"{kernel} {device.type} {capability} torch-{torch.__version__} head_dim={query.shape[-1]} {dtype}"


def record_path() -> Path:
    from .sources import cache_root

    return cache_root() / RECORD_NAME


def known_failure(key: str) -> dict | None:
    """The recorded failure of this family ({"error", "detail", "when", "record"}), or None."""
    if key not in _in_process:
        failure = _read_record().get(key)
        if failure is None:
            return None
        _in_process[key] = {**failure, "record": str(record_path())}
        logger.info("flex_attention is skipped for %s: it failed here before (%s; recorded in %s, delete it to retry)",
                    key, failure.get("error", "?"), record_path())
    return _in_process[key]


def remember_failure(key: str, error: BaseException) -> dict:
    """Record that compiling or running flex failed for this family, in this process and in the cache record."""
    failure = {**describe(error), "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    _in_process[key] = {**failure, "record": str(record_path())}
    try:
        from .files import write_file_atomically

        record = _read_record()
        record[key] = failure
        write_file_atomically(record_path(), json.dumps(record, indent=2, sort_keys=True) + "\n")
    except OSError as problem:  # a read-only cache: remembered in this process only
        logger.debug("could not record the flex failure in %s: %s", record_path(), problem)
    return _in_process[key]


def describe(error: BaseException) -> dict:
    """{"error": one line, "detail": the compiler's error lines and the message's end}. A C++ compile failure's message
    is mostly the compiler's warnings; the lines that say `error:` are what a user (or a PyTorch bug report) needs."""
    text = str(error)
    lines = text.splitlines()
    errors = [line.strip() for line in lines if re.search(r"\berror\b", line, re.IGNORECASE)
              and not re.search(r"\bwarning\b", line, re.IGNORECASE)]
    compiler = [line for line in errors if re.search(r"(^|: )error: ", line)]
    summary = f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    if compiler:
        summary += " " + re.sub(r"^.*?error: ", "error: ", compiler[0])[:300]
    detail = "\n".join(errors[:40])
    return {"error": summary, "detail": (detail + "\n...\n" if detail else "") + text[-2000:]}


def forget_in_process() -> None:
    """Drop this process's memory (tests; the record on disk stays)."""
    _in_process.clear()


def _read_record() -> dict:
    try:
        record = json.loads(record_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no record yet, or a hand-edited one that is not JSON
        return {}
    return record if isinstance(record, dict) else {}
