"""The fused CPU kernels' block packing (`cpu_kernel.pack_blocks`) alone, against copying the same keys and values.

Once per layer and call, BigBird's blocked attention and LittleBird's USW attention pack every key block (transposed)
and value block into the layout the kernel reads (`kernels/block_attention_{fp32,bf16}.cpp`). This times one layer's
packing at the benchmark models' shape (batch 1, 12 heads, blocks of 64, keys and values as separate (B, l, H·d)
projection outputs viewed as (B, H, l, d)), alternating with `.contiguous()` copies of the same keys and values, the
bytes the packing must move at the least: ratio = pack / copy. CPU only; the packed layout itself is tested in
`tests/test_cpu_kernel.py`.

Usage: python benchmarks/pack_blocks.py [--head-dims 32 64] [--length 4096] [--dtypes fp32 bf16] [--repeats 21]
[--name pack_blocks]. Writes benchmarks/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floor import code_version  # the benchmarks' shared commit note

from longbird.attention import cpu_kernel
from longbird.bench.report import write_table
from longbird.bench.sweep import DTYPES, alternating_times, cpu_model
from longbird.malloc import keep_freed_memory

ROOT = Path(__file__).resolve().parents[1]


def calls(dtype: torch.dtype, head_dim: int, length: int, heads: int = 12, block: int = 64) -> dict:
    generator = torch.Generator().manual_seed(0)
    key = torch.randn(1, length, heads * head_dim, generator=generator).to(dtype)
    value = torch.randn(1, length, heads * head_dim, generator=generator).to(dtype)
    key = key.view(1, length, heads, head_dim).transpose(1, 2)
    value = value.view(1, length, heads, head_dim).transpose(1, 2)
    starts = (torch.arange(length // block) * block)[None]
    key_offsets = cpu_kernel.token_offsets(key.stride(), 1, heads, starts).reshape(-1)
    value_offsets = cpu_kernel.token_offsets(value.stride(), 1, heads, starts).reshape(-1)
    return {"pack": lambda: cpu_kernel.pack_blocks(key, key_offsets, value, value_offsets, block),
            "copy": lambda: (key.contiguous(), value.contiguous())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", nargs="+", type=int, default=[32, 64])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--name", default="pack_blocks")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    # as the command line does: without it glibc maps and faults in every fresh multi-MB copy or pack output again,
    # and the copy read 0.6 or 4-5 ms from run to run (the packing likewise)
    malloc = keep_freed_memory()
    report = {"command": "python benchmarks/pack_blocks.py " + " ".join(sys.argv[1:]), "code": code_version(),
              "malloc": malloc,
              "cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "instruction_sets": {name: cpu_kernel.instruction_set(DTYPES[name]) for name in args.dtypes}, "rows": []}
    for name in args.dtypes:
        if not cpu_kernel.available(DTYPES[name]):
            sys.exit(f"pack_blocks: no fused {name} kernel on this machine (see longbird.attention.cpu_kernel)")
        for head_dim in args.head_dims:
            times = alternating_times(calls(DTYPES[name], head_dim, args.length), args.repeats)
            row = {"dtype": name, "head_dim": head_dim, "length": args.length,
                   **{f"{call}_ms": statistics.median(samples) * 1e3 for call, samples in times.items()}}
            row["ratio"] = row["pack_ms"] / row["copy_ms"]
            report["rows"].append(row)
            print(f"{name} d={head_dim}: pack {row['pack_ms']:.2f} ms, copy {row['copy_ms']:.2f} ms, "
                  f"ratio {row['ratio']:.2f}", flush=True)
    lines = [f"Command: `{report['command']}`  ", f"Code: {report['code']}  ",
             f"CPU: {report['cpu']}, {report['threads']} threads, torch {report['torch']}; kernels: "
             + ", ".join(f"{name} {value}" for name, value in report["instruction_sets"].items())
             + f"; freed tensor memory (longbird.malloc): {malloc}. One layer's keys and values, batch 1, 12 heads, "
             f"blocks of 64, {args.length} tokens; medians of {args.repeats} alternating calls.", "",
             "| dtype | head size | pack | copy of the same keys and values | pack / copy |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['dtype']} | {r['head_dim']} | {r['pack_ms']:.2f} ms | {r['copy_ms']:.2f} ms | "
              f"**{r['ratio']:.2f}** |" for r in report["rows"]]
    write_table(report, lines, args.out, args.name)


if __name__ == "__main__":
    main()
