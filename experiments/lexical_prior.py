"""The lexical prior (lexical_prior.py) on whole articles: does BM25 of the passage around a span rank places better?

Each reader reads two sets of held-out questions once, in its windows (E7's reading: null-relative scoring), and
every setting of the prior re-ranks the same window candidates (`qa.rank_answers`, no second model pass):
- **validation**: dev-side questions outside E7's test articles (`e7_conversion_probe.validation_rows`), which
  *choose* each reader's radius and weight (the best mean F1 on its validation questions; ties: the smaller weight);
- **test**: E7's test articles (`e7_long_reading.draw_dev_articles`), read with no prior, with the reader's own
  chosen setting and with the library's default (`lexical_prior.DEFAULT_RADIUS`, `DEFAULT_WEIGHT`), each with its
  95 % bootstrap interval and the paired difference against the same reader without the prior. The test questions
  never choose anything.
Both sets are asserted held out from every reader's training record and, by title and text hash, from the train side
(the JSON's `held_out`).

Usage: python experiments/lexical_prior.py --reader qa-model/kobigbird-e5-korquad \\
           [--model NAME=DIR:WINDOW:STRIDE ...] [--validation-questions 300] [--name lexical_prior]
Without --model the paragraph reader itself is read in sliding 512-token windows (stride 128).
Writes experiments/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e4_korquad_articles import BUCKETS  # noqa: E402
from e7_conversion_probe import validation_rows  # noqa: E402
from e7_diagnosis import model_specs, near_features, trained_apart  # noqa: E402
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
from longbird.lexical_prior import DEFAULT_RADIUS, DEFAULT_WEIGHT, LexicalPrior  # noqa: E402
from longbird.metrics.intervals import bucket_summary  # noqa: E402
from longbird.precision import bf16_autocast, store_encoder_linears_in  # noqa: E402
from longbird.qa import DEFAULT_SCORING, merge_windows, row_features, score_windows  # noqa: E402
from longbird.tasks.qa import per_question_scores, question_limit  # noqa: E402

RADII = (32, 64, 128, 256)
WEIGHTS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)


def read_windows(model, tokenizer, rows, window: int, stride: int, bf16: bool, near: bool = False):
    """Every window's candidates for `rows` (one model pass) and each question's document. `near`: only the windows
    holding part of each answer's 512-token neighbourhood, starts allowed only there (`e7_diagnosis.near_features`)."""
    features, documents = row_features(model, tokenizer, rows, window, stride,
                                       max_question_tokens=question_limit(model, tokenizer, window))
    allowed = None
    if near:
        features, allowed = near_features(features, rows)
    with bf16_autocast("cpu", bf16):
        windows = score_windows(model, features, batch_size=8, progress=True, start_candidates=allowed)
    return windows, documents


def scores_with(windows, documents, rows, prior: LexicalPrior | None) -> dict[str, dict]:
    answers = merge_windows(windows, documents, DEFAULT_SCORING, prior)
    predictions = {row["id"]: answers[row["id"]].text if row["id"] in answers else "" for row in rows}
    return per_question_scores(predictions, rows, "korquad1-articles")


def scores_by_setting(windows, documents, rows, special_ids: frozenset[int]) -> dict[str, dict[str, dict]]:
    """Per-question scores of one reading without the prior ("none") and under every radius:weight of the grid
    (`RADII` x `WEIGHTS`, "radius:weight" keys by weight then radius): what cross-fitting chooses from."""
    settings = ["none"] + [f"{r}:{w}" for w in sorted(WEIGHTS) if w != 0 for r in RADII]
    return {key: scores_with(windows, documents, rows, None if key == "none" else
                             LexicalPrior(float(key.split(":")[1]), int(key.split(":")[0]), special_ids))
            for key in settings}


