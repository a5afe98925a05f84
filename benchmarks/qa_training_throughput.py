"""Training throughput of the QA recipe (`make qa-model`) with random batches against length-grouped batches.

The recipe's set-up: multilingual-e5-small converted to a 4096-token kobigbird model, KorQuAD 1.0 training paragraphs
of the by-article split at 512-token windows, batch 16, word embeddings frozen, learning rate 1e-4, fp32 (bf16 where
the CPU multiplies it natively, as `make qa-model` chooses). Each sampling strategy trains the same fresh model for
`--steps` optimiser steps in its own process (the two alternate, `--rounds` times); a step's time comes from
Trainer's own runtime, and its tokens are counted from the batches it trained (real tokens, and tokens including
padding). The first step (allocator warm-up) is left out by timing steps 2..N against a 1-step run.
Usage: python benchmarks/qa_training_throughput.py [--steps 8] [--rounds 1]
Writes benchmarks/results/qa_training_throughput.md (and .json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from longbird.bench.sweep import cpu_model
from longbird.files import write_file_atomically
from longbird.precision import native_bf16

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json"

CHILD = """
import json, sys, tempfile, time
from pathlib import Path
import torch
from longbird.data.batching import PaddedBatches
from longbird.data.html import add_tag_tokens
from longbird.data.windows import QAWindows
from longbird.checkpoints import load_task_model
from longbird.heads import LongBirdForQuestionAnswering
from longbird.tasks.qa import read_qa_data
from longbird.training.finetune import FinetuneSettings, train
strategy, steps, bf16, data = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
rows, _ = read_qa_data(data, "korquad1", "train")
torch.manual_seed(0)
model, tokenizer = load_task_model("multilingual-e5-small", LongBirdForQuestionAnswering, "kobigbird", 4096)
add_tag_tokens(tokenizer, model)
items = QAWindows(tokenizer, rows, 512, seed=0, token_types=model.config.type_vocab_size >= 2)
seen = {"real": 0, "padded": 0}
pad = PaddedBatches(tokenizer.pad_token_id)
def counting(batch_items):
    batch = pad(batch_items)
    seen["real"] += int(batch["attention_mask"].sum()); seen["padded"] += batch["input_ids"].numel()
    return batch
settings = FinetuneSettings(learning_rate=1e-4, max_steps=steps, batch_size=16, seed=0, bf16=bf16, progress=False,
                            group_by_length=strategy == "group_by_length", logging_steps=steps)
with tempfile.TemporaryDirectory() as scratch:
    metrics = train(model, tokenizer, items, Path(scratch), settings, collator=counting)
print(json.dumps({"strategy": strategy, "steps": steps, "seconds": metrics["train_runtime"], **seen}))
"""


def matmul_rates() -> str:
    """The machine's measured 4096×768×3072 matmul rate, fp32 and bf16 (machines differ several-fold)."""
    a, b = torch.randn(4096, 768), torch.randn(768, 3072)
    rates = []
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        for _ in range(2):
            x @ y
        started, repeats = time.perf_counter(), 5
        for _ in range(repeats):
            x @ y
        rates.append(2 * 4096 * 768 * 3072 * repeats / (time.perf_counter() - started) / 1e12)
    return f"4096×768×3072 matmul {rates[0]:.3f} TFLOP/s fp32, {rates[1]:.3f} bf16"


def run(strategy: str, steps: int, bf16: bool) -> dict:
    result = subprocess.run([sys.executable, "-c", CHILD, strategy, str(steps), "1" if bf16 else "0", str(DATA)],
                            capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if result.returncode:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "qa_training_throughput.md")
    args = parser.parse_args()
    bf16 = native_bf16("cpu")
    rates = matmul_rates()
    rows = []
    for _ in range(args.rounds):
        for strategy in ("random", "group_by_length"):
            first, full = run(strategy, 1, bf16), run(strategy, args.steps, bf16)
            # steps 2..N: the full run minus a 1-step run with the same first batch (same seed and sampler)
            rows.append({"strategy": strategy, "steps_timed": args.steps - 1,
                         "seconds": full["seconds"] - first["seconds"], "real": full["real"] - first["real"],
                         "padded": full["padded"] - first["padded"]})
    table = ["| sampling | steps timed | s per step | real tokens / s | padded tokens / s | real / padded |",
             "|---|---|---|---|---|---|"]
    summary = {}
    for strategy in ("random", "group_by_length"):
        mine = [r for r in rows if r["strategy"] == strategy]
        seconds = statistics.median(r["seconds"] / r["steps_timed"] for r in mine)
        real = statistics.median(r["real"] / r["seconds"] for r in mine)
        padded = statistics.median(r["padded"] / r["seconds"] for r in mine)
        share = sum(r["real"] for r in mine) / sum(r["padded"] for r in mine)
        summary[strategy] = {"seconds_per_step": seconds, "real_tokens_per_s": real, "share_real": share}
        table.append(f"| {strategy} | {mine[0]['steps_timed']} × {len(mine)} | {seconds:.2f} | {real:.0f} | "
                     f"{padded:.0f} | {share:.2f} |")
    gain = summary["group_by_length"]["real_tokens_per_s"] / summary["random"]["real_tokens_per_s"]
    lines = ["# QA training throughput: random against length-grouped batches", "",
             f"Command: `python benchmarks/qa_training_throughput.py --steps {args.steps} --rounds {args.rounds}`  ",
             f"Machine: {cpu_model()}, {os.cpu_count()} CPUs, ATen {torch.backends.cpu.get_cpu_capability()}, "
             f"torch {torch.__version__}, {'bf16 autocast' if bf16 else 'fp32 (bf16 is not native here)'}, "
             f"{time.strftime('%Y-%m-%d')}; {rates}  ",
             "Set-up: `make qa-model`'s (multilingual-e5-small → kobigbird-4096, KorQuAD 1.0 training paragraphs of "
             "the by-article split, 512-token windows, batch 16, word embeddings frozen).", "", *table, "",
             f"Length-grouped batches train **{gain:.2f}×** the real (non-padding) tokens per second of random "
             "batches.", "", "```json", json.dumps({"runs": rows, "summary": summary}, indent=1), "```", ""]
    write_file_atomically(args.out, "\n".join(lines))
    print("\n".join(lines[:-4]))


if __name__ == "__main__":
    main()
