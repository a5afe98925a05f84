"""LittleBird's CPU inference with and without the split USW kernel, whole-model forward, batch 1, calls alternating
in one process (so both see the same machine state; separate processes differ by up to ±15 % on this machine).

"grouped" is the kernel before the split (`usw_inference.grouped_usw_inference`, key groups gathered per query
block), forced by turning `littlebird.split_kernel_applies` off; "split" is what CPU inference runs now
(`usw_inference.usw_split_attention`). Blocked backend (the split kernel is the blocked kernel's inference path).
Usage: python benchmarks/usw_split_model.py [--lengths 512 4096] [--dtypes fp32 bf16] [--sizes small base]
       [--repeats 9] [--name usw_split_model]
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

import longbird.attention.littlebird as littlebird
from longbird.bench.models import SIZES, build_model, forward_fn, matmul_throughput
from longbird.bench.report import write_table
from longbird.bench.sweep import cpu_model

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SPLIT = littlebird.split_kernel_applies


def timed(run, split: bool) -> float:
    littlebird.split_kernel_applies = SPLIT if split else (lambda *args: False)
    try:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    finally:
        littlebird.split_kernel_applies = SPLIT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["small", "base"])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--name", default="usw_split_model")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        for dtype in args.dtypes:
            model = build_model("littlebird", max(args.lengths), SIZES[size]).to(DTYPES[dtype])
            model.config.attention_backend = "blocked"
            for length in args.lengths:
                run = forward_fn(model, length, backward=False, base=SIZES[size])
                times = {"grouped": [], "split": []}
                for name in times:  # warm-up, one each
                    timed(run, name == "split")
                for _ in range(args.repeats):
                    for name in times:
                        times[name].append(timed(run, name == "split"))
                row = {"size": size, "dtype": dtype, "length": length,
                       **{f"{name}_median_seconds": statistics.median(t) for name, t in times.items()},
                       **{f"{name}_seconds": t for name, t in times.items()}}
                row["speedup"] = row["grouped_median_seconds"] / row["split_median_seconds"]
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if not k.endswith("_seconds") or "median" in k}),
                      flush=True)
    command = "python benchmarks/usw_split_model.py " + " ".join(sys.argv[1:])
    rates = {name: matmul_throughput(dtype) / 1e12 for name, dtype in DTYPES.items()}
    report = {"command": command, "cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "matmul_tflops": rates, "rows": rows}
    environment = (f"CPU: {report['cpu']}, {report['threads']} threads, torch {torch.__version__}; 4096x768x3072 "
                   f"matmul TFLOP/s fp32 {rates['fp32']:.3f}, bf16 {rates['bf16']:.3f}. LittleBird, random weights, "
                   "batch 1, inference, blocked backend; medians of calls alternating between the kernels in one "
                   "process.")
    table = [f"| {row['size']} | {row['dtype']} | {row['length']} | {row['grouped_median_seconds']:.3f} | "
             f"{row['split_median_seconds']:.3f} | {row['speedup']:.2f}x |" for row in rows]
    header = ["| size | dtype | tokens | grouped (before) s | split (now) s | speed-up |",
              "|---|---|---:|---:|---:|---:|"]
    lines = [f"Command: `{command}`  ", environment, "", *header, *table]
    write_table(report, lines, args.out, args.name)


if __name__ == "__main__":
    main()
