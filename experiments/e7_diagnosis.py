"""E7 diagnosis: does a reader lose on whole articles where it reads the answer, or in ranking across the article?

Every reader reads the article as in E7 (its window and stride, windows merged by null-relative scoring) twice:
- **whole**: every document token may start the answer (E7's reading);
- **near the answer**: starts allowed only among the 512 article tokens around the gold answer (255 before its
  first token to 256 after), the same characters for every reader; windows holding none of them are dropped.
"Near" measures how well a reader reads the place where the answer is (as if a retriever had found it); "whole"
minus "near" is what choosing among the article's places costs it. Sliding 512-token windows and a 4096-token
reader are compared on the same questions, overall, by answer position (first 512 / beyond, and five finer classes
of where the answer starts in the window) and by article length. A model named `DIR:WINDOW:STRIDE:dense` is read with
full attention over its whole window (the same weights, `attention="full"`): what the sparse pattern costs. A model
named `DIR:WINDOW:STRIDE:unlinked` is a linked reader (linked_windows.py) read with its windows apart: what its links
carry. A model named `DIR:WINDOW:STRIDE:no-selector` is a reader with a window selector (window_selector.py) read with
the selector's correction at zero: what the selector adds at decoding. The flags combine.

Questions: `--questions test` are E7's test articles (the draw of e7_long_reading.py, for the analysis of a finished
round), `--questions validation` the probe's validation articles (for choosing what to try next). Both sets are
asserted held out from every reader's training record and, by title and text hash, from the train side (recorded in
the JSON's `held_out`).

Usage: python experiments/e7_diagnosis.py --reader qa-model/kobigbird-e5-korquad \\
           --model sliding-512=experiments/runs/e7_round2/sliding-512:512:128 \\
           --model long=experiments/runs/e7_round2/kobigbird-long-b128q:4096:1024 [--questions test] [--name NAME]
Writes experiments/results/NAME.{json,md} (default e7_diagnosis).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e4_korquad_articles import BUCKETS, answer_positions, buckets_of  # noqa: E402
from e7_conversion_probe import validation_rows  # noqa: E402
from e7_long_reading import (  # noqa: E402
    add_output_arguments,
    draw_dev_articles,
    held_out_record,
    machine,
    provenance,
    wants_bf16,
    write_tables,
)

from longbird.checkpoints import load_task_model  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.metrics.intervals import bootstrap_interval  # noqa: E402
from longbird.precision import bf16_autocast  # noqa: E402
from longbird.qa import DEFAULT_SCORING, merge_windows, row_features, score_windows  # noqa: E402
from longbird.tasks.qa import per_question_scores, question_limit, require_trained_apart  # noqa: E402

READINGS = ("whole", "near")
NEAR_BEFORE, NEAR_AFTER = 255, 256  # article tokens kept before / after the answer's first token: 512 in all
LENGTH_CLASSES = ((0, 1024, "articles <= 1K tokens"), (1024, 10**9, "articles > 1K tokens"))
# Where the answer starts in [CLS] question [SEP] document (tokens): the first 512 split in halves, because near the
# end of the first 512 the neighbourhood reaches past the source's window (E7 round 10).
POSITION_CLASSES = ((0, 256, "answer at 0-255"), (256, 512, "256-511"), (512, 1024, "512-1023"),
                    (1024, 2048, "1024-2047"), (2048, 10**9, ">= 2048"))


def answer_neighbourhood(features, answer_start: int) -> tuple[int, int]:
    """Character range [lo, hi) of the 512 article tokens around the token holding `answer_start`, from the token
    offsets of every window of the article (windows overlap; the article's tokenization is the same in each)."""
    tokens = sorted({offset for feature in features for offset in feature.offsets if offset is not None})
    first = next((i for i, (_, end) in enumerate(tokens) if end > answer_start), len(tokens) - 1)
    return tokens[max(0, first - NEAR_BEFORE)][0], tokens[min(len(tokens) - 1, first + NEAR_AFTER)][1]


def near_candidates(features, low: int, high: int) -> list[torch.Tensor]:
    return [torch.tensor([offset is not None and offset[0] >= low and offset[1] <= high
                          for offset in feature.offsets]) for feature in features]


def near_features(features, rows) -> tuple[list, list[torch.Tensor]]:
    """The *near* reading's windows for many questions at once: of each question's windows (`features`, any order,
    grouped by example id) those holding part of the 512 article tokens around its first gold answer, each with its
    allowed starts (`near_candidates`); windows holding none of them are dropped. `rows` give the answers."""
    answer_start = {row["id"]: row["answers"]["answer_start"][0] for row in rows}
    by_question: dict[str, list] = {}
    for feature in features:
        by_question.setdefault(feature.example_id, []).append(feature)
    kept, allowed = [], []
    for example, group in by_question.items():
        for feature, mask in zip(group, near_candidates(group, *answer_neighbourhood(group, answer_start[example]))):
            if mask.any():
                kept.append(feature)
                allowed.append(mask)
    return kept, allowed


def trained_apart(directory: Path, held_titles: set[str]) -> None:
    """A CLI-trained model's own record (`require_trained_apart`), or for a row E7 trained through the Python API (its
    record says "in-memory dataset") the train titles E7's results file holds for that run."""
    try:
        require_trained_apart(directory, held_titles, root=ROOT)
        return
    except ValueError:
        results = ROOT / "experiments" / "results" / f"{directory.parent.name}.json"
        if not results.exists():
            raise
    train = set(json.loads(results.read_text())["held_out"]["train_titles"])
    leaked = train & held_titles
    if leaked:
        raise ValueError(f"{directory} was trained on held-out articles, e.g. {sorted(leaked)[:3]}")


def read(model, tokenizer, rows, window: int, stride: int, near: bool, bf16: bool) -> dict[str, str]:
    """{id: predicted text} reading every row whole or near its gold answer."""
    predictions = {}
    cap = question_limit(model, tokenizer, window)
    with bf16_autocast("cpu", bf16):
        for row in rows:
            features, documents = row_features(model, tokenizer, [row], window, stride, max_question_tokens=cap)
            allowed = None
            if near:
                features, allowed = near_features(features, [row])
            windows = score_windows(model, features, batch_size=2, start_candidates=allowed)
            answers = merge_windows(windows, documents, DEFAULT_SCORING)
            predictions[row["id"]] = answers[row["id"]].text if row["id"] in answers else ""
    return predictions


def summary(scores: dict[str, dict], groups: dict[str, list[str]]) -> dict[str, dict]:
    out = {}
    for name, ids in groups.items():
        values = [scores[i]["f1"] for i in ids]
        if values:
            low, high = bootstrap_interval(values)
            out[name] = {"questions": len(values), "f1": sum(values) / len(values), "f1_interval": [low, high]}
    return out


FLAGS = ("dense", "unlinked", "no-selector")  # what may follow DIR:WINDOW:STRIDE in --model


def model_specs(specs: list[str]) -> dict[str, tuple[Path, int, int, set[str]]]:
    """{name: (directory, window, stride, flags)} from NAME=DIR:WINDOW:STRIDE[:FLAG...] (`FLAGS`)."""
    models = {}
    for spec in specs:
        name, _, rest = spec.partition("=")
        flags = set()
        while rest.rsplit(":", 1)[-1] in FLAGS:
            rest, flag = rest.rsplit(":", 1)
            flags.add(flag)
        directory, window, stride = rest.rsplit(":", 2)
        models[name] = (Path(directory), int(window), int(stride), flags)
    return models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", type=Path, required=True, help="The paragraph reader E7 started from")
    parser.add_argument("--model", action="append", required=True,
                        help="NAME=DIR:WINDOW:STRIDE[:dense][:unlinked][:no-selector] (repeatable); ':dense' "
                             "reads with full attention over the whole window, the same weights (what the sparse "
                             "pattern costs); ':unlinked' reads a linked reader's windows apart (its gates unused); "
                             "':no-selector' reads with a window selector's correction at zero")
    parser.add_argument("--questions", choices=("test", "validation"), default="test")
    parser.add_argument("--validation-questions", type=int, default=80)
    parser.add_argument("--readings", nargs="+", choices=READINGS, default=list(READINGS),
                        help="whole, near or both (whole alone: a quick comparison of conversions)")
    add_output_arguments(parser, "e7_diagnosis")
    args = parser.parse_args()
    bf16 = wants_bf16(args.precision)
    models = model_specs(args.model)
    rows, _ = read_korquad_v1_articles(ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json")
    split = split_by_title(rows)
    _, tokenizer = load_task_model(args.reader, LongBirdForQuestionAnswering)
    test, _ = draw_dev_articles(split["dev"], tokenizer, 300, 150)
    questions = test if args.questions == "test" else validation_rows(split["dev"], set(test["title"]),
                                                                        args.validation_questions)
    # the paragraph reader, and every model with a training record of its own (a conversion read untrained has none)
    for directory in [args.reader] + [d for d, *_ in models.values() if (d / "longbird_finetune.json").exists()]:
        trained_apart(directory, set(split["dev"]["title"]))
    positions = answer_positions(questions, tokenizer)  # tokenized once: the buckets and the finer classes
    buckets = buckets_of(positions)
    lengths = {title: len(tokenizer(context, add_special_tokens=False, verbose=False)["input_ids"])
               for title, context in zip(questions["title"], questions["context"])}
    groups = {"all": list(questions["id"])}
    for bucket in BUCKETS:
        groups[bucket] = [i for i in questions["id"] if buckets[i] == bucket]
    for low, high, label in LENGTH_CLASSES:
        groups[label] = [row["id"] for row in questions if low < lengths[row["title"]] <= high]
    for low, high, label in POSITION_CLASSES:
        groups[label] = [key for key, position in positions.items() if low <= position < high]
    results = {"command": "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "machine": machine(),
               "questions": args.questions, "bf16": bf16, "articles": lengths,
               "held_out": held_out_record(split["train"], questions), "group_sizes":
               {name: len(ids) for name, ids in groups.items()}, "readers": {}}
    for name, (directory, window, stride, flags) in models.items():
        model, model_tokenizer = load_task_model(directory, LongBirdForQuestionAnswering,
                                                 **({"attention": "full"} if "dense" in flags else {}))
        if "unlinked" in flags:  # reading passes no document ids, so no row reads another (linked_windows.py)
            model.config.linked_windows = False
        if "no-selector" in flags:
            if not hasattr(model, "qa_selector"):
                raise SystemExit(f"{name}: {directory} has no window selector to read without")
            with torch.no_grad():  # c_w = 0 for every window: the spans ranked by the reader's own scores
                model.qa_selector.weight.zero_()
                model.qa_selector.bias.zero_()
        entry = {"model": str(directory), "window": window, "stride": stride, "attention": model.config.attention}
        for reading in args.readings:
            started = time.process_time()
            predictions = read(model, model_tokenizer, questions, window, stride, reading == "near", bf16)
            scores = per_question_scores(predictions, questions, "korquad1-articles")
            entry[reading] = {"summary": summary(scores, groups), "per_question": scores,
                              "cpu_seconds": time.process_time() - started}
            print(name, reading, json.dumps(entry[reading]["summary"]["all"]), flush=True)
        results["readers"][name] = entry
        write_tables(args.out, args.name, results, table(results))


def table(results: dict) -> list[str]:
    sizes = results["group_sizes"]
    positions = [label for _, _, label in POSITION_CLASSES if label in sizes]
    names = [name for name in sizes if name not in positions]
    lines = provenance(results) + [
             f"F1 on {sizes['all']} questions of E7's {results['questions']} articles "
             f"({'bf16 autocast' if results['bf16'] else 'fp32'}): *whole* reads the article as E7 does; *near* "
             "allows answer starts only among the 512 article tokens around the gold answer. Group sizes: "
             + ", ".join(f"{name} {sizes[name]}" for name in names + positions) + "."]
    for columns in (names, positions):
        if not columns:
            continue
        lines += ["", "| reader | window / stride | reading | " + " | ".join(columns) + " |",
                  "|---|---|---|" + "---:|" * len(columns)]
        for name, entry in results["readers"].items():
            # a reader of 512 tokens reads densely anyway (the full preset's sliding-512 included): no label there
            dense = ", dense" if entry.get("attention") == "full" and entry["window"] > 512 else ""
            for reading in (reading for reading in READINGS if reading in entry):
                cells = []
                for group in columns:
                    part = entry[reading]["summary"].get(group)
                    cells.append("" if part is None else f"{part['f1']:.1f} ({part['f1_interval'][0]:.1f}–"
                                                         f"{part['f1_interval'][1]:.1f})")
                lines.append(f"| {name} | {entry['window']} / {entry['stride']}{dense} | {reading} | "
                             + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    main()
