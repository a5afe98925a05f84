"""E6 (part 1): TAPE's length-extrapolation claim at CPU scale — multi-digit addition learnt from scratch.

Task (an encoder version of the arithmetic task of TAPE §4 / McLeish et al. 2024): the input is
`[CLS] a₀a₁… + b₀b₁… = [MASK]×(k+1) [SEP]` with the digits of a and b least-significant first, and the model fills
the masks with the digits of a + b (least-significant first, one more slot than the longer operand, a trailing 0
where there is no carry). Exact match of the whole sum counts. Training: operand lengths drawn uniformly from
1..`--train-digits` each; evaluation: every pair of lengths 1..2 x `--train-digits`, `--eval-samples` per pair.

Four position methods, the same small encoder (longbird, trained from scratch: 4 layers, 64 hidden, 4 heads), the same
steps, batch and learning rate, three seeds each:
- `tape`: position="tape", tape_init="rope": RoPE angles as initial states, updated in every layer (both updates).
- `rope`: the same model with the TAPE maps frozen at zero: the states never change, which is exactly RoPE.
- `bialibi`: LittleBird's BiALiBi (attention="littlebird" with one block covering the sequence, no pack tokens: full
  attention with the BiALiBi bias and learnable slopes).
- `absolute`: a learned absolute position table (BERT), 128 rows, all trained from scratch.

Usage: python experiments/e6_tape.py [--steps 3000] [--train-digits 5] [--seeds 0 1 2] [--eval-samples 8]
Writes experiments/results/e6_tape.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from longbird.config import LongBirdConfig  # noqa: E402
from longbird.files import save_figure_atomically, write_file_atomically  # noqa: E402
from longbird.modeling import LongBirdModel  # noqa: E402

PAD, CLS, SEP, PLUS, EQUALS, MASK = 10, 11, 12, 13, 14, 15  # digits are their own ids 0..9
VOCAB = 16
MAX_POSITIONS = 128
METHODS = ("tape", "rope", "bialibi", "absolute")
BIALIBI_BLOCK = 16  # 3 blocks = 48 tokens >= the longest evaluation input at 2 x 5 digits (35 tokens)


def example(rng: random.Random, digits_a: int, digits_b: int) -> tuple[list[int], list[int]]:
    """(input ids, target ids with -100 outside the answer slots) of one addition."""
    a = rng.randrange(10 ** (digits_a - 1) if digits_a > 1 else 0, 10 ** digits_a)
    b = rng.randrange(10 ** (digits_b - 1) if digits_b > 1 else 0, 10 ** digits_b)
    slots = max(digits_a, digits_b) + 1
    reversed_digits = lambda n, width: [int(c) for c in str(n).zfill(width)[::-1]]  # noqa: E731
    prompt = [CLS] + reversed_digits(a, digits_a) + [PLUS] + reversed_digits(b, digits_b) + [EQUALS]
    answer = reversed_digits(a + b, slots)
    ids = prompt + [MASK] * slots + [SEP]
    targets = [-100] * len(prompt) + answer + [-100]
    return ids, targets


def batch_of(examples: list[tuple[list[int], list[int]]]):
    longest = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), longest), PAD)
    targets = torch.full((len(examples), longest), -100)
    mask = torch.zeros((len(examples), longest), dtype=torch.long)
    for row, (i, t) in enumerate(examples):
        ids[row, :len(i)], targets[row, :len(t)], mask[row, :len(i)] = torch.tensor(i), torch.tensor(t), 1
    return ids, mask, targets


class AdditionModel(nn.Module):
    """A longbird encoder from scratch with a digit classifier on every position."""

    def __init__(self, method: str):
        super().__init__()
        common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=256, max_position_embeddings=MAX_POSITIONS,
                      source_max_positions=MAX_POSITIONS, pad_token_id=PAD, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, type_vocab_size=1)
        if method in ("tape", "rope"):
            config = LongBirdConfig(attention="full", position="tape", tape_init="rope", **common)
        elif method == "bialibi":
            # Query block i sees blocks 0, i-1, i, i+1: with at most 3 blocks that is every key (full attention).
            config = LongBirdConfig(attention="littlebird", position="bialibi", block_size=BIALIBI_BLOCK, pack_size=0,
                                    **common)
        else:
            config = LongBirdConfig(attention="full", position="absolute", **common)
        self.encoder = LongBirdModel(config)
        self.classifier = nn.Linear(config.hidden_size, 10)
        if method == "rope":  # TAPE maps frozen at zero: the states stay the RoPE angles (TAPE without updates)
            for name, parameter in self.encoder.named_parameters():
                if name.endswith(("tape_post", "tape_ffn_in")):
                    parameter.requires_grad_(False).zero_()

    def forward(self, ids, mask):
        return self.classifier(self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state)


def train(method: str, seed: int, args) -> tuple[AdditionModel, list[tuple[int, float]], float]:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = AdditionModel(method)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.learning_rate, total_steps=args.steps,
                                                   pct_start=0.1)
    curve, started = [], time.time()
    model.train()
    for step in range(1, args.steps + 1):
        examples = [example(rng, rng.randint(1, args.train_digits), rng.randint(1, args.train_digits))
                    for _ in range(args.batch_size)]
        ids, mask, targets = batch_of(examples)
        logits = model(ids, mask)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 0:
            curve.append((step, loss.item()))
    return model, curve, time.time() - started


@torch.no_grad()
def accuracy_grid(model: AdditionModel, args, seed: int) -> tuple[list[list[float]], list[list[float]]]:
    """Exact-match accuracy (%) of the whole sum, and per-digit accuracy (%), for every (digits of a, digits of b) in
    1..2 x train digits."""
    model.eval()
    top = 2 * args.train_digits
    rng = random.Random(1000 + seed)  # evaluation samples differ from training draws
    grid, digit_grid = [], []
    for digits_a in range(1, top + 1):
        row, digit_row = [], []
        for digits_b in range(1, top + 1):
            examples = [example(rng, digits_a, digits_b) for _ in range(args.eval_samples)]
            ids, mask, targets = batch_of(examples)
            predicted = model(ids, mask).argmax(-1)
            answer = targets != -100
            correct = ((predicted == targets) | ~answer).all(-1)
            row.append(100.0 * float(correct.float().mean()))
            digit_row.append(100.0 * float((predicted == targets)[answer].float().mean()))
        grid.append(row)
        digit_grid.append(digit_row)
    return grid, digit_grid


def summarise(grid: list[list[float]], digit_grid: list[list[float]], train_digits: int) -> dict:
    def means(values):
        inside = [values[a][b] for a in range(train_digits) for b in range(train_digits)]
        beyond = [values[a][b] for a in range(len(values)) for b in range(len(values)) if max(a, b) >= train_digits]
        return sum(inside) / len(inside), sum(beyond) / len(beyond)

    (inside, beyond), (digits_inside, digits_beyond) = means(grid), means(digit_grid)
    return {"in_distribution": inside, "beyond": beyond, "digits_in_distribution": digits_inside,
            "digits_beyond": digits_beyond, "equal_lengths": [grid[n][n] for n in range(len(grid))]}


def write(results: dict, out: Path) -> None:
    write_file_atomically(out / "e6_tape.json", json.dumps(results, indent=2) + "\n")
    s = results["settings"]
    lines = [f"Command: `{results['command']}`  ",
             f"Encoder from scratch (4 layers, 64 hidden, 4 heads), {s['steps']} steps x batch {s['batch_size']}, "
             f"AdamW lr {s['learning_rate']:g} (one-cycle), operands of 1..{s['train_digits']} digits in training, "
             f"1..{2 * s['train_digits']} in evaluation ({s['eval_samples']} samples per pair of lengths); "
             f"{results['wall_seconds'] / 60:.0f} min wall, {torch.get_num_threads()} CPU threads.", "",
             "Exact-match accuracy (%), mean ± spread (min–max) over seeds:", "",
             "| method | seeds | exact, in distribution (both ≤ train) | exact, beyond (either > train) "
             "| digits, in distribution | digits, beyond | train min per run |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for method in METHODS:
        runs = results["runs"].get(method, {})
        if not runs:
            continue
        cells = [[r["summary"][key] for r in runs.values()]
                 for key in ("in_distribution", "beyond", "digits_in_distribution", "digits_beyond")]
        minutes = sum(r["train_seconds"] for r in runs.values()) / len(runs) / 60
        cell = lambda v: f"{sum(v) / len(v):.1f} ({min(v):.1f}–{max(v):.1f})"  # noqa: E731
        lines.append(f"| {method} | {len(runs)} | " + " | ".join(cell(v) for v in cells) + f" | {minutes:.1f} |")
    top = 2 * s["train_digits"]
    lines += ["", "Equal operand lengths (a and b both n digits), mean over seeds:", "",
              "| method | " + " | ".join(str(n) for n in range(1, top + 1)) + " |", "|---|" + "---:|" * top]
    for method in METHODS:
        runs = results["runs"].get(method, {})
        if runs:
            mean = [sum(r["summary"]["equal_lengths"][n] for r in runs.values()) / len(runs) for n in range(top)]
            lines.append(f"| {method} | " + " | ".join(f"{v:.0f}" for v in mean) + " |")
    write_file_atomically(out / "e6_tape.md", "\n".join(lines) + "\n")
    plot(results, out / "e6_tape.png")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in METHODS if results["runs"].get(m)]
    figure, axes = plt.subplots(2, len(methods), figsize=(4 * len(methods), 7.5), squeeze=False)
    train_digits = results["settings"]["train_digits"]
    for row, (key, label) in enumerate((("grid", "whole sum exact (%)"), ("digit_grid", "digits right (%)"))):
        for axis, method in zip(axes[row], methods):
            runs = list(results["runs"][method].values())
            grid = torch.tensor([r[key] for r in runs]).mean(0)
            image = axis.imshow(grid.numpy(), origin="lower", vmin=0, vmax=100, cmap="viridis",
                                extent=(0.5, grid.shape[1] + 0.5, 0.5, grid.shape[0] + 0.5))
            axis.axhline(train_digits + 0.5, color="white", linewidth=1)
            axis.axvline(train_digits + 0.5, color="white", linewidth=1)
            axis.set_title(f"{method} ({len(runs)} seeds): {label}", fontsize=9)
            axis.set_xlabel("digits of b")
            axis.set_ylabel("digits of a")
        figure.colorbar(image, ax=axes[row].tolist(), label=label)
    figure.suptitle("E6: addition, trained on ≤ %d digits (white lines), tested to %d" % (train_digits,
                                                                                        2 * train_digits))
    save_figure_atomically(figure, path)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--train-digits", type=int, default=5)
    parser.add_argument("--eval-samples", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--resume", action="store_true", help="Keep the runs already in --out")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    args = parser.parse_args()
    if 2 * args.train_digits * 2 + 5 > 3 * BIALIBI_BLOCK:
        raise SystemExit(f"--train-digits {args.train_digits}: the bialibi model's 3 blocks of {BIALIBI_BLOCK} would not "
                         "cover the longest evaluation input; raise BIALIBI_BLOCK")
    command = "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])
    started = time.time()
    results = {"command": command, "settings": {k: v for k, v in vars(args).items() if k not in ("out", "resume")},
               "runs": {}}
    previous = args.out / "e6_tape.json"
    if args.resume and previous.exists():
        old = json.loads(previous.read_text())
        results["runs"], results["command"] = old["runs"], old["command"] + " && " + command
        started -= old["wall_seconds"]
    for seed in args.seeds:  # seeds outermost: an interrupted run still has every method for the seeds done
        for method in args.methods:
            if str(seed) in results["runs"].get(method, {}):
                continue
            model, curve, seconds = train(method, seed, args)
            grid, digit_grid = accuracy_grid(model, args, seed)
            results["runs"].setdefault(method, {})[str(seed)] = {
                "grid": grid, "digit_grid": digit_grid, "summary": summarise(grid, digit_grid, args.train_digits),
                "curve": curve, "train_seconds": seconds,
                "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)}
            results["wall_seconds"] = time.time() - started
            summary = results["runs"][method][str(seed)]["summary"]
            print(f"{method} seed {seed}: in {summary['in_distribution']:.1f} beyond {summary['beyond']:.1f} "
                  f"({seconds / 60:.1f} min)", flush=True)
            write(results, args.out)


if __name__ == "__main__":
    main()
