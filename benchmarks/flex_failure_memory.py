"""What a remembered flex compile failure saves: the same forward in two fresh processes sharing one cache directory.

Each process converts the embedded MiniLM to a preset, then times one no-grad forward at 4096 tokens with the
`auto` backend (CPU inference of LittleBird at 4096 tokens in fp32 picks compiled flex_attention; BigBird rows take
the blocked kernels on CPU since 2026-11-26, so `--preset kobigbird` no longer tries flex at all).
`--capability default` runs the children under ATEN_CPU_CAPABILITY=default, where torch 2.13's CPU flex template
fails to compile (it calls at::vec functions the scalar build lacks): the first process pays the failed compile, then
the blocked kernels; the second reads the record (`longbird/flex_failures.py`) and goes straight to the blocked kernels.
Usage: python benchmarks/flex_failure_memory.py [--preset littlebird] [--capability default]
Writes benchmarks/results/flex_failure_memory.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from longbird.bench.sweep import cpu_model
from longbird.files import write_file_atomically

CHILD = """
import json, sys, time, torch
from longbird import convert
from longbird.sources import resolve_model_directory
model = convert(str(resolve_model_directory("minilm")), preset=sys.argv[1], max_length=4096).eval()
ids = torch.randint(1000, 2000, (1, 4096), generator=torch.Generator().manual_seed(0))
started = time.perf_counter()
with torch.no_grad():
    model(input_ids=ids)
print(json.dumps({"forward_s": time.perf_counter() - started}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="littlebird", choices=("littlebird", "kobigbird"))
    parser.add_argument("--capability", default="default", help="ATEN_CPU_CAPABILITY of the two processes")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "flex_failure_memory.md")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        environment = {**os.environ, "LONGBIRD_CACHE": cache, "ATEN_CPU_CAPABILITY": args.capability}
        for process in (1, 2):
            run = subprocess.run([sys.executable, "-c", CHILD, args.preset], capture_output=True, text=True,
                                 env=environment, check=True)
            warned = "flex_attention failed" in run.stderr
            rows.append((process, json.loads(run.stdout.strip().splitlines()[-1])["forward_s"], warned))
        record = Path(cache) / "flex_failures.json"
        recorded = json.loads(record.read_text()) if record.exists() else {}
    import torch

    lines = [f"Command: `python {' '.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}`  ",
             f"Machine: {cpu_model()} (default ATen family {torch.backends.cpu.get_cpu_capability()}), {os.cpu_count()} CPUs, torch {torch.__version__}, "
             f"ATEN_CPU_CAPABILITY={args.capability}; MiniLM converted to {args.preset}, batch 1, 4096 tokens, "
             "no grad, one forward per fresh process, one shared cache directory.", "",
             "| process | forward s (incl. any compile) | warned of a flex failure |", "|---:|---:|---|"]
    lines += [f"| {process} | {seconds:.1f} | {'yes' if warned else 'no'} |" for process, seconds, warned in rows]
    lines += ["", "Recorded families: " + ("; ".join(f"`{key}`: {value['error']}" for key, value in recorded.items())
                                          if recorded else "none (flex compiled)")]
    write_file_atomically(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
