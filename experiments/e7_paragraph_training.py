"""Train the paragraph layout (E7 round 20, `e7_paragraph_layout.py`) on training-side articles for a CPU budget.

The reader starts from the paragraph reader and sees each training question over its article laid out by paragraphs
(`--variant`, default `question-global`: the question read once, global, each paragraph a segment at the paragraph
reader's positions). The loss is what decoding ranks by, as in rounds 4 and 10: the start loss per segment (each
segment's softmax over its null and its tokens; the answer's segment targets the gold start, every other its null:
`region_losses.regional_start_loss`), `--ranking-weight` of it replaced by the cross-segment ranking term
(`region_losses.cross_region_ranking_loss`: one softmax over every token's null-relative score), and the end loss given the
gold start (the conditional head, teacher-forced). `--segments K` trains on the answer's segment and K − 1 others of
its article in article order, drawn at random (seeded) or, with `--distractors bm25`, the K − 1 its question's words
match best, instead of the whole article (0): K segments cost what K windows cost, so a budget buys more questions.
`--carry` reads each segment on over the article's following text (`paragraph_layout`'s carry); the carried tokens
are outside every softmax of the loss. AdamW, word embeddings frozen (the `finetune-qa` defaults E7's rows use), bf16
autocast where native, for `--cpu-minutes` of process CPU time (all threads). The learning rate is constant, or with
`--lr-schedule linear` falls linearly from `--learning-rate` to 0 over the CPU budget (`finetune-qa`'s linear
schedule, measured in CPU time because the budget is): started at the rate a sliding run's linear schedule had reached
at its checkpoint, the layout phase finishes that run's schedule (E7 round 29).
Questions whose answer no segment holds whole are skipped.

The model is saved with a `longbird_finetune.json` that records the data, the split and the budget, so the reading
script's held-out check (`require_trained_apart`) reads it like any other row.

Usage: python experiments/e7_paragraph_training.py --reader qa-model/kobigbird-e5-korquad --cpu-minutes 30 \\
           --out experiments/runs/e7_round20/paragraph-global
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import time
from pathlib import Path

import torch
from rank_bm25 import BM25Okapi

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e7_long_reading import machine, wants_bf16  # noqa: E402
from e7_paragraph_cuts import DATA, article_paragraphs  # noqa: E402
from e7_paragraph_layout import VARIANTS, SegmentPlan, masked, paragraph_layout  # noqa: E402

from longbird.checkpoints import load_task_model  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.files import write_directory_atomically  # noqa: E402
from longbird.heads import IGNORE_INDEX, LongBirdForQuestionAnswering, cross_region_ranking_loss, regional_start_loss  # noqa: E402
from longbird.precision import bf16_autocast  # noqa: E402
from longbird.tasks.qa import question_limit  # noqa: E402

WINDOW, STRIDE = 512, 128  # the paragraph reader's window and stride


def layout_loss(model, layout, variant: str, ranking_weight: float) -> torch.Tensor:
    """The training loss of one labelled layout (module docstring)."""
    feature = layout.feature
    inputs = {"input_ids": torch.tensor([feature.input_ids]), "position_ids": torch.tensor([feature.position_ids])}
    starts, ends = torch.tensor([feature.start_position]), torch.tensor([feature.end_position])
    # Labelled for the teacher-forced end logits; the head's own loss (one softmax over the sequence) is not used.
    # Passing region_nulls would have it take the regional loss over a bound of l/2 regions (no qa_null_every).
    with masked(model, SegmentPlan.of(layout.groups, variant)):
        out = model(**inputs, start_positions=starts, end_positions=ends)
    region_nulls = torch.tensor([feature.region_nulls])
    valid = ~torch.tensor([layout.carried])  # carried context is read, never an answer: outside every softmax
    start = regional_start_loss(out.start_logits, region_nulls, valid, starts)
    if ranking_weight:
        start = (1 - ranking_weight) * start + ranking_weight * cross_region_ranking_loss(
            out.start_logits, region_nulls, valid, starts)
    end = torch.nn.functional.cross_entropy(out.end_logits.float(), ends, ignore_index=IGNORE_INDEX)
    return (start + end) / 2


def chosen_segments(spans: list[tuple[int, int]], answer: tuple[int, int], count: int,
                    generator: random.Random, lexical: list[float] | None = None) -> list[tuple[int, int]]:
    """The paragraph holding the answer's start and `count` − 1 others, in article order (all of them when `count` is
    0 or covers the article). The others are drawn at random, or, given `lexical` (a score per paragraph), are the
    highest-scoring ones (ties to the earlier paragraph): the distractors a reader must rank the answer above."""
    if not count or count >= len(spans):
        return spans
    own = next(i for i, (low, high) in enumerate(spans) if low <= answer[0] < high)
    candidates = [i for i in range(len(spans)) if i != own]
    if lexical is None:
        others = generator.sample(candidates, count - 1)
    else:
        others = sorted(candidates, key=lambda i: -lexical[i])[:count - 1]  # sorted() is stable: ties keep order
    return [spans[i] for i in sorted([own, *others])]


def paragraph_scores(tokenizer, question: str, context: str, spans: list[tuple[int, int]]) -> list[float]:
    """BM25 of the question's distinct tokens against each paragraph of its article (the model tokenizer's ids, IDF
    over the article's paragraphs: rank_bm25's `BM25Okapi`, as `longbird.data.window_groups.lexical_order` ranks a
    question's windows for the BM25 distractors of round 14)."""
    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    return BM25Okapi([ids(context[low:high]) for low, high in spans]).get_scores(
        list(dict.fromkeys(ids(question)))).tolist()


