"""CPU inference: compiled flex_attention against the blocked kernels, whole model forward, batch 1.

Sets the CPU rules in dispatch.py (CPU_FLEX_MIN_LENGTH for fp32; half precision takes the blocked kernels). The first
call of flex includes its compilation (reported separately); timed calls alternate between the two backends.
Usage: python benchmarks/flex_cpu.py [--lengths 1024 2048 4096 8192] [--repeats 3] [--dtype fp32] [--size base]
       [--models littlebird kobigbird] [--name flex_cpu]
Writes benchmarks/results/NAME.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from longbird.bench.models import SIZES, build_model, forward_fn
from longbird.bench.report import write_table
from longbird.bench.sweep import cpu_model

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    parser.add_argument("--size", choices=list(SIZES), default="base")
    parser.add_argument("--models", nargs="+", choices=["littlebird", "kobigbird"], default=["littlebird", "kobigbird"])
    parser.add_argument("--name", default="flex_cpu")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    rows = []
    for name in args.models:
        model = build_model(name, max(args.lengths), SIZES[args.size]).to(DTYPES[args.dtype])
        for length in args.lengths:
            run = forward_fn(model, length, backward=False, base=SIZES[args.size])
            times, first = {"blocked": [], "flex": []}, {}
            for backend in times:
                model.config.attention_backend = backend
                start = time.perf_counter()
                run()
                first[backend] = time.perf_counter() - start
            for _ in range(args.repeats):
                for backend in times:
                    model.config.attention_backend = backend
                    start = time.perf_counter()
                    run()
                    times[backend].append(time.perf_counter() - start)
            row = {"model": name, "length": length, **{f"{b}_median_seconds": statistics.median(t) for b, t in times.items()},
                   **{f"{b}_first_call_seconds": s for b, s in first.items()}}
            row["flex_speedup"] = row["blocked_median_seconds"] / row["flex_median_seconds"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    command = "python benchmarks/flex_cpu.py " + " ".join(sys.argv[1:])
    report = {"command": command, "cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "dtype": args.dtype, "size": args.size, "rows": rows}
    lines = [f"Command: `{command}`  ", f"CPU: {report['cpu']}, {report['threads']} threads, torch {torch.__version__}, "
             f"{args.dtype}, {args.size} size, batch 1, whole-model forward (inference mode)", "",
             "| model | length | blocked median s | flex median s | flex speed-up | flex first call s (compiles) |",
             "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['model']} | {row['length']} | {row['blocked_median_seconds']:.3f} | "
                     f"{row['flex_median_seconds']:.3f} | {row['flex_speedup']:.2f}x | {row['flex_first_call_seconds']:.1f} |")
    write_table(report, lines, args.out, args.name)


if __name__ == "__main__":
    main()
