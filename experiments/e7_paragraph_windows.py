"""Windows that start where paragraphs start: the whole article read without cutting a paragraph (E7 round 19).

Round 19's decomposition (`e7_paragraph_cuts.py`) found that reading an answer in the article's sliding windows
costs 2.1 F1 against reading it in windows that start where its paragraph starts (the text after the paragraph costs
0.3). This script reads the whole article that way, without knowing where the answer is: for every paragraph of the
article, the windows the paragraph alone would get (`e7_paragraph_cuts.first_windows`: the first 512-token window from
its start, more at stride 128 only while the paragraph is longer), filled with the text after it, with answer starts
allowed only inside that paragraph, so every article token is scored in a window that starts at its paragraph's start.
Spans are then ranked across all windows as the sliding reading ranks them (null-relative, `qa.DEFAULT_SCORING`),
without and with the library's lexical prior, and paired over articles with round 18's sliding readings of the same
model (`--whole-from`, used only when this run's near reading reproduces that file's per question).

Usage: python experiments/e7_paragraph_windows.py --reader qa-model/kobigbird-e5-korquad \\
           [--whole-from experiments/results/e7_all_dev_near.json] [--name e7_paragraph_windows]
Writes experiments/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e4_korquad_articles import BUCKETS, answer_buckets  # noqa: E402
from e7_diagnosis import trained_apart  # noqa: E402
from e7_long_reading import add_output_arguments, held_out_record, machine, provenance, wants_bf16, write_tables  # noqa: E402
from e7_paragraph_cuts import DATA, article_paragraphs, first_windows, sliding_readings  # noqa: E402
from lexical_prior import mean_f1, scores_with  # noqa: E402

from longbird.checkpoints import load_task_model  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.lexical_prior import DEFAULT_RADIUS, DEFAULT_WEIGHT, LexicalPrior  # noqa: E402
from longbird.metrics.intervals import bucket_summary  # noqa: E402
from longbird.precision import bf16_autocast, store_encoder_linears_in  # noqa: E402
from longbird.qa import row_features, score_windows  # noqa: E402
from longbird.tasks.qa import question_limit  # noqa: E402


def paragraph_windows(featurize, rows, paragraphs: dict[str, list[tuple[int, int]]], stride: int) -> tuple[list, list]:
    """Every question's windows, one run of `first_windows` per paragraph of its article, offsets moved back into
    the whole article (so the article's document decodes them and the lexical prior reads them), with the starts
    each allows. `featurize(rows, stride)`: the windows of rows (`qa.row_features` at the reader's window)."""
    features, allowed = [], []
    for row in rows:
        for low, high in paragraphs[row["title"]]:
            kept, masks = first_windows(featurize([{**row, "context": row["context"][low:]}], stride),
                                        {row["id"]: high - low})
            features += [dataclasses.replace(f, offsets=[None if o is None else (o[0] + low, o[1] + low)
                                                         for o in f.offsets]) for f in kept]
            allowed += masks
    return features, allowed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", type=Path, required=True, help="The paragraph reader (make qa-model)")
    parser.add_argument("--whole-from", type=Path, default=ROOT / "experiments" / "results" / "e7_all_dev_near.json",
                        help="An e7_all_dev.py results file of the same reader: its sliding readings")
    add_output_arguments(parser, "e7_paragraph_windows")
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
    buckets = answer_buckets(dev, tokenizer)
    article_of = {row["id"]: row["title"] for row in dev}
    sliding, near_check = sliding_readings(model, tokenizer, dev, args.whole_from, window, stride, bf16)
    dev_titles = set(article_of.values())
    paragraphs = {title: [span for span, _ in spans] for title, spans in article_paragraphs(DATA).items()
                  if title in dev_titles}
    started = time.process_time()
    cap = question_limit(model, tokenizer, window)
    _, documents = row_features(model, tokenizer, dev, window, stride, max_question_tokens=cap)
    windows, allowed = paragraph_windows(
        lambda rows, step: row_features(model, tokenizer, rows, window, step, max_question_tokens=cap)[0],
        dev, paragraphs, stride)
    with bf16_autocast("cpu", bf16):
        candidates = score_windows(model, windows, batch_size=8, progress=True, start_candidates=allowed)
    cpu_seconds = time.process_time() - started
    special = frozenset(tokenizer.all_special_ids)
    scores = {"none": scores_with(candidates, documents, dev, None),
              "default": scores_with(candidates, documents, dev,
                                     LexicalPrior(DEFAULT_WEIGHT, DEFAULT_RADIUS, special))}
    results = {"command": "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "machine": machine(),
               "bf16": bf16, "held_out": held_out_record(split["train"], split["dev"]), "questions": len(dev),
               "articles": len(paragraphs), "paragraphs": sum(len(p) for p in paragraphs.values()),
               "window": window, "stride": stride, "windows": len(windows), "cpu_seconds": cpu_seconds,
               "bucket_sizes": {b: list(buckets.values()).count(b) for b in BUCKETS},
               "whole_from": Path(args.whole_from).resolve().relative_to(ROOT).as_posix(),
               "near_reproduced": near_check, "readings": {}}
    for reading in ("none", "default"):
        results["readings"][reading] = {
            "sliding": bucket_summary(sliding[reading], buckets, BUCKETS, None, article_of),
            "paragraph_windows": bucket_summary(scores[reading], buckets, BUCKETS, sliding[reading], article_of),
            "per_question": scores[reading]}
        print(reading, round(mean_f1(scores[reading]), 2), "sliding", round(mean_f1(sliding[reading]), 2), flush=True)
    write_tables(args.out, args.name, results, table(results))


def cell(summary: dict) -> str:
    return f"{summary['f1']:.1f} ({summary['f1_interval'][0]:.1f}–{summary['f1_interval'][1]:.1f})"


def table(results: dict) -> list[str]:
    sizes = results["bucket_sizes"]
    lines = provenance(results) + [
        f"All {results['questions']} dev-side questions of {results['articles']} articles "
        f"({', '.join(f'{b}: {n}' for b, n in sizes.items())}), the paragraph reader ({results['window']}-token "
        f"windows, {'bf16 autocast' if results['bf16'] else 'fp32'}) read whole two ways: sliding windows (stride "
        f"{results['stride']}, from `{results['whole_from']}`; this run's near reading matched it on "
        f"{results['questions'] - results['near_reproduced']['different']} of {results['questions']} questions) and "
        f"windows that start where each of the {results['paragraphs']} paragraphs starts ({results['windows']} "
        f"windows, {results['cpu_seconds'] / 60:.1f} CPU minutes), starts only inside each window's own paragraph. "
        "Intervals and the paired difference resample **articles**.", "",
        "| prior | sliding windows | paragraph windows | first 512 / beyond 512 | paragraph − sliding (95 % CI) |",
        "|---|---:|---:|---:|---:|"]
    for reading, part in results["readings"].items():
        ours = part["paragraph_windows"]
        paired = ours["all"]["f1_vs_baseline"]
        lines.append(f"| {reading} | {cell(part['sliding']['all'])} | {cell(ours['all'])} | "
                     + " / ".join(f"{ours[b]['f1']:.1f}" for b in BUCKETS if b in ours)
                     + f" | {paired['difference']:+.1f} ({paired['low']:+.1f} to {paired['high']:+.1f}) |")
    return lines


if __name__ == "__main__":
    main()