def scheduled_learning_rate(peak: float, spent: float, budget: float, schedule: str) -> float:
    """The learning rate after `spent` of `budget` CPU seconds: `peak` throughout (constant) or falling linearly to 0
    at the end of the budget (linear; never below 0 when the last update overshoots)."""
    if schedule == "constant":
        return peak
    if schedule == "linear":
        return peak * max(0.0, 1.0 - spent / budget)
    raise ValueError(f"unknown learning-rate schedule {schedule!r}: use 'constant' or 'linear'")


def save(model, tokenizer, args, out: Path, cpu: float, bf16: bool, progress: dict,
         budget_minutes: float | None = None) -> None:
    """Save the model with the `longbird_finetune.json` the reading script's held-out check reads; a checkpoint taken
    on the way (`--save-at`) records the budget it stands for and the run's command."""
    model.eval()
    record = {"task": "qa", "data": "data/korquad/KorQuAD_v1.0_dev.json", "format": "korquad1-articles",
              "split": "train", "window_length": WINDOW, "doc_stride": STRIDE, "started_from": str(args.reader),
              "command": "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "machine": machine(),
              "layout": {"variant": args.variant, "segments": args.segments, "distractors": args.distractors,
                         "ranking_weight": args.ranking_weight, "carry": args.carry},
              "settings": {"learning_rate": args.learning_rate, "lr_schedule": args.lr_schedule,
                           "questions_per_update": args.questions_per_update,
                           "seed": args.seed, "bf16": bf16},
              "cpu_budget_minutes": args.cpu_minutes if budget_minutes is None else budget_minutes,
              "cpu_seconds": cpu, **progress}

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        (directory / "longbird_finetune.json").write_text(json.dumps(record, indent=1), encoding="utf-8")

    write_directory_atomically(out, write, overwrite=True)  # a kill mid-save leaves no half-written checkpoint
    print(json.dumps({k: v for k, v in record.items() if k not in ("loss_curve", "machine")}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", type=Path, required=True, help="The paragraph reader (make qa-model)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variant", choices=VARIANTS, default="question-global")
    parser.add_argument("--cpu-minutes", type=float, default=30.0)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--lr-schedule", choices=("constant", "linear"), default="constant",
                        help="constant, or linear: from --learning-rate down to 0 at the end of --cpu-minutes")
    parser.add_argument("--questions-per-update", type=int, default=4)
    parser.add_argument("--ranking-weight", type=float, default=0.5)
    parser.add_argument("--segments", type=int, default=4, help="Segments per training question (0: the article)")
    parser.add_argument("--distractors", choices=("random", "bm25"), default="random",
                        help="With --segments K: the K - 1 paragraphs beside the answer's drawn at random, or the "
                             "ones the question's words match best (BM25)")
    parser.add_argument("--carry", action="store_true",
                        help="Each segment that fits a window reads on over the article's following text as context "
                             "(paragraph_layout's carry; read the model with e7_paragraph_layout.py --carry)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    parser.add_argument("--save-at", type=float, nargs="*", default=[], metavar="CPU_MINUTES",
                        help="Also save the model when the budget spent passes each of these CPU minutes, under "
                             "OUT-<minutes>min (one run gives the points of a learning curve)")
    args = parser.parse_args()
    if any(not 0 < minutes < args.cpu_minutes for minutes in args.save_at):
        parser.error(f"--save-at takes CPU minutes between 0 and --cpu-minutes ({args.cpu_minutes:g}), "
                     f"got {args.save_at}")
    bf16 = wants_bf16(args.precision)
    window, stride = WINDOW, STRIDE
    torch.manual_seed(args.seed)
    rows, _ = read_korquad_v1_articles(DATA)
    train = list(split_by_title(rows)["train"])
    random.Random(args.seed).shuffle(train)
    paragraphs = {title: [span for span, _ in spans] for title, spans in article_paragraphs(DATA).items()}
    model, tokenizer = load_task_model(args.reader, LongBirdForQuestionAnswering)
    model.train()
    model.get_input_embeddings().weight.requires_grad_(False)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=args.learning_rate, weight_decay=0.01)
    cap = question_limit(model, tokenizer, window)
    generator = random.Random(args.seed)
    budget, started = args.cpu_minutes * 60, time.process_time()
    updates, questions, skipped, tokens, pending, curve, losses = 0, 0, 0, 0, 0, [], []
    checkpoints = sorted(args.save_at)
    while time.process_time() - started < budget:
        for row in train:
            if time.process_time() - started >= budget:
                break
            begin = row["answers"]["answer_start"][0]
            answer = (begin, begin + len(row["answers"]["text"][0]))
            article = paragraphs[row["title"]]
            lexical = (paragraph_scores(tokenizer, row["question"], row["context"], article)
                       if args.distractors == "bm25" and 0 < args.segments < len(article) else None)
            spans = chosen_segments(article, answer, args.segments, generator, lexical)
            layout = paragraph_layout(tokenizer, row["id"], row["question"], row["context"], spans, args.variant,
                                      window, stride, cap, answer, carry=args.carry)
            if not layout.feature.start_position:
                skipped += 1
                continue
            with bf16_autocast("cpu", bf16):
                loss = layout_loss(model, layout, args.variant, args.ranking_weight)
            (loss / args.questions_per_update).backward()
            losses.append(float(loss.detach()))
            questions += 1
            tokens += len(layout.feature.input_ids)
            pending += 1
            if pending == args.questions_per_update:
                rate = scheduled_learning_rate(args.learning_rate, time.process_time() - started, budget,
                                               args.lr_schedule)
                for group in optimizer.param_groups:
                    group["lr"] = rate
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                updates, pending = updates + 1, 0
                spent = time.process_time() - started
                while checkpoints and spent >= checkpoints[0] * 60:
                    minutes, saving = checkpoints.pop(0), time.process_time()
                    save(model, tokenizer, args, args.out.with_name(f"{args.out.name}-{minutes:g}min"), spent, bf16,
                         {"updates": updates, "questions": questions, "skipped": skipped, "tokens_seen": tokens,
                          "loss_curve": list(curve)}, budget_minutes=minutes)
                    model.train()
                    started += time.process_time() - saving  # the budget counts training, not saving
                if updates % 10 == 0 or updates <= 3:
                    curve.append((updates, sum(losses[-40:]) / len(losses[-40:])))
                    print(f"update {updates}: loss {curve[-1][1]:.3f}, lr {rate:.3g}, {questions} questions, "
                          f"{tokens} tokens, {(time.process_time() - started) / 60:.1f} CPU min", flush=True)
    save(model, tokenizer, args, args.out, time.process_time() - started, bf16,
         {"updates": updates, "questions": questions, "skipped": skipped, "tokens_seen": tokens, "loss_curve": curve})


if __name__ == "__main__":
    main()
