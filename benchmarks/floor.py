"""How far a forward pass is from its own GEMM floor, per preset, size, dtype and length, and where the rest goes.

For each point the model (random init, batch 1, `longbird.bench.models`) runs one forward; the `nn.Linear` calls it
made are recorded and replayed alone with the same weights, shapes and dtype (`longbird.bench.floor`); forward and
replay alternate, medians of --repeats. ratio = forward / floor: 1.0 would be a forward that does nothing but its
dense projections and feed-forward products. With --profile, the operators of one forward at the longest length
(self CPU time, torch.profiler) show what the time above the floor is made of. CPU only.

Usage: python benchmarks/floor.py [--preset kobigbird littlebird tape] [--size small base] [--dtype fp32 bf16]
       [--length 512 4096] [--repeats 3] [--profile] [--compile [--freeze]] [--without-kernel] [--name floor]
Writes benchmarks/results/NAME.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import torch

import longbird
from longbird.attention import cpu_kernel
from longbird.bench.floor import floor_measurement, op_profile
from longbird.bench.models import PRESET_SETTINGS, SIZES, build_model, forward_fn, matmul_throughput
from longbird.bench.sweep import DTYPES, cpu_model
from longbird.compilation import frozen_calls
from longbird.files import write_file_atomically
from longbird.malloc import keep_freed_memory

ROOT = Path(__file__).resolve().parents[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", nargs="+", default=["kobigbird", "littlebird", "tape"],
                        choices=list(PRESET_SETTINGS))
    parser.add_argument("--size", nargs="+", default=["small", "base"], choices=list(SIZES))
    parser.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--length", nargs="+", type=int, default=[512, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="Operator profile of each preset at the longest length")
    parser.add_argument("--profile-top", type=int, default=12)
    parser.add_argument("--backend", choices=["auto", "blocked", "flex"], default=None,
                        help="Sparse attention backend (LONGBIRD_ATTENTION_BACKEND); default: the model's own choice")
    parser.add_argument("--compile", action="store_true",
                        help="Also time the forward through torch.compile(model, fullgraph=True), alternating")
    parser.add_argument("--freeze", action="store_true",
                        help="With --compile: compile with Inductor's freezing (weights as constants, prepacked "
                             "linears with fused epilogues), as `--compile` of answer/evaluate/serve does on the CPU. "
                             "Not a variant beside the plain compile: one process holds one compiled graph per shape")
    parser.add_argument("--without-kernel", action="store_true",
                        help="Also time the forward with longbird's fused CPU kernels off (LONGBIRD_CPU_KERNEL=0 "
                             "during those calls: SDPA / flex), alternating in this process")
    parser.add_argument("--row-plan", choices=["device", "op"], default=None,
                        help="Where a compiled kobigbird makes its per-row plan (LONGBIRD_ROW_PLAN); default: "
                             "dispatch.compiled_row_plan's (the op)")
    parser.add_argument("--name", default="floor")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    if args.backend:
        os.environ["LONGBIRD_ATTENTION_BACKEND"] = args.backend
    if args.row_plan:
        os.environ["LONGBIRD_ROW_PLAN"] = args.row_plan
    command = "python benchmarks/floor.py " + " ".join(sys.argv[1:])
    malloc = keep_freed_memory()  # as the command line does (LONGBIRD_MALLOC=system: the C library's defaults)
    report = {"command": command, "code": code_version(), "backend": args.backend or "auto", "malloc": malloc,
              "compiled_with_freezing": bool(args.compile and args.freeze),
              "row_plan": args.row_plan or "default",
              "cpu_kernel": {name: "on" if cpu_kernel.available(DTYPES[name]) else "off" for name in args.dtype},
              "cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "matmul_tflops": {name: matmul_throughput(DTYPES[name]) / 1e12 for name in args.dtype},
              "rows": [], "profiles": []}
    longest = max(args.length)
    for size in args.size:
        for preset in args.preset:
            for dtype in args.dtype:
                model = build_model(preset, longest, SIZES[size]).to(DTYPES[dtype])
                for length in sorted(args.length):
                    run = forward_fn(model, length, backward=False, base=SIZES[size])
                    variants = {}
                    if args.compile:
                        torch._dynamo.reset()  # each row compiles afresh: its first call is its compile time
                        compiled = torch.compile(model, fullgraph=True)
                        variants["compiled"] = forward_fn(model, length, backward=False, base=SIZES[size],
                                                          call=frozen_calls(compiled) if args.freeze else compiled)
                    if args.without_kernel:
                        variants["without_kernel"] = kernel_off(run)
                    # without variants, the call of the issue-27 "before" code (which had none) works too
                    row = floor_measurement(model, run, repeats=args.repeats, **({"variants": variants} if variants
                                                                                 else {}))
                    row.update(preset=preset, size=size, dtype=dtype, length=length)
                    report["rows"].append(row)
                    others = "".join(f", {name.replace('_', ' ')} {row[name + '_seconds']:.3f} s (ratio "
                                     f"{row[name + '_ratio']:.2f})" for name in variants)
                    print(f"{preset} {size} {dtype} {length}: forward {row['forward_seconds']:.3f} s, floor "
                          f"{row['floor_seconds']:.3f} s, ratio {row['ratio']:.2f}{others}", flush=True)
                    if args.profile and length == longest:
                        report["profiles"].append(dict(preset=preset, size=size, dtype=dtype, length=length,
                                                       ops=op_profile(run, args.profile_top)))
                del model
    write_file_atomically(args.out / f"{args.name}.json", json.dumps(report, indent=2) + "\n")
    write_file_atomically(args.out / f"{args.name}.md", markdown(report))
    print(markdown(report))


def kernel_off(run):
    """`run` with longbird's fused CPU kernels switched off for the call (they read LONGBIRD_CPU_KERNEL per call)."""
    def without_kernel():
        with mock.patch.dict(os.environ, {"LONGBIRD_CPU_KERNEL": "0"}):
            return run()
    return without_kernel


