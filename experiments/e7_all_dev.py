"""E7's readings on every dev-side article, with intervals that resample articles: what a difference of 3 F1 needs.

E7 scores 336 questions of 8 test articles with a bootstrap over questions; a rerun of one row moved it by 3.4 F1
(round 15), and questions of one article are not independent. This script reads each model once on all the dev-side
questions of the by-article split (931 questions, 28 articles; none is on the train side, asserted by title and text
hash, and every model's own record must show it never trained on one) and scores them three ways:
- **none**: no lexical prior (E7's protocol reading);
- **default**: the library's prior (`lexical_prior.DEFAULT_RADIUS`, `DEFAULT_WEIGHT`), chosen on 300 of these
  questions outside E7's test articles (round 16): a mild selection on the questions scored here, stated in the table;
- **cross-fitted**: the dev-side articles in two seeded halves; each half is read with the radius:weight that scored
  best on the other half (`lexical_prior.RADII`, `WEIGHTS`), so no question chooses its own setting;
- **near**: answer starts allowed only among the 512 article tokens around the gold answer (e7_diagnosis's *near*,
  no prior), as if the place were known: near minus default is what choosing among the article's places costs the
  shipped reading, and so the most a reader that reads the answer's neighbourhood as this one does could gain by
  ranking better (`--no-near` skips this second, shorter pass).
Every interval is a cluster bootstrap over articles (`metrics.intervals.cluster_bootstrap_interval`) and, for
comparison, the question bootstrap E7 reports; each model's paired difference against `--baseline`, read the same
way, resamples articles too.

Usage: python experiments/e7_all_dev.py --reader qa-model/kobigbird-e5-korquad \\
           [--model NAME=DIR:WINDOW:STRIDE ...] [--baseline NAME] [--name e7_all_dev]
Without --model the paragraph reader itself is read in sliding 512-token windows (stride 128).
Writes experiments/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e4_korquad_articles import BUCKETS, answer_buckets  # noqa: E402
from e7_diagnosis import model_specs, trained_apart  # noqa: E402
from e7_long_reading import (  # noqa: E402
    add_output_arguments,
    draw_dev_articles,
    held_out_record,
    machine,
    provenance,
    wants_bf16,
    write_tables,
)
from lexical_prior import mean_f1, read_windows, scores_by_setting, scores_with  # noqa: E402

from longbird.checkpoints import load_task_model  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.lexical_prior import DEFAULT_RADIUS, DEFAULT_WEIGHT  # noqa: E402
from longbird.metrics.intervals import bootstrap_interval, bucket_summary  # noqa: E402
from longbird.precision import store_encoder_linears_in  # noqa: E402

READINGS = ("none", "default", "cross-fitted", "near")


def halves(titles: list[str], seed: int) -> dict[str, int]:
    """Each article's half (0 or 1), a seeded permutation of the sorted titles cut in two."""
    ordered = sorted(titles)
    order = torch.randperm(len(ordered), generator=torch.Generator().manual_seed(seed)).tolist()
    return {ordered[index]: int(position >= len(ordered) // 2) for position, index in enumerate(order)}


def cross_fitted(by_setting: dict[str, dict[str, dict]], half_of: dict[str, int]) -> tuple[dict, dict[int, str]]:
    """Per-question scores where each half's questions take the setting that scored best on the other half (ties: the
    first setting in `by_setting`'s order, "none" first, then by weight), and the setting each half got."""
    chosen = {}
    for half in (0, 1):
        other = {key: {i: s for i, s in scores.items() if half_of[i] != half} for key, scores in by_setting.items()}
        best = max(mean_f1(scores) for scores in other.values())
        chosen[half] = next(key for key, scores in other.items() if mean_f1(scores) == best)
    merged = {i: by_setting[chosen[half_of[i]]][i] for i in next(iter(by_setting.values()))}
    return merged, chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", type=Path, required=True, help="The paragraph reader E7 started from")
    parser.add_argument("--model", action="append", default=[], help="NAME=DIR:WINDOW:STRIDE (repeatable)")
    parser.add_argument("--baseline", default=None, help="The --model NAME the others are paired against "
                                                        "(default: the first)")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the two halves of the dev-side articles")
    parser.add_argument("--no-near", action="store_true", help="Skip the near reading (a second, shorter pass)")
    add_output_arguments(parser, "e7_all_dev")
    args = parser.parse_args()
    bf16 = wants_bf16(args.precision)
    models = {}
    for name, (directory, window, stride, flags) in model_specs(
            args.model or [f"paragraph-reader={args.reader}:512:128"]).items():
        if flags:
            raise SystemExit(f"--model {name}: the diagnosis flags ({', '.join(sorted(flags))}) do not apply here")
        models[name] = (directory, window, stride)
    baseline = args.baseline or next(iter(models))
    if baseline not in models:
        raise SystemExit(f"--baseline {baseline} is not one of the --model names ({', '.join(models)})")
    rows, _ = read_korquad_v1_articles(ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json")
    split = split_by_title(rows)
    dev = split["dev"]
    _, tokenizer = load_task_model(args.reader, LongBirdForQuestionAnswering)
    for directory in [args.reader] + [d for d, *_ in models.values() if (d / "longbird_finetune.json").exists()]:
        trained_apart(directory, set(dev["title"]))
    buckets = answer_buckets(dev, tokenizer)
    article_of = {row["id"]: row["title"] for row in dev}
    half_of_title = halves(sorted(set(dev["title"])), args.seed)
    half_of = {i: half_of_title[title] for i, title in article_of.items()}
    e7_test_titles = set(draw_dev_articles(dev, tokenizer, 300, 150)[0]["title"])
    results = {"command": "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "machine": machine(),
               "bf16": bf16, "held_out": held_out_record(split["train"], dev), "questions": len(dev),
               "articles": len(half_of_title), "halves": half_of_title, "e7_test_titles": sorted(e7_test_titles),
               "bucket_sizes": {b: list(buckets.values()).count(b) for b in BUCKETS}, "baseline": baseline,
               "readers": {}}
    default = f"{DEFAULT_RADIUS}:{DEFAULT_WEIGHT}"
    per_reading = {}
    for name, (directory, window, stride) in models.items():
        model, model_tokenizer = load_task_model(directory, LongBirdForQuestionAnswering)
        if bf16:
            store_encoder_linears_in(model)
        special = frozenset(model_tokenizer.all_special_ids)
        started = time.process_time()
        windows, documents = read_windows(model, model_tokenizer, dev, window, stride, bf16)
        read_seconds = time.process_time() - started
        by_setting = scores_by_setting(windows, documents, dev, special)
        fitted, chosen = cross_fitted(by_setting, half_of)
        per_reading[name] = {"none": by_setting["none"], "default": by_setting[default], "cross-fitted": fitted}
        results["readers"][name] = {"model": str(directory), "window": window, "stride": stride,
                                    "read_cpu_seconds": read_seconds, "chosen_by_half": chosen,
                                    "mean_f1_by_setting": {key: mean_f1(s) for key, s in by_setting.items()}}
        if not args.no_near:
            started = time.process_time()
            per_reading[name]["near"] = scores_with(*read_windows(model, model_tokenizer, dev, window, stride, bf16,
                                                                  near=True), dev, None)
            results["readers"][name]["near_read_cpu_seconds"] = time.process_time() - started
            # near minus default, paired over articles, per bucket: what ranking the places costs the shipped reading
            cost = bucket_summary(per_reading[name]["near"], buckets, BUCKETS, per_reading[name]["default"],
                                  article_of)
            results["readers"][name]["ranking_cost"] = {bucket: part["f1_vs_baseline"]
                                                        for bucket, part in cost.items()}
        for reading in (reading for reading in READINGS if reading in per_reading[name]):
            scores = per_reading[name][reading]
            paired = (per_reading[baseline].get(reading) if baseline in per_reading and name != baseline
                      else None)
            results["readers"][name][reading] = {
                "summary": bucket_summary(scores, buckets, BUCKETS, paired, article_of),
                "question_bootstrap_f1": bootstrap_interval([s["f1"] for s in scores.values()]),
                "e7_test_articles_f1": mean_f1({i: s for i, s in scores.items() if article_of[i] in e7_test_titles}),
                "other_articles_f1": mean_f1({i: s for i, s in scores.items()
                                              if article_of[i] not in e7_test_titles}),
                "per_question": scores}
        print(name, {reading: round(results["readers"][name][reading]["summary"]["all"]["f1"], 2)
                     for reading in READINGS}, flush=True)
        write_tables(args.out, args.name, results, table(results, default))


def cell(summary: dict) -> str:
    return f"{summary['f1']:.1f} ({summary['f1_interval'][0]:.1f}–{summary['f1_interval'][1]:.1f})"


def table(results: dict, default: str) -> list[str]:
    sizes = results["bucket_sizes"]
    lines = provenance(results) + [
        f"All {results['questions']} dev-side questions of {results['articles']} articles "
        f"({', '.join(f'{b}: {n}' for b, n in sizes.items())}; "
        f"{'bf16 autocast' if results['bf16'] else 'fp32'}). F1 with its 95 % interval resampling **articles**; "
        "[q] the interval resampling questions, as E7 reports; E7's 8 test articles and the other 20 apart. "
        f"Readings: none (no prior), default ({default}, chosen in round 16 on 300 of these questions outside E7's "
        "test articles), cross-fitted (each half of the articles read with the setting best on the other half). "
        "near (starts only among the 512 article tokens around the gold answer, no prior): the place given. "
        f"Differences: paired against {results['baseline']} read the same way, resampling articles.", "",
        "| reader | reading | F1 (articles) | [q] | first 512 / beyond 512 | E7 test / other | − baseline (95 % CI) |",
        "|---|---|---:|---:|---:|---:|---:|"]
    for name, entry in results["readers"].items():
        for reading in (reading for reading in READINGS if reading in entry):
            part = entry[reading]
            summary = part["summary"]
            low, high = part["question_bootstrap_f1"]
            paired = summary["all"].get("f1_vs_baseline")
            difference = "" if paired is None else \
                f"{paired['difference']:+.1f} ({paired['low']:+.1f} to {paired['high']:+.1f})"
            setting = "" if reading != "cross-fitted" else \
                f" ({' / '.join(entry['chosen_by_half'][h] for h in sorted(entry['chosen_by_half']))})"
            lines.append(f"| {name} ({entry['window']} / {entry['stride']}) | {reading}{setting} | "
                         f"{cell(summary['all'])} | {low:.1f}–{high:.1f} | "
                         + " / ".join(f"{summary[b]['f1']:.1f}" for b in BUCKETS if b in summary) +
                         f" | {part['e7_test_articles_f1']:.1f} / {part['other_articles_f1']:.1f} | {difference} |")
    costs = [(name, entry["ranking_cost"]) for name, entry in results["readers"].items() if "ranking_cost" in entry]
    if costs:
        lines += ["", "What choosing among the article's places costs each reader's default reading (near − default, "
                  "paired, resampling articles): the most a better ranking could add to it.", "",
                  "| reader | all | " + " | ".join(BUCKETS) + " |", "|---|---:|" + "---:|" * len(BUCKETS)]
        for name, cost in costs:
            lines.append(f"| {name} | " + " | ".join(
                f"{cost[b]['difference']:+.1f} ({cost[b]['low']:+.1f} to {cost[b]['high']:+.1f})"
                for b in ("all",) + tuple(BUCKETS) if b in cost) + " |")
    return lines


if __name__ == "__main__":
    main()
