"""Where reading an answer inside the whole article loses against reading its own paragraph (E7 round 19).

Round 18 found the paragraph reader's *near* reading (starts only among the 512 article tokens around the gold answer,
no prior) at 77.8 F1 on all 931 dev-side questions, 2.4 below the same reader on each question's own paragraph, and
left open whether that loss lies in the sliding windows that cut across paragraphs or in the neighbouring paragraphs.
This script reads the paragraph reader (sliding 512-token windows, stride 128, no lexical prior, bf16 autocast) on the
same questions five ways, each step adding one thing the whole-article reading has and the paragraph reading lacks:
- **paragraph**: the question's own paragraph alone, as KorQuAD publishes it (the rest of each window is padding);
- **paragraph-first**: the article from the start of the question's paragraph on, in windows that start where the
  paragraph starts (the ones the paragraph alone gets, filled with the text after it instead of padding), starts
  allowed only inside the paragraph: what the text after the paragraph costs;
- **paragraph-in-article**: the article's own sliding windows (every one that holds part of the paragraph), starts
  allowed only inside the paragraph: what windows that fall anywhere across the paragraph cost;
- **near**: the same windows with starts allowed among the 512 article tokens around the answer (round 18's reading,
  `e7_diagnosis.near_features`): what the neighbouring paragraphs cost as distractors;
- **whole**: every window, every start, no prior (round 17/18's "none"); and the shipped reading with the default
  prior, both taken from `--whole-from` (round 18's results file, the same model): what ranking the places costs.
Each step is paired with the one before it over the same questions, and every interval resamples articles
(`metrics.intervals.cluster_bootstrap_interval`). `--whole-from` is only used when this run's *near* reading
reproduces that file's per question (it is read again here, so the check is a model identity check).

Usage: python experiments/e7_paragraph_cuts.py --reader qa-model/kobigbird-e5-korquad \\
           [--whole-from experiments/results/e7_all_dev_near.json] [--name e7_paragraph_cuts]
Writes experiments/results/NAME.{json,md}.
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

from e4_korquad_articles import BUCKETS, answer_buckets  # noqa: E402
from e7_diagnosis import trained_apart  # noqa: E402
from e7_long_reading import add_output_arguments, held_out_record, machine, provenance, wants_bf16, write_tables  # noqa: E402
from lexical_prior import read_windows, scores_with  # noqa: E402

from longbird.checkpoints import load_task_model  # noqa: E402
from longbird.data.korquad import WHOLE_ARTICLE_SEPARATOR, read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.data.reading import read_json_file  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.metrics.intervals import bucket_summary  # noqa: E402
from longbird.precision import bf16_autocast, store_encoder_linears_in  # noqa: E402
from longbird.qa import row_features, score_windows  # noqa: E402
from longbird.tasks.qa import question_limit  # noqa: E402

READINGS = ("paragraph", "paragraph-first", "paragraph-in-article", "near", "whole")
STEP_MEANING = {"paragraph-first": "the text after the paragraph in its windows",
                "paragraph-in-article": "windows falling anywhere across the paragraph",
                "near": "the neighbouring paragraphs (512 tokens around the answer)",
                "whole": "ranking every place of the article (no prior)"}
DATA = ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json"


def paragraph_ranges(path: Path, separator: str = WHOLE_ARTICLE_SEPARATOR) -> dict[str, tuple[int, int]]:
    """{question id: [start, end)} of its paragraph in the whole-article context, with `join_article`'s offsets."""
    return {question: span for spans in article_paragraphs(path, separator).values() for span, ids in spans
            for question in ids}


def article_paragraphs(path: Path, separator: str = WHOLE_ARTICLE_SEPARATOR) -> dict[str, list]:
    """{title: [([start, end), its question ids]] for every paragraph in order}, with `join_article`'s offsets."""
    articles = {}
    for article in read_json_file(path, "dataset file")["data"]:
        offset, spans = 0, []
        for index, paragraph in enumerate(article["paragraphs"]):
            if index:
                offset += len(separator)
            spans.append(((offset, offset + len(paragraph["context"])), [str(qa["id"]) for qa in paragraph["qas"]]))
            offset += len(paragraph["context"])
        articles[article["title"]] = spans
    return articles


def inside(features, low: int, high: int) -> list[torch.Tensor]:
    """Per window, which tokens lie inside the characters [low, high) of its document."""
    return [torch.tensor([offset is not None and offset[0] >= low and offset[1] <= high for offset in feature.offsets])
            for feature in features]