def code_version() -> str:
    """The commit of the longbird package measured (a before/after pair may run one script against two checkouts)."""
    package = Path(longbird.__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(package), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(package), "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"{package} (not a git checkout)"
    return f"{commit}{' + uncommitted changes' if dirty else ''} ({package})"


def _kernel_note(state) -> str:
    """"; fused CPU kernel: bf16 on, fp32 on" (reports before the fp32 kernel hold one state, the bf16 kernel's)."""
    if state is None:
        return ""
    if isinstance(state, str):
        return f"; bf16 CPU kernel: {state}"
    return "; fused CPU kernel: " + ", ".join(f"{name} {value}" for name, value in state.items())


def markdown(report: dict) -> str:
    tflops = ", ".join(f"{name} {value:.3f}" for name, value in report["matmul_tflops"].items())
    lines = [f"Command: `{report['command']}`  ", f"Code: {report.get('code', '?')}; sparse attention backend: "
             f"{report.get('backend', 'auto')}"
             + (f"; compiled per-row plan: {report['row_plan']}" if report.get("row_plan", "default") != "default"
                else "")
             + _kernel_note(report.get("cpu_kernel"))
             + (f"; freed tensor memory (longbird.malloc): {report['malloc']}" if "malloc" in report else "") + "  ",
             f"CPU: {report['cpu']}, {report['threads']} threads, torch {report['torch']}; 4096x768x3072 matmul "
             f"TFLOP/s: {tflops}. Batch 1, random weights, 12 layers; medians of alternating forward / replay calls.",
             ""]
    compiled = any("compiled_seconds" in row for row in report["rows"])
    if compiled and report.get("compiled_with_freezing"):
        lines[-2] += " Compiled with Inductor's freezing (`--freeze`)."
    without = any("without_kernel_seconds" in row for row in report["rows"])
    extra = (" compiled | compiled ratio | compile (first call) |" if compiled else "") + (
        " without the kernel | ratio without |" if without else "")
    lines += ["| preset | size | dtype | tokens | forward | own GEMM floor | floor GFLOP/s | ratio |" + extra,
              "|---|---|---|---:|---:|---:|---:|---:|" + ("---:|---:|---:|" if compiled else "")
              + ("---:|---:|" if without else "")]
    for row in report["rows"]:
        cells = (f" {row['compiled_seconds']:.3f} s | **{row['compiled_ratio']:.2f}** | "
                 f"{row['compiled_first_call_seconds']:.1f} s |" if compiled else "")
        cells += (f" {row['without_kernel_seconds']:.3f} s | {row['without_kernel_ratio']:.2f} |" if without else "")
        lines.append(f"| {row['preset']} | {row['size']} | {row['dtype']} | {row['length']} | "
                     f"{row['forward_seconds']:.3f} s | {row['floor_seconds']:.3f} s | {row['floor_gflops']:.0f} | "
                     f"**{row['ratio']:.2f}** |" + cells)
    for profile in report["profiles"]:
        lines += ["", f"Operators of one forward, {profile['preset']} {profile['size']} {profile['dtype']} "
                      f"{profile['length']} tokens (self CPU time):", "", "| op | self ms | calls | share |",
                  "|---|---:|---:|---:|"]
        lines += [f"| `{op['op']}` | {op['self_ms']:.1f} | {op['calls']} | {100 * op['share']:.1f} % |"
                  for op in profile["ops"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
