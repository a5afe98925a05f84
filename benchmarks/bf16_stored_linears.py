"""bf16 inference: autocast over fp32 weights against the encoder's Linear weights stored in bf16 once.

Autocast casts every Linear's fp32 weight and bias to bf16 at each call; `precision.store_encoder_linears_in` stores
them in bf16 so those casts go, with the same arithmetic (tests/test_precision.py asserts bit-equal outputs). This
script times one forward of a saved QA model (batch 1, random token ids: the speed does not depend on them) both
ways, alternating calls, checks the start logits are equal, and profiles one forward of each for the time in
`aten::copy_` / `aten::_to_copy` (the casts).
Usage: python benchmarks/bf16_stored_linears.py --model DIR [--lengths 512 4096] [--repeats 9] [--name NAME]
Writes benchmarks/results/NAME.{md,json}.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from longbird.bench.models import cpu_matmul_rates, describe_matmul_rates
from longbird.bench.sweep import alternating_times, cpu_model
from longbird.checkpoints import load_on_device
from longbird.files import write_file_atomically
from longbird.heads import LongBirdForQuestionAnswering
from longbird.precision import native_bf16, store_encoder_linears_in

ROOT = Path(__file__).resolve().parents[1]
CAST_OPS = ("aten::copy_", "aten::_to_copy")


def forward(model, input_ids):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        return model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).start_logits


def cast_milliseconds(model, input_ids) -> float:
    """Self CPU time of the cast ops in one profiled forward."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward(model, input_ids)
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in CAST_OPS) / 1e3


def measure(autocast_model, stored_model, length: int, repeats: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, autocast_model.config.vocab_size, (1, length), generator=generator)
    equal = torch.equal(forward(autocast_model, input_ids), forward(stored_model, input_ids))
    times = alternating_times({"autocast": lambda: forward(autocast_model, input_ids),
                               "stored": lambda: forward(stored_model, input_ids)}, repeats)
    median = {name: statistics.median(values) for name, values in times.items()}
    return {"tokens": length, "equal_start_logits": equal, "autocast_s": median["autocast"],
            "stored_s": median["stored"], "speedup": median["autocast"] / median["stored"],
            "autocast_cast_ms": cast_milliseconds(autocast_model, input_ids),
            "stored_cast_ms": cast_milliseconds(stored_model, input_ids), "times": times}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a saved longbird QA model directory")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--name", default="bf16_stored_linears")
    args = parser.parse_args(argv)
    if not native_bf16("cpu"):
        raise SystemExit("this CPU has no bf16 arithmetic (no AVX-512 bf16 or AMX): bf16 is emulated here, so its "
                         "timings say nothing; run this on a CPU that has it")
    autocast_model = load_on_device(args.model, LongBirdForQuestionAnswering)[0]
    stored_model = store_encoder_linears_in(copy.deepcopy(autocast_model))
    rows = [measure(autocast_model, stored_model, length, args.repeats) for length in args.lengths]
    command = "python benchmarks/bf16_stored_linears.py " + " ".join(sys.argv[1:] if argv is None else argv)
    header = (f"Command: `{command}`  \nCPU: {cpu_model()}, {torch.get_num_threads()} threads, torch "
              f"{torch.__version__}; {describe_matmul_rates(cpu_matmul_rates())}. Batch 1, medians of "
              f"{args.repeats} alternating forwards under bf16 autocast.")
    lines = [header, "", "| tokens | fp32 weights, autocast | bf16 Linear weights stored | speed-up | casts (ms, "
             "profiled forward) | start logits equal |", "|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        lines.append(f"| {row['tokens']} | {row['autocast_s']:.3f} s | {row['stored_s']:.3f} s | "
                     f"{row['speedup']:.2f}x | {row['autocast_cast_ms']:.0f} -> {row['stored_cast_ms']:.0f} | "
                     f"{'yes' if row['equal_start_logits'] else 'NO'} |")
    out = ROOT / "benchmarks" / "results" / args.name
    write_file_atomically(out.with_suffix(".md"), "\n".join(lines) + "\n")
    write_file_atomically(out.with_suffix(".json"), json.dumps({"command": command, "model": args.model,
                                                                "cpu": cpu_model(), "rows": rows}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