def paragraph_rows(rows, ranges) -> list[dict]:
    """Each row with its own paragraph as the context (answers shifted)."""
    out = []
    for row in rows:
        low, high = ranges[row["id"]]
        out.append({**row, "context": row["context"][low:high],
                    "answers": {"text": row["answers"]["text"],
                                "answer_start": [start - low for start in row["answers"]["answer_start"]]}})
    return out


def from_paragraph_rows(rows, ranges) -> list[dict]:
    """Each row with the article from its paragraph's start on as the context (answers shifted)."""
    out = []
    for row in rows:
        low, _ = ranges[row["id"]]
        out.append({**row, "context": row["context"][low:],
                    "answers": {"text": row["answers"]["text"],
                                "answer_start": [start - low for start in row["answers"]["answer_start"]]}})
    return out


def first_windows(features, lengths: dict[str, int]) -> tuple[list, list[torch.Tensor]]:
    """Of each question's windows over [paragraph, text after it] (in window order), the first ones until the
    paragraph's last character is covered, starts allowed only inside the paragraph (`lengths`: its characters)."""
    kept, allowed, covered = [], [], {}
    for feature in features:
        example = feature.example_id
        if covered.get(example):
            continue
        mask = inside([feature], 0, lengths[example])[0]
        if not mask.any():
            covered[example] = True
            continue
        kept.append(feature)
        allowed.append(mask)
        ends = [offset[1] for offset in feature.offsets if offset is not None]
        covered[example] = max(ends) >= lengths[example]
    return kept, allowed


def in_article_windows(features, ranges) -> tuple[list, list[torch.Tensor]]:
    """Every article window holding part of its question's paragraph, starts allowed only inside the paragraph."""
    kept, allowed = [], []
    for feature in features:
        mask = inside([feature], *ranges[feature.example_id])[0]
        if mask.any():
            kept.append(feature)
            allowed.append(mask)
    return kept, allowed


def read_restricted(model, tokenizer, rows, window: int, stride: int, bf16: bool, restrict) -> tuple:
    """One model pass over the windows `restrict(features)` keeps, with the starts it allows."""
    features, documents = row_features(model, tokenizer, rows, window, stride,
                                       max_question_tokens=question_limit(model, tokenizer, window))
    features, allowed = restrict(features)
    with bf16_autocast("cpu", bf16):
        windows = score_windows(model, features, batch_size=8, progress=True, start_candidates=allowed)
    return windows, documents, len(features)


def sliding_readings(model, tokenizer, rows, whole_from: Path, window: int, stride: int, bf16: bool):
    """({"near": this run's near reading, "none" and "default": `whole_from`'s whole sliding readings}, the check).
    The near reading is the shortest of e7_all_dev.py's passes; the file's readings are used only if this run reads
    *near* as that run did, question by question (at most 1 % of the questions apart): the same model and code."""
    near = scores_with(*read_windows(model, tokenizer, rows, window, stride, bf16, near=True), rows, None)
    readers = json.loads(Path(whole_from).read_text())["readers"]
    earlier = (readers.get("paragraph-reader") or next(iter(readers.values())))
    different = sum(abs(near[i]["f1"] - earlier["near"]["per_question"][i]["f1"]) > 1e-9 for i in near)
    if different > len(rows) // 100:
        raise SystemExit(f"{whole_from}: its near reading differs from this run's on {different} of {len(rows)} "
                         "questions, so it is not the same model; read it again with e7_all_dev.py")
    return ({"near": near, "none": earlier["none"]["per_question"], "default": earlier["default"]["per_question"]},
            {"questions": len(rows), "different": different})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", type=Path, required=True, help="The paragraph reader (make qa-model)")
    parser.add_argument("--whole-from", type=Path, default=ROOT / "experiments" / "results" / "e7_all_dev_near.json",
                        help="An e7_all_dev.py results file of the same reader: its whole-article readings")
    add_output_arguments(parser, "e7_paragraph_cuts")
    args = parser.parse_args()
    bf16 = wants_bf16(args.precision)
    window, stride = 512, 128
    rows, _ = read_korquad_v1_articles(DATA)
    split = split_by_title(rows)
    dev = list(split["dev"])
    model, tokenizer = load_task_model(args.reader, LongBirdForQuestionAnswering)
    trained_apart(args.reader, {row["title"] for row in dev})
    if bf16:
        store_encoder_linears_in(model)
    ranges = paragraph_ranges(DATA)
    for row in dev:  # the paragraph holds the question's answers (offsets as join_article shifted them)
        low, high = ranges[row["id"]]
        assert all(low <= s and s + len(t) <= high and row["context"][s:s + len(t)] == t
                   for s, t in zip(row["answers"]["answer_start"], row["answers"]["text"])), row["id"]
    buckets = answer_buckets(dev, tokenizer)
    article_of = {row["id"]: row["title"] for row in dev}
    results = {"command": "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "machine": machine(),
               "bf16": bf16, "held_out": held_out_record(split["train"], split["dev"]), "questions": len(dev),
               "articles": len(set(article_of.values())), "window": window, "stride": stride,
               "bucket_sizes": {b: list(buckets.values()).count(b) for b in BUCKETS},
               "whole_from": Path(args.whole_from).resolve().relative_to(ROOT).as_posix(),
               "readings": {}, "windows": {}, "cpu_seconds": {}}
    scores = {}
    sliding, results["near_reproduced"] = sliding_readings(model, tokenizer, dev, args.whole_from, window, stride,
                                                           bf16)
    scores = {"near": sliding["near"]}
    own = paragraph_rows(dev, ranges)
    passes = {
        "paragraph": (own, lambda features: (features, None)),
        "paragraph-first": (from_paragraph_rows(dev, ranges),
                            lambda features: first_windows(features, {r["id"]: len(r["context"]) for r in own})),
        "paragraph-in-article": (dev, lambda features: in_article_windows(features, ranges)),
    }
    for reading, (reading_rows, restrict) in passes.items():
        started = time.process_time()
        windows, documents, count = read_restricted(model, tokenizer, reading_rows, window, stride, bf16, restrict)
        results["cpu_seconds"][reading] = time.process_time() - started
        results["windows"][reading] = count
        scores[reading] = scores_with(windows, documents, reading_rows, None)
        print(reading, round(sum(s["f1"] for s in scores[reading].values()) / len(dev), 2), flush=True)
    scores["whole"], shipped = sliding["none"], sliding["default"]
    previous = None
    for reading in READINGS:
        results["readings"][reading] = {
            "summary": bucket_summary(scores[reading], buckets, BUCKETS,
                                      scores[previous] if previous else None, article_of),
            "per_question": scores[reading]}
        previous = reading
    results["shipped"] = {"summary": bucket_summary(shipped, buckets, BUCKETS, scores["paragraph"], article_of)}
    results["whole_vs_paragraph"] = bucket_summary(scores["whole"], buckets, BUCKETS, scores["paragraph"],
                                                   article_of)["all"]["f1_vs_baseline"]
    write_tables(args.out, args.name, results, table(results))