def mean_f1(scores: dict[str, dict]) -> float:
    return sum(s["f1"] for s in scores.values()) / len(scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", type=Path, required=True, help="The paragraph reader E7 started from")
    parser.add_argument("--model", action="append", default=[], help="NAME=DIR:WINDOW:STRIDE (repeatable)")
    parser.add_argument("--validation-questions", type=int, default=300)
    parser.add_argument("--radii", type=int, nargs="+", default=list(RADII))
    parser.add_argument("--weights", type=float, nargs="+", default=list(WEIGHTS))
    add_output_arguments(parser, "lexical_prior")
    args = parser.parse_args()
    bf16 = wants_bf16(args.precision)
    models = {}
    for name, (directory, window, stride, flags) in model_specs(
            args.model or [f"paragraph-reader={args.reader}:512:128"]).items():
        if flags:
            raise SystemExit(f"--model {name}: the diagnosis flags ({', '.join(sorted(flags))}) do not apply here")
        models[name] = (directory, window, stride)
    rows, _ = read_korquad_v1_articles(ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json")
    split = split_by_title(rows)
    _, tokenizer = load_task_model(args.reader, LongBirdForQuestionAnswering)
    test, buckets = draw_dev_articles(split["dev"], tokenizer, 300, 150)
    validation = validation_rows(split["dev"], set(test["title"]), args.validation_questions)
    assert not set(validation["title"]) & set(test["title"]), "validation and test share an article"
    for directory in [args.reader] + [d for d, *_ in models.values() if (d / "longbird_finetune.json").exists()]:
        trained_apart(directory, set(split["dev"]["title"]))
    sides = {"validation": validation, "test": test}
    results = {"command": "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "machine": machine(),
               "bf16": bf16, "held_out": {side: held_out_record(split["train"], rows) for side, rows in sides.items()},
               "validation_titles": sorted(set(validation["title"])), "test_titles": sorted(set(test["title"])),
               "questions": {side: len(rows) for side, rows in sides.items()}, "readers": {}}
    settings = [(radius, weight) for radius in args.radii for weight in args.weights if weight != 0]
    default = f"{DEFAULT_RADIUS}:{DEFAULT_WEIGHT}"
    for name, (directory, window, stride) in models.items():
        model, model_tokenizer = load_task_model(directory, LongBirdForQuestionAnswering)
        if bf16:
            store_encoder_linears_in(model)
        special = frozenset(model_tokenizer.all_special_ids)
        entry = {"model": str(directory), "window": window, "stride": stride, "validation": {}, "test": {}}
        read = {}
        for side, rows in sides.items():
            started = time.process_time()
            read[side] = read_windows(model, model_tokenizer, rows, window, stride, bf16)
            entry[f"{side}_cpu_seconds"] = time.process_time() - started
        base = {side: scores_with(*read[side], rows, None) for side, rows in sides.items()}
        entry["validation"]["none"] = mean_f1(base["validation"])
        for radius, weight in settings:
            prior = LexicalPrior(weight, radius, special)
            entry["validation"][f"{radius}:{weight}"] = mean_f1(scores_with(*read["validation"], validation, prior))
            print(name, radius, weight, round(entry["validation"][f"{radius}:{weight}"], 2), flush=True)
        best = max(entry["validation"].values())  # the reader's own choice, on its validation questions
        entry["chosen"] = next(key for key in ["none"] + [f"{r}:{w}" for r, w in sorted(settings, key=lambda s: s[1])]
                               if entry["validation"][key] == best)
        for key in dict.fromkeys(["none", entry["chosen"], default]):
            if key == "none":
                scores = base["test"]
            else:
                radius, weight = key.split(":")
                scores = scores_with(*read["test"], test, LexicalPrior(float(weight), int(radius), special))
            entry["test"][key] = {"summary": bucket_summary(scores, buckets, BUCKETS, base["test"]),
                                  "per_question": scores}
        results["readers"][name] = entry
        write_tables(args.out, args.name, results, table(results, default))


def interval(summary: dict) -> str:
    return f"{summary['f1']:.1f} ({summary['f1_interval'][0]:.1f}–{summary['f1_interval'][1]:.1f})"


def difference(summary: dict) -> str:
    diff = summary["f1_vs_baseline"]
    return f"{diff['difference']:+.1f} ({diff['low']:+.1f} to {diff['high']:+.1f})"


def table(results: dict, default: str) -> list[str]:
    lines = provenance(results) + [
        f"Validation: {results['questions']['validation']} dev-side questions outside E7's test articles (each "
        f"reader's radius:weight chosen there); test: E7's {results['questions']['test']} test questions "
        f"({'bf16 autocast' if results['bf16'] else 'fp32'}), read without the prior, with the reader's choice and "
        f"with the library default ({default}). The prior adds weight × BM25 of the 2·radius document tokens around "
        "a span's start to its null-relative score. Differences are paired against the same reader without it.", "",
        "| reader | validation F1: none → chosen | test F1, none | test, chosen | chosen − none (95 % CI) | "
        "first 512 / beyond 512, chosen | test, default | default − none (95 % CI) |",
        "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, entry in results["readers"].items():
        validation, chosen = entry["validation"], entry["chosen"]
        none, own, by_default = (entry["test"][key]["summary"] for key in ("none", chosen, default))
        lines.append(f"| {name} ({entry['window']} / {entry['stride']}) | {validation['none']:.1f} → "
                     f"{validation[chosen]:.1f} ({chosen}) | {interval(none['all'])} | {interval(own['all'])} | "
                     f"{difference(own['all'])} | " + " / ".join(f"{own[b]['f1']:.1f}" for b in BUCKETS) +
                     f" | {interval(by_default['all'])} | {difference(by_default['all'])} |")
    for name, entry in results["readers"].items():
        radii = sorted({key.split(":")[0] for key in entry["validation"] if key != "none"}, key=int)
        weights = sorted({key.split(":")[1] for key in entry["validation"] if key != "none"}, key=float)
        lines += ["", f"{name}: validation F1 by radius (rows) and weight (columns); no prior "
                      f"{entry['validation']['none']:.1f}:", "",
                  "| radius | " + " | ".join(weights) + " |", "|---:|" + "---:|" * len(weights)]
        for radius in radii:
            lines.append(f"| {radius} | " + " | ".join(f"{entry['validation'].get(f'{radius}:{w}', float('nan')):.1f}"
                                                       for w in weights) + " |")
    return lines


if __name__ == "__main__":
    main()
