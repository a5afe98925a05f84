"""Two floor measurements (`benchmarks/floor.py`) side by side: forward / own-GEMM-floor ratios before and after, with
issue 27's targets where it names one.

Usage: python benchmarks/floor_compare.py BEFORE.json AFTER.json --name NAME  (writes benchmarks/results/NAME.md)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from longbird.files import write_file_atomically

ROOT = Path(__file__).resolve().parents[1]
# Issue 27's targets (forward / own GEMM floor), by (preset, size, dtype, tokens); tape has none.
TARGETS = {**{(preset, "small", "bf16", 4096): 1.8 for preset in ("kobigbird", "littlebird")},
           **{(preset, "small", "fp32", 4096): 1.3 for preset in ("kobigbird", "littlebird")},
           **{(preset, "base", "fp32", 4096): 1.15 for preset in ("kobigbird", "littlebird")},
           **{(preset, "base", "bf16", 4096): 1.5 for preset in ("kobigbird", "littlebird")},
           ("littlebird", "small", "fp32", 512): 1.4}  # "littlebird at 512 tokens": the fp32 row


def key(row: dict) -> tuple:
    return row["preset"], row["size"], row["dtype"], row["length"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--name", default="floor_comparison")
    args = parser.parse_args()
    before, after = (json.loads(path.read_text()) for path in (args.before, args.after))
    old = {key(row): row for row in before["rows"]}
    lines = [f"Before: `{before['command']}` ({before.get('code', 'the issue-27 start commit')})  ",
             f"After: `{after['command']}` ({after.get('code', '?')})  ",
             f"CPU: {after['cpu']}, {after['threads']} threads, torch {after['torch']}; matmul TFLOP/s "
             + ", ".join(f"{name} {value:.3f}" for name, value in after["matmul_tflops"].items()) + ". Batch 1, random "
             "weights, 12 layers; medians of alternating forward / replay calls; both runs on the same machine, "
             "one after the other.", "",
             "| preset | size | dtype | tokens | forward before | forward after | floor | ratio before | ratio after | "
             "target |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in after["rows"]:
        was = old.get(key(row))
        target = TARGETS.get(key(row))
        met = "" if target is None else (" met" if row["ratio"] <= target else " **missed**")
        lines.append(f"| {row['preset']} | {row['size']} | {row['dtype']} | {row['length']} | "
                     f"{was['forward_seconds']:.3f} s | {row['forward_seconds']:.3f} s | {row['floor_seconds']:.3f} s | "
                     f"{was['ratio']:.2f} | **{row['ratio']:.2f}** | "
                     f"{'—' if target is None else f'≤ {target}{met}'} |" if was else
                     f"| {row['preset']} | {row['size']} | {row['dtype']} | {row['length']} | — | "
                     f"{row['forward_seconds']:.3f} s | {row['floor_seconds']:.3f} s | — | **{row['ratio']:.2f}** | — |")
    text = "\n".join(lines) + "\n"
    write_file_atomically(ROOT / "benchmarks" / "results" / f"{args.name}.md", text)
    print(text)


if __name__ == "__main__":
    main()