def cell(summary: dict) -> str:
    return f"{summary['f1']:.1f} ({summary['f1_interval'][0]:.1f}–{summary['f1_interval'][1]:.1f})"


def step(summary: dict) -> str:
    paired = summary.get("f1_vs_baseline")
    return "" if paired is None else f"{paired['difference']:+.1f} ({paired['low']:+.1f} to {paired['high']:+.1f})"


def table(results: dict) -> list[str]:
    sizes = results["bucket_sizes"]
    lines = provenance(results) + [
        f"All {results['questions']} dev-side questions of {results['articles']} articles "
        f"({', '.join(f'{b}: {n}' for b, n in sizes.items())}), the paragraph reader in {results['window']}-token "
        f"windows (stride {results['stride']}, {'bf16 autocast' if results['bf16'] else 'fp32'}), no lexical prior. "
        "Each reading adds one thing the whole-article reading has; the step is paired with the reading above it, "
        "F1 and every interval resampling **articles**. The whole readings from "
        f"`{results['whole_from']}` (this run's near reading matched it on "
        f"{results['questions'] - results['near_reproduced']['different']} of {results['questions']} questions).",
        "", "| reading | windows | F1 (articles) | first 512 / beyond 512 | step (95 % CI) | what the step adds |",
        "|---|---:|---:|---:|---:|---|"]
    for reading, part in results["readings"].items():
        summary = part["summary"]
        lines.append(f"| {reading} | {results['windows'].get(reading, '')} | {cell(summary['all'])} | "
                     + " / ".join(f"{summary[b]['f1']:.1f}" for b in BUCKETS if b in summary)
                     + f" | {step(summary['all'])} | {STEP_MEANING.get(reading, '')} |")
    shipped = results["shipped"]["summary"]
    lines.append(f"| whole, default prior (shipped) |  | {cell(shipped['all'])} | "
                 + " / ".join(f"{shipped[b]['f1']:.1f}" for b in BUCKETS if b in shipped)
                 + f" | {step(shipped['all'])} against paragraph | the library's prior on the whole reading |")
    total = results["whole_vs_paragraph"]
    lines += ["", f"Whole (no prior) against paragraph: {total['difference']:+.1f} "
              f"({total['low']:+.1f} to {total['high']:+.1f}), the sum of the steps."]
    return lines


if __name__ == "__main__":
    main()
