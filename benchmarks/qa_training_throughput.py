"""Training throughput of the QA recipe (`make qa-model`) with random batches against length-grouped batches, and
(`--compile`) length-grouped batches through torch.compile (`finetune-qa --compile`).

The recipe's set-up: multilingual-e5-small converted to a 4096-token kobigbird model, KorQuAD 1.0 training paragraphs
of the by-article split at 512-token windows, batch 16, word embeddings frozen, learning rate 1e-4, fp32 (bf16 where
the CPU multiplies it natively, as `make qa-model` chooses). Each sampling strategy trains the same fresh model for
`--steps` optimiser steps in its own process (the strategies alternate, `--rounds` times); a step's time is the wall
time between the ends of two optimiser steps (a Trainer callback), and its tokens are counted from the batch it trained
(real tokens, and tokens including padding). The first step (allocator warm-up) is left out; compiled, the first two
(the first batch shape compiles, the second recompiles with a dynamic length).
Usage: python benchmarks/qa_training_throughput.py [--steps 8] [--rounds 1] [--compile]
Writes benchmarks/results/qa_training_throughput.md (`--out`), the runs as JSON at its end.
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

from longbird.bench.models import cpu_matmul_rates, describe_matmul_rates
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
from transformers import TrainerCallback
strategy, steps, bf16, data = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
compiled = strategy.endswith("+compile")
rows, _ = read_qa_data(data, "korquad1", "train")
torch.manual_seed(0)
model, tokenizer = load_task_model("multilingual-e5-small", LongBirdForQuestionAnswering, "kobigbird", 4096)
add_tag_tokens(tokenizer, model)
items = QAWindows(tokenizer, rows, 512, seed=0, token_types=model.config.type_vocab_size >= 2)
seen = {"real": [], "padded": [], "step_ends": []}  # per batch, in training order (the loader may fetch one ahead)
pad = PaddedBatches(tokenizer.pad_token_id)
def counting(batch_items):
    batch = pad(batch_items)
    seen["real"].append(int(batch["attention_mask"].sum())); seen["padded"].append(batch["input_ids"].numel())
    return batch
class StepClock(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        seen["began"] = time.perf_counter()
    def on_step_end(self, args, state, control, **kwargs):
        seen["step_ends"].append(time.perf_counter())
settings = FinetuneSettings(learning_rate=1e-4, max_steps=steps, batch_size=16, seed=0, bf16=bf16, progress=False,
                            group_by_length=strategy.startswith("group_by_length"), logging_steps=steps,
                            compile=compiled)
with tempfile.TemporaryDirectory() as scratch:
    train(model, tokenizer, items, Path(scratch), settings, collator=counting,
          trainer_kwargs={"callbacks": [StepClock()]})
print(json.dumps({"strategy": strategy, "steps": steps, **seen}))
"""


def run(strategy: str, steps: int, bf16: bool) -> dict:
    result = subprocess.run([sys.executable, "-c", CHILD, strategy, str(steps), "1" if bf16 else "0", str(DATA)],
                            capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if result.returncode:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def timed(strategy: str, steps: int, bf16: bool) -> dict:
    """One fresh run of `steps` steps; the steps after the warm-up ones timed (end of step w to end of step N)."""
    warmup = 2 if strategy.endswith("+compile") else 1
    if steps <= warmup:
        raise SystemExit(f"--steps must exceed the {warmup} warm-up step(s) of {strategy}")
    out = run(strategy, steps, bf16)
    ends = out["step_ends"]
    return {"strategy": strategy, "steps_timed": steps - warmup, "seconds": ends[steps - 1] - ends[warmup - 1],
            "real": sum(out["real"][warmup:steps]), "padded": sum(out["padded"][warmup:steps]),
            "warmup_seconds": ends[warmup - 1] - out["began"], "step_seconds": [
                later - earlier for earlier, later in zip([out["began"], *ends], ends)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--compile", action="store_true",
                        help="add length-grouped batches through torch.compile (finetune-qa --compile)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "qa_training_throughput.md")
    args = parser.parse_args()
    bf16 = native_bf16("cpu")
    rates = "matmul " + describe_matmul_rates(cpu_matmul_rates())  # machines differ several-fold
    strategies = ("random", "group_by_length") + (("group_by_length+compile",) if args.compile else ())
    rows = [timed(strategy, args.steps, bf16) for _ in range(args.rounds) for strategy in strategies]
    table = ["| sampling | steps timed | s per step | median step (s) | real tokens / s | padded tokens / s | "
             "real / padded |", "|---|---|---|---|---|---|---|"]
    summary = {}
    for strategy in strategies:
        mine = [r for r in rows if r["strategy"] == strategy]
        seconds = statistics.median(r["seconds"] / r["steps_timed"] for r in mine)
        real = statistics.median(r["real"] / r["seconds"] for r in mine)
        padded = statistics.median(r["padded"] / r["seconds"] for r in mine)
        share = sum(r["real"] for r in mine) / sum(r["padded"] for r in mine)
        summary[strategy] = {"seconds_per_step": seconds, "real_tokens_per_s": real, "share_real": share}
        median_step = statistics.median(step for r in mine for step in r["step_seconds"][-r["steps_timed"]:])
        table.append(f"| {strategy} | {mine[0]['steps_timed']} × {len(mine)} | {seconds:.2f} | {median_step:.2f} | "
                     f"{real:.0f} | {padded:.0f} | {share:.2f} |")
    tokens_per_s = {strategy: summary[strategy]["real_tokens_per_s"] for strategy in strategies}
    findings = [f"Length-grouped batches train **{tokens_per_s['group_by_length'] / tokens_per_s['random']:.2f}×** "
                "the real (non-padding) tokens per second of random batches."]
    if args.compile:
        compiled = [r["warmup_seconds"] for r in rows if r["strategy"] == "group_by_length+compile"]
        gain = tokens_per_s["group_by_length+compile"] / tokens_per_s["group_by_length"]
        findings.append(f"Compiled, they train **{gain:.2f}×** "
                        f"the real tokens per second of eager length-grouped batches, after "
                        f"{statistics.median(compiled):.0f} s for the first two steps (compiling).")
    command = (f"python benchmarks/qa_training_throughput.py --steps {args.steps} --rounds {args.rounds}"
               + (" --compile" if args.compile else ""))
    lines = ["# QA training throughput: random against length-grouped batches", "",
             f"Command: `{command}`  ",
             f"Machine: {cpu_model()}, {os.cpu_count()} CPUs, ATen {torch.backends.cpu.get_cpu_capability()}, "
             f"torch {torch.__version__}, {'bf16 autocast' if bf16 else 'fp32 (bf16 is not native here)'}, "
             f"{time.strftime('%Y-%m-%d')}; {rates}  ",
             "Set-up: `make qa-model`'s (multilingual-e5-small → kobigbird-4096, KorQuAD 1.0 training paragraphs of "
             "the by-article split, 512-token windows, batch 16, word embeddings frozen).", "", *table, "",
             *findings, "", "```json", json.dumps({"runs": rows, "summary": summary}, indent=1), "```", ""]
    write_file_atomically(args.out, "\n".join(lines))
    print("\n".join(lines[:-4]))


if __name__ == "__main__":
    main()
