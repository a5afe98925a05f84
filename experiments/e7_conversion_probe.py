"""E7 probe: which conversion of the paragraph reader reads whole articles best *before* any long training? (issue 24)

E7's rows all convert the paragraph reader to 4096 tokens with TAPER `copy` positions and BigBird ITC at block 64
with 3 random blocks, and every such reading lost to sliding 512-token windows inside the first 512 tokens too. This
probe scores candidate conversions zero-shot (no training) so that E7's one long training budget goes to the
conversion that starts closest to the source:

- the positions beyond 512: `copy` (position 512 + k repeats k, so document tokens take the question's rows 0..63),
  `copy` from row 64 (`taper_start`: the repetitions cycle over rows 64..511 only), TAPER `exp`;
- the sparse pattern: 3 random blocks or none; block 64, 128 or 256 (a 192-, 384- or 768-token window and a
  global first block of as many tokens; the repetitions then start at the block: `taper_start` = block);
- the global blocks: BigBird ITC (first and last block read everything) or `first-reads-source` (`-q`: the first
  block's queries, the question, read the first 512 tokens as in the paragraph reader; no last global block).

Data: validation articles, the dev side of the by-article split *minus* E7's test articles (the articles E7 draws
are asserted absent, as is every train-side article), so choosing a conversion here does not look at E7's test
questions. Every conversion reads the same `--questions` questions (seeded draw); the table gives EM/F1 overall,
in the first 512 tokens and beyond with 95 % bootstrap intervals, and the CPU time of the reading.

Usage: python experiments/e7_conversion_probe.py --reader qa-model/kobigbird-e5-korquad [--questions 120]
Writes experiments/results/e7_conversion_probe.{json,md} (conversions read before by the same reader on the same
questions are kept, so `--conversions` adds rows); converted models go to experiments/runs/e7_conversion_probe/.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e4_korquad_articles import BUCKETS, answer_buckets, from_reader  # noqa: E402
from e7_long_reading import (B128Q, LONG, SOURCE_WINDOW, add_output_arguments, draw_dev_articles,  # noqa: E402
                             evaluate_method, held_out_record, machine, provenance, score_cells,
                             wants_bf16, write_tables)

from longbird.checkpoints import load_task_model  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.metrics.intervals import bucket_summary  # noqa: E402
from longbird.tasks.qa import per_question_scores, require_trained_apart  # noqa: E402

# name: (preset, max length, conversion overrides, reading window, reading stride). kobigbird-copy is E7's conversion;
# copy64: TAPER copy from row 64 (taper_start); norandom: no random blocks; b128: block 128 (window 384 tokens).
CONVERSIONS = {
    "sliding-512": ("full", SOURCE_WINDOW, {}, SOURCE_WINDOW, 128),
    "kobigbird-copy": ("kobigbird", LONG, {"taper_schedule": "copy"}, LONG, 1024),
    "kobigbird-exp": ("kobigbird", LONG, {"taper_schedule": "exp", "taper_tau": 2.0}, LONG, 1024),
    "kobigbird-copy64": ("kobigbird", LONG, {"taper_schedule": "copy", "taper_start": 64}, LONG, 1024),
    "kobigbird-copy64-norandom": ("kobigbird", LONG, {"taper_schedule": "copy", "taper_start": 64,
                                                      "num_random_blocks": 0}, LONG, 1024),
    "kobigbird-b128-copy128-norandom": ("kobigbird", LONG, {
        "taper_schedule": "copy", "taper_start": 128, "block_size": 128, "num_random_blocks": 0}, LONG, 1024),
    "kobigbird-b128-copy128": ("kobigbird", LONG, {"taper_schedule": "copy", "taper_start": 128, "block_size": 128},
                               LONG, 1024),
    # the question global as keys only: its queries read the first 512 tokens, no last global block
    "kobigbird-b128-copy128-norandom-q": ("kobigbird", LONG, B128Q, LONG, 1024),
    # the same model read in sliding windows of 1024 / 2048 tokens (stride half the window, null-relative merging): if
    # these read better than one 4096-token window, what the long reading loses is the ranking across the article
    "kobigbird-b128-copy128-norandom-q-w1024": ("kobigbird", LONG, B128Q, 1024, 512),
    "kobigbird-b128-copy128-norandom-q-w2048": ("kobigbird", LONG, B128Q, 2048, 1024),
    # LittleBird (BiALiBi instead of the absolute position table, sliding window, global first block, pack & unpack)
    # read whole, and the same model in 512-token windows: what dropping the positions costs before any length does
    "littlebird": ("littlebird", LONG, {}, LONG, 1024),
    "littlebird-w512": ("littlebird", LONG, {}, SOURCE_WINDOW, 128),
    # without pack attention (pack_size 0): what the new pack vectors cost, apart from dropping the positions
    "littlebird-nopack-w512": ("littlebird", LONG, {"pack_size": 0}, SOURCE_WINDOW, 128),
    "kobigbird-b256-copy256-norandom": ("kobigbird", LONG, {
        "taper_schedule": "copy", "taper_start": 256, "block_size": 256, "num_random_blocks": 0}, LONG, 1024),
}


def validation_rows(dev_side, test_titles: set[str], questions: int, seed: int = 0):
    """The dev-side questions outside E7's test articles, `questions` of them drawn with `seed`."""
    rows = dev_side.filter(lambda row: row["title"] not in test_titles)
    if not len(rows):
        raise SystemExit("no dev-side article is left outside E7's test articles")
    return rows.shuffle(seed=seed).select(range(min(questions, len(rows))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", type=Path, required=True)
    parser.add_argument("--questions", type=int, default=120)
    parser.add_argument("--conversions", nargs="+", default=list(CONVERSIONS), choices=list(CONVERSIONS))
    add_output_arguments(parser, "e7_conversion_probe")
    args = parser.parse_args()
    bf16 = wants_bf16(args.precision)
    work = ROOT / "experiments" / "runs" / args.name
    rows, _ = read_korquad_v1_articles(ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json")
    split = split_by_title(rows)
    _, tokenizer = load_task_model(args.reader, LongBirdForQuestionAnswering)
    test, _ = draw_dev_articles(split["dev"], tokenizer, 300, 150)  # E7's defaults: its test articles
    test_titles = set(test["title"])
    validation = validation_rows(split["dev"], test_titles, args.questions)
    assert not set(validation["title"]) & test_titles, "a validation article is one of E7's test articles"
    held_out = held_out_record(split["train"], validation)
    require_trained_apart(args.reader, set(split["dev"]["title"]), root=ROOT)
    buckets = {i: b for i, b in answer_buckets(validation, tokenizer).items()}
    results = {"command": "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "machine": machine(),
               "reader": str(args.reader), "bf16": bf16, "questions": len(validation),
               "articles": sorted(set(validation["title"])), "e7_test_titles": sorted(test_titles),
               "bucket_sizes": {b: list(buckets.values()).count(b) for b in BUCKETS}, "held_out": held_out,
               "conversions": {}}
    path = args.out / f"{args.name}.json"
    if path.exists():  # conversions read earlier on the same questions by the same reader are kept
        old = json.loads(path.read_text())
        if (old["reader"], old["questions"], old["articles"]) == (results["reader"], results["questions"],
                                                                    results["articles"]):
            results["conversions"] = {k: v for k, v in old["conversions"].items() if k not in args.conversions}
            results["command"] = old["command"] + " && " + results["command"]
    for name in args.conversions:
        preset, length, overrides, window, stride = CONVERSIONS[name]
        model_dir = from_reader(args.reader, preset, length, overrides, work)
        predictions, seconds = evaluate_method(model_dir, validation, window, stride, bf16)
        scores = per_question_scores(predictions, validation, "korquad1-articles")
        results["conversions"][name] = {"preset": preset, "overrides": overrides, "window": window, "stride": stride,
                                        "summary": bucket_summary(scores, buckets, BUCKETS, None),
                                        "per_question": scores, "read_cpu_seconds": seconds}
        print(name, json.dumps(results["conversions"][name]["summary"]["all"]), flush=True)
        write_tables(args.out, args.name, results, table(results))


def table(results: dict) -> list[str]:
    sizes = results["bucket_sizes"]
    lines = provenance(results) + [
        f"Zero-shot readings (no long training) of the paragraph reader {results['reader']}, converted as named, "
        f"on {results['questions']} questions of {len(results['articles'])} validation articles (dev side, "
        f"none of E7's test articles; {sizes['first 512']} answers in the first 512 tokens, "
        f"{sizes['beyond 512']} beyond), {'bf16 autocast' if results['bf16'] else 'fp32'}.", "",
        "| conversion | window / stride | F1 (95 % CI) | EM | F1 first 512 | F1 beyond 512 | read CPU s |",
        "|---|---|---:|---:|---:|---:|---:|"]
    for name, entry in results["conversions"].items():
        lines.append(f"| {name} | {entry['window']} / {entry['stride']} | {score_cells(entry['summary'])} | "
                     f"{entry['read_cpu_seconds']:.0f} |")
    return lines


if __name__ == "__main__":
    main()
