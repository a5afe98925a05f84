"""longbird.malloc: with the settings applied, a tensor-sized block is served from glibc's heap, also in another
thread (up to its heaps' 64 MiB), and its memory is reused by the next ones; with LONGBIRD_MALLOC=system the same
block is mapped afresh (so the first test can fail). Each case runs in a fresh interpreter: the settings are
process-wide and cannot be undone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from longbird.cli import app
from longbird.malloc import _glibc, heap_bytes, requested

glibc_only = pytest.mark.skipif(heap_bytes() is None, reason="the settings are glibc's (mallopt, mallinfo2)")

# longbird.malloc.heap_bytes reads glibc's mallinfo2: "mapped" = bytes in blocks mapped alone, "heap" = the heaps.
PROBE = r"""
import json, threading, torch
from longbird.malloc import heap_bytes, keep_freed_memory

state = keep_freed_memory()
MIB = 1 << 20
found = {"state": state}

def block(name, mib):
    before = heap_bytes()
    block = torch.empty(mib * MIB, dtype=torch.uint8).fill_(1)  # 33+ MiB: above any mmap threshold glibc allows
    during = heap_bytes()
    del block
    after = heap_bytes()
    found[name] = {"mapped": (during["mapped"] - before["mapped"]) // MIB,
                   "unmapped_on_free": (during["mapped"] - after["mapped"]) // MIB}

block("first", 64)
# the server's batcher is such a thread; its arena's heaps hold at most 64 MiB, so a smaller block
thread = threading.Thread(target=block, args=("thread", 48))
thread.start()
thread.join()
heap = []  # MiB of heap after each of 30 blocks of the same size, allocated and freed in turn
for _ in range(30):
    block = torch.empty(64 * MIB, dtype=torch.uint8).fill_(1)
    del block
    heap.append(heap_bytes()["heap"] // MIB)
found["heap"] = heap
print(json.dumps(found))
"""


def _probe(setting: str | None) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "LONGBIRD_MALLOC"}
    if setting is not None:
        env["LONGBIRD_MALLOC"] = setting
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc_only
def test_kept_blocks_come_from_the_heap_and_are_reused():
    found = _probe(None)
    assert found["state"] == "kept"
    assert found["first"] == {"mapped": 0, "unmapped_on_free": 0}, found
    assert found["thread"] == {"mapped": 0, "unmapped_on_free": 0}, found
    # The freed blocks are reused: the heap stops growing. Not after the first block: glibc 2.36 serves torch's
    # 64-byte aligned requests (posix_memalign) only from a free chunk 64 + 32 bytes larger than the block, so a few
    # blocks' worth of free chunks build up first (eight there, then none).
    heap = found["heap"]
    assert heap[-10:] == [heap[-1]] * 10 and heap[-1] <= 16 * 64 + heap[0], heap


@glibc_only
def test_system_setting_leaves_glibc_mapping_each_block():
    found = _probe("system")
    assert found["state"] == "system (LONGBIRD_MALLOC=system)"
    for name in ("first", "thread"):
        assert found[name]["mapped"] >= 48 and found[name]["unmapped_on_free"] >= 48, found


def test_setting_is_read_and_checked():
    assert requested({}) == "keep" and requested({"LONGBIRD_MALLOC": " System "}) == "system"
    assert requested({"LONGBIRD_MALLOC": ""}) == "keep"
    with pytest.raises(ValueError, match=r"LONGBIRD_MALLOC='tcmalloc' is not one of keep, system"):
        requested({"LONGBIRD_MALLOC": "tcmalloc"})


@pytest.mark.parametrize("setting, state", [("system", "system (LONGBIRD_MALLOC=system)"),
                                            (None, "kept" if _glibc() else "system (not glibc)")])
def test_env_reports_the_setting(setting, state):
    env = {key: value for key, value in os.environ.items() if key != "LONGBIRD_MALLOC"}
    env.update({"LONGBIRD_MALLOC": setting} if setting else {}, COLUMNS="200")
    done = subprocess.run([sys.executable, "-m", "longbird.cli", "env"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if "freed tensor memory" in line)
    assert f"{state} (LONGBIRD_MALLOC: keep or system)" in row, row


def test_a_kept_setting_is_not_reported_undone():
    done = subprocess.run([sys.executable, "-c", "from longbird.malloc import keep_freed_memory as k, applied; "
                           "k({}); print(k({'LONGBIRD_MALLOC': 'system'})); print(applied())"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    if _glibc() is not None:
        assert done.stdout.splitlines() == ["kept (earlier in this process; LONGBIRD_MALLOC=system applies to a new "
                                            "one)", "kept"], done.stdout


def test_command_line_names_a_bad_setting_in_one_line():
    result = CliRunner().invoke(app, ["env"], env={"LONGBIRD_MALLOC": "tcmalloc"})
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("error: LONGBIRD_MALLOC='tcmalloc' is not one of keep, system"), lines[0]
