"""longbird kobigbird vs transformers.BigBirdModel: forward latency and peak memory, one process.

Base size (12 layers, 768 hidden, 12 heads), block 64, 3 random blocks, random init, batch 1.
Usage: python benchmarks/bigbird_vs_hf.py [--lengths 1024 2048 4096 8192] [--dtypes fp32 bf16] [--repeats 3]
       [--name bigbird_vs_hf]
Writes benchmarks/results/NAME.json and .md (with the command that made them). Freed tensor memory is kept for reuse
as the `longbird` command line keeps it (`longbird.malloc`; `LONGBIRD_MALLOC=system` for the C library's defaults),
for both models alike.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

from longbird.bench.models import BASE, build_model
from longbird.bench.memory import peak_allocated_bytes
from longbird.files import write_file_atomically
from longbird.malloc import keep_freed_memory

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build(max_length: int):
    return {"longbird-kobigbird": build_model("kobigbird", max_length), "hf-bigbird": build_model("hf-bigbird", max_length)}


def measure(models, input_ids, repeats):
    """Per model: median forward seconds and the peak tensor memory of one profiled call.

    Timed calls alternate between the models (A B A B ...) so machine noise hits both alike.
    """
    times = {name: [] for name in models}
    outputs, peaks = {}, {}
    with torch.inference_mode():
        for model in models.values():
            model(input_ids=input_ids)  # warm-up
        for _ in range(repeats):
            for name, model in models.items():
                gc.collect()
                start = time.perf_counter()
                outputs[name] = model(input_ids=input_ids).last_hidden_state.float()
                times[name].append(time.perf_counter() - start)
        for name, model in models.items():
            peaks[name], _ = peak_allocated_bytes(lambda: model(input_ids=input_ids))
    return {name: (statistics.median(times[name]), peaks[name], outputs[name]) for name in models}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--name", default="bigbird_vs_hf", help="Writes OUT/NAME.json and OUT/NAME.md")
    args = parser.parse_args(argv)

    malloc = keep_freed_memory()  # before any model is built, as the command line does
    models = build(max(args.lengths))
    # Same weights in both, so the bf16-vs-fp32 check compares like with like.
    models["hf-bigbird"].load_state_dict(
        {("pooler.weight" if k == "pooler.dense.weight" else "pooler.bias" if k == "pooler.dense.bias" else k): v
         for k, v in models["longbird-kobigbird"].state_dict().items()}, strict=False)
    rows, fp32_outputs = [], {}
    for dtype_name in sorted(args.dtypes, key=lambda name: name != "fp32"):  # fp32 first: the reference
        for name, model in models.items():
            model.to(DTYPES[dtype_name])
        for length in args.lengths:
            input_ids = torch.randint(5, BASE["vocab_size"], (1, length), generator=torch.Generator().manual_seed(length))
            measured = measure(models, input_ids, args.repeats)
            for name, (seconds, peak, _) in measured.items():
                rows.append({"model": name, "dtype": dtype_name, "length": length, "median_seconds": seconds,
                             "peak_mib": peak / 2**20})
                print(json.dumps(rows[-1]), flush=True)
            if dtype_name == "fp32":
                fp32_outputs[length] = measured["longbird-kobigbird"][2]
            else:
                if length not in fp32_outputs:  # fp32 not in this run: recompute from the original fp32 weights
                    with torch.inference_mode():
                        fp32_outputs[length] = build(max(args.lengths))["longbird-kobigbird"](
                            input_ids=input_ids).last_hidden_state
                cosine = torch.nn.functional.cosine_similarity(
                    measured["longbird-kobigbird"][2], fp32_outputs[length], dim=-1)
                rows[-2]["min_cosine_vs_fp32"] = cosine.min().item()
    report = {
        "command": "python " + " ".join(["benchmarks/bigbird_vs_hf.py", *sys.argv[1:]]),
        "torch": torch.__version__, "transformers": transformers.__version__, "threads": torch.get_num_threads(),
        "malloc": malloc,
        "cpu": next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                     if l.startswith("model name")), platform.processor()),
        "config": {**BASE, "block_size": 64, "num_random_blocks": 3, "batch": 1, "repeats": args.repeats},
        "results": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_file_atomically(args.out / f"{args.name}.json", json.dumps(report, indent=2) + "\n")
    write_file_atomically(args.out / f"{args.name}.md", markdown(report))
    print(markdown(report))


def markdown(report) -> str:
    index = {(r["model"], r["dtype"], r["length"]): r for r in report["results"]}
    lines = [f"Command: `{report['command']}`  ",
             f"torch {report['torch']}, transformers {report['transformers']}, {report['threads']} threads, {report['cpu']}"
             + (f"; freed tensor memory (longbird.malloc): {report['malloc']}" if "malloc" in report else ""),
             "", "| dtype | length | longbird s | HF BigBird s | speed-up | longbird peak MiB | HF peak MiB | bf16 cos vs fp32 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (model, dtype, length), ours in index.items():
        if model != "longbird-kobigbird":
            continue
        theirs = index[("hf-bigbird", dtype, length)]
        cosine = ours.get("min_cosine_vs_fp32")
        lines.append(f"| {dtype} | {length} | {ours['median_seconds']:.3f} | {theirs['median_seconds']:.3f} | "
                     f"{theirs['median_seconds'] / ours['median_seconds']:.2f}x | {ours['peak_mib']:.0f} | "
                     f"{theirs['peak_mib']:.0f} | {'' if cosine is None else f'{cosine:.5f}'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
