"""What `longbird.malloc` buys and costs: forward time and resident memory over many forwards of mixed lengths.

For each setting (`LONGBIRD_MALLOC=system`, then `keep`, alternating --rounds times) a fresh interpreter builds the
model (random init, batch 1, `longbird.bench.models`), applies the setting as the command line does, and runs
--forwards forwards whose lengths are drawn from --lengths (seeded: the same sequence for both settings; the first
at the longest length, left out of the medians). Reported per setting: the median seconds and minor page faults
(getrusage) per length, and the resident memory (/proc/self/statm) and glibc heap (mallinfo2) after the first
forward and the largest after any: whether the kept memory levels off. Linux/glibc only.
Usage: python benchmarks/allocator.py [--preset littlebird] [--size small] [--dtype fp32] [--forwards 40]
       [--lengths 1024 2048 3072 4096] [--rounds 1] [--name allocator]
Writes benchmarks/results/NAME.{md,json}."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, random, resource, sys, time, torch
from longbird.malloc import heap_bytes, keep_freed_memory
state = keep_freed_memory()
from longbird.bench.models import SIZES, build_model, forward_fn

preset, size, dtype, forwards, lengths = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
lengths = [int(length) for length in lengths]
model = build_model(preset, max(lengths), SIZES[size]).to({"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])
runs = {length: forward_fn(model, length, backward=False, base=SIZES[size]) for length in lengths}
draw = random.Random(0)
for index in range(forwards):
    length = draw.choice(lengths) if index else max(lengths)
    faults, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    runs[length]()
    seconds = time.perf_counter() - start
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    info = heap_bytes()
    resident = int(open("/proc/self/statm").read().split()[1]) * 4096
    print(json.dumps({"state": state, "length": length, "seconds": seconds, "page_faults": faults,
                      "resident_mib": resident / 2**20,
                      "heap_mib": info["heap"] / 2**20, "mapped_mib": info["mapped"] / 2**20}), flush=True)
"""


def run_setting(setting: str, args) -> dict:
    env = {**os.environ, "LONGBIRD_MALLOC": setting}
    done = subprocess.run([sys.executable, "-c", CHILD, args.preset, args.size, args.dtype, str(args.forwards),
                           *map(str, args.lengths)], env=env, capture_output=True, text=True, check=True)
    calls = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    first = calls[0]
    return {"setting": setting, "state": first["state"],
            "median_seconds": {str(length): statistics.median(c["seconds"] for c in calls[1:] if c["length"] == length)
                               for length in args.lengths if any(c["length"] == length for c in calls[1:])},
            "median_page_faults": {str(length): statistics.median(c["page_faults"] for c in calls[1:]
                                                                  if c["length"] == length)
                                   for length in args.lengths if any(c["length"] == length for c in calls[1:])},
            "first": {key: first[key] for key in ("resident_mib", "heap_mib", "mapped_mib")},
            "largest": {key: max(c[key] for c in calls) for key in ("resident_mib", "heap_mib", "mapped_mib")},
            "last": {key: calls[-1][key] for key in ("resident_mib", "heap_mib", "mapped_mib")},
            "calls": calls}


def markdown(report: dict) -> str:
    lengths = report["lengths"]
    lines = [f"Command: `{report['command']}`  ", f"Machine: {report['machine']}. {report['preset']} {report['size']} "
             f"{report['dtype']}, batch 1, random weights; {report['forwards']} forwards per process, the first at "
             f"{max(lengths)} tokens (left out of the medians), then lengths drawn from {lengths} (seed 0).", "",
             "| setting | " + " | ".join(f"s at {length}" for length in lengths)
             + f" | page faults at {max(lengths)} | resident MiB after the first | largest resident MiB | "
             "heap MiB (largest) | mapped MiB (largest) |",
             "|---|" + "---:|" * (len(lengths) + 5)]
    for run in report["runs"]:
        times = " | ".join(f"{run['median_seconds'].get(str(length), float('nan')):.3f}" for length in lengths)
        faults = run["median_page_faults"].get(str(max(lengths)), float("nan"))
        lines.append(f"| {run['state']} | {times} | {faults:.0f} | {run['first']['resident_mib']:.0f} | "
                     f"{run['largest']['resident_mib']:.0f} | {run['largest']['heap_mib']:.0f} | "
                     f"{run['largest']['mapped_mib']:.0f} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="littlebird")
    parser.add_argument("--size", default="small", choices=["small", "base"])
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--forwards", type=int, default=40)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 3072, 4096])
    parser.add_argument("--rounds", type=int, default=1, help="system then keep, this many times")
    parser.add_argument("--name", default="allocator")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    import torch

    from longbird.bench.sweep import cpu_model
    from longbird.files import write_file_atomically

    report = {"command": "python benchmarks/allocator.py " + " ".join(sys.argv[1:]),
              "machine": f"{cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
              **{key: getattr(args, key) for key in ("preset", "size", "dtype", "forwards", "lengths")}, "runs": []}
    for _ in range(args.rounds):
        for setting in ("system", "keep"):
            report["runs"].append(run_setting(setting, args))
            print(markdown(report).splitlines()[-1], flush=True)
    write_file_atomically(args.out / f"{args.name}.json", json.dumps(report, indent=1) + "\n")
    write_file_atomically(args.out / f"{args.name}.md", markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
