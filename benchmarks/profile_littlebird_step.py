"""Where a LittleBird training step spends its time on the CPU: torch profiler, top operators, fwd + bwd.

Usage: python benchmarks/profile_littlebird_step.py [--size small] [--length 4096] [--preset littlebird]
Writes benchmarks/results/profile_<preset>_step_<size>_<length>.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from longbird.bench.models import SIZES, build_model, forward_fn  # noqa: E402
from longbird.files import write_file_atomically  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--preset", default="littlebird")
    parser.add_argument("--rows", type=int, default=15)
    args = parser.parse_args()
    model = build_model(args.preset, args.length, SIZES[args.size]).train()
    step = forward_fn(model, args.length, backward=True, batch=args.batch, base=SIZES[args.size])

    step()  # warm-up
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    seconds = time.perf_counter() - started
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows)
    text = (f"Command: `python {' '.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])}`  \n"
            f"{args.preset}, size {args.size}, batch {args.batch} x {args.length} tokens, fp32, forward + backward, "
            f"{torch.get_num_threads()} threads, torch {torch.__version__}; one profiled step {seconds:.2f} s "
            f"(the profiler adds overhead).\n\n```\n{table}\n```\n")
    out = ROOT / "benchmarks" / "results" / f"profile_{args.preset}_step_{args.size}_{args.length}.md"
    write_file_atomically(out, text)
    print(text)


if __name__ == "__main__":
    main()
