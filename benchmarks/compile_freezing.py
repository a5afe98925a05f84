"""Eager, compiled, and compiled with Inductor's freezing, alternating in one process.

`--compile` of `answer`/`evaluate`/`serve` compiles the encoder with freezing on the CPU (`compilation.frozen_calls`:
the weights become graph constants, each Linear a prepacked oneDNN (bf16) or MKL (fp32) product with its epilogue).
`benchmarks/floor.py --compile [--freeze]` compares either compile with eager, but one process holds one compiled
graph per shape, so plain and frozen ran in separate processes, whose speeds differ by a few percent from run to
run. Here a copy of the model (same weights) inside a wrapper module is compiled with freezing beside the plain one,
and the three calls alternate (A B C A B C ...): frozen / plain is measured within one run. The wrapper gives the
frozen compile a code object of its own: Dynamo inlines nn.Modules and takes parameters as graph inputs, so a second
instance of the same class would reuse the plain graph (a first version of this script measured that, frozen equal
to plain). Each row records the linear operators one call of each compiled graph runs (torch.profiler), and the
script stops if the frozen graph still runs `aten::addmm`/`aten::mm` or the plain one none. Random weights, batch 1,
CPU.

Usage: python benchmarks/compile_freezing.py [--preset kobigbird littlebird] [--size small] [--dtype fp32 bf16]
[--length 512 2048 4096 8192] [--repeats 5] [--name compile_freezing]. Writes benchmarks/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floor import code_version  # the benchmarks' shared commit note

from longbird.bench.models import PRESET_SETTINGS, SIZES, build_model, forward_fn, matmul_throughput
from longbird.bench.report import write_table
from longbird.bench.sweep import DTYPES, alternating_times, cpu_model
from longbird.compilation import frozen_calls
from longbird.malloc import keep_freed_memory

ROOT = Path(__file__).resolve().parents[1]
CALLS = ("eager", "compiled", "frozen")


class Wrapped(torch.nn.Module):
    """`model` behind a forward of another code object, so that Dynamo traces and caches it apart."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, **inputs):
        return self.model(**inputs)


LINEAR_OPS = ("aten::addmm", "aten::mm", "mkldnn::_linear_pointwise", "mkl::_mkl_linear")


def linear_ops(run) -> dict[str, int]:
    """Calls of each linear operator in one `run()` (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        run()
    return {event.key: event.count for event in profiler.key_averages() if event.key in LINEAR_OPS}


def measure(preset: str, size: str, dtype: str, length: int, repeats: int) -> dict:
    torch._dynamo.reset()
    model = build_model(preset, length, SIZES[size]).to(DTYPES[dtype])
    twin = Wrapped(copy.deepcopy(model))
    calls = {"eager": forward_fn(model, length, backward=False, base=SIZES[size]),
             "compiled": forward_fn(model, length, backward=False, base=SIZES[size],
                                    call=torch.compile(model, fullgraph=True)),
             "frozen": forward_fn(twin, length, backward=False, base=SIZES[size],
                                  call=frozen_calls(torch.compile(twin, fullgraph=True)))}
    for call in calls.values():  # compile (first call) and warm up outside the timing
        call()
    ops = {name: linear_ops(calls[name]) for name in ("compiled", "frozen")}
    unpacked = ("aten::addmm", "aten::mm")
    if any(op in ops["frozen"] for op in unpacked) or not any(op in ops["compiled"] for op in unpacked):
        raise SystemExit(f"compile_freezing: the graphs do not differ as intended: {ops}")
    times = alternating_times(calls, repeats)
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    return {"preset": preset, "size": size, "dtype": dtype, "length": length,
            **{f"{name}_seconds": medians[name] for name in CALLS},
            **{f"{name}_samples": times[name] for name in CALLS}, "linear_ops": ops,
            "compiled_over_eager": medians["compiled"] / medians["eager"],
            "frozen_over_eager": medians["frozen"] / medians["eager"],
            "frozen_over_compiled": medians["frozen"] / medians["compiled"]}


def markdown(report: dict) -> list[str]:
    lines = [f"Command: `{report['command']}`  ", f"Code: {report['code']}  ",
             f"CPU: {report['cpu']}, {report['threads']} threads, torch {report['torch']}; 4096x768x3072 matmul "
             "TFLOP/s: " + ", ".join(f"{name} {value:.3f}" for name, value in report["matmul_tflops"].items())
             + f". Batch 1, random weights; medians of {report['repeats']} alternating calls (eager, compiled, "
             "compiled with freezing) after each one's compile and a warm-up.", "",
             "| preset | size | dtype | tokens | eager | compiled | frozen | compiled / eager | frozen / eager | "
             "frozen / compiled |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        lines.append(f"| {r['preset']} | {r['size']} | {r['dtype']} | {r['length']} | {r['eager_seconds']:.3f} s | "
                     f"{r['compiled_seconds']:.3f} s | {r['frozen_seconds']:.3f} s | {r['compiled_over_eager']:.3f} "
                     f"| {r['frozen_over_eager']:.3f} | **{r['frozen_over_compiled']:.3f}** |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", nargs="+", default=["kobigbird", "littlebird"], choices=list(PRESET_SETTINGS))
    parser.add_argument("--size", nargs="+", default=["small"], choices=list(SIZES))
    parser.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--length", nargs="+", type=int, default=[512, 2048, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--name", default="compile_freezing")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    keep_freed_memory()  # as the command line does
    report = {"command": "python benchmarks/compile_freezing.py " + " ".join(sys.argv[1:]), "code": code_version(),
              "cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "repeats": args.repeats,
              "matmul_tflops": {name: matmul_throughput(DTYPES[name]) / 1e12 for name in args.dtype}, "rows": []}
    for size in args.size:
        for preset in args.preset:
            for dtype in args.dtype:
                for length in args.length:
                    row = measure(preset, size, dtype, length, args.repeats)
                    report["rows"].append(row)
                    print(f"{preset} {size} {dtype} {length}: eager {row['eager_seconds']:.3f} s, compiled "
                          f"{row['compiled_seconds']:.3f} s, frozen {row['frozen_seconds']:.3f} s", flush=True)
    write_table(report, markdown(report), args.out, args.name)


if __name__ == "__main__":
    main()
