"""Where each reading's answer lands: in the gold answer's paragraph or in another (E7 round 24, measurement only).

Reads the candidates `e7_paragraph_layout.py --keep-candidates DIR` saved (no model runs) and, for every reading
named, takes each question's best answer with the library's default lexical prior, as the results file's `default`
reading does. A wrong answer (F1 below 50) in the gold answer's paragraph is a reading error: the reader found the
place and chose the wrong span; one in another paragraph is a ranking error: another place outscored the answer's. Per
answer paragraph (the article's first paragraph or a later one), the table counts both for each reading, and the
questions one reading gets right (F1 at least 50) and the other wrong, with where the wrong one went.

Usage: python experiments/e7_answer_places.py --candidates experiments/runs/e7_round24/candidates \
           --readings sliding-512-90min global-s6-bm25-90min
Writes experiments/results/NAME.{json,md} (default e7_answer_places).
"""

from __future__ import annotations

import argparse
import bisect
import shlex
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e7_long_reading import held_out_record, write_tables  # noqa: E402
from e7_paragraph_cuts import DATA, article_paragraphs  # noqa: E402

from longbird.checkpoints import load_task_model  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.lexical_prior import DEFAULT_RADIUS, DEFAULT_WEIGHT, LexicalPrior  # noqa: E402
from longbird.qa import DEFAULT_SCORING, merge_windows  # noqa: E402
from longbird.tasks.qa import per_question_scores  # noqa: E402

RIGHT = 50.0  # F1 at or above: the answer counts as found


def paragraph_index(starts: list[int], character: int) -> int:
    """The paragraph holding `character`, given the paragraphs' first characters in order."""
    return bisect.bisect_right(starts, character) - 1


def dev_side_places(reader: Path):
    """What the candidate readers share: (the by-title split, its dev rows, the reader's tokenizer, the default
    lexical prior, each question's gold paragraph index, each dev question's paragraph starts in its article)."""
    rows, _ = read_korquad_v1_articles(DATA)
    split = split_by_title(rows)
    dev = list(split["dev"])
    tokenizer = load_task_model(reader, LongBirdForQuestionAnswering)[1]
    prior = LexicalPrior(DEFAULT_WEIGHT, DEFAULT_RADIUS, frozenset(tokenizer.all_special_ids))
    spans = article_paragraphs(DATA)
    gold_paragraph = {i: index for title, paragraphs in spans.items() for index, (_, ids) in enumerate(paragraphs)
                      for i in ids}
    starts_of = {row["id"]: [low for (low, _), _ in spans[row["title"]]] for row in dev}
    return split, dev, tokenizer, prior, gold_paragraph, starts_of


def places(predictions: dict, scores: dict, gold_paragraph: dict, starts_of: dict) -> dict[str, str]:
    """Per question: "right", "wrong, its paragraph" (a reading error) or "wrong, another paragraph" (ranking)."""
    out = {}
    for question, answer in predictions.items():
        if scores[question]["f1"] >= RIGHT:
            out[question] = "right"
        elif answer is not None and paragraph_index(starts_of[question], answer.start) == gold_paragraph[question]:
            out[question] = "wrong, its paragraph"
        else:
            out[question] = "wrong, another paragraph"
    return out


KINDS = ("right", "wrong, its paragraph", "wrong, another paragraph")


def table(results: dict) -> list[str]:
    names, counts = results["readings"], results["counts"]
    lines = [f"Command: `{results['command']}`", "",
             "Each question's best answer with the default lexical prior; wrong means F1 below 50. Questions by the "
             "paragraph of its article that holds the gold answer:", "",
             "| answer in | reading | right | wrong, in its paragraph (reading) | wrong, in another (ranking) |",
             "|---|---|---:|---:|---:|"]
    for bucket in ("1st paragraph", "a later paragraph"):
        for name in names:
            c = counts[bucket][name]
            lines.append(f"| {bucket} ({sum(c.values())}) | {name} | " + " | ".join(str(c[k]) for k in KINDS) + " |")
    if len(names) == 2:
        first, second = names
        lines += ["", f"Questions `{first}` answers and `{second}` does not, by where `{second}`'s answer went, and "
                  "the other way round:", "", "| answer in | right only in | the other's answer: its paragraph | "
                  "another paragraph |", "|---|---|---:|---:|"]
        for bucket in ("1st paragraph", "a later paragraph"):
            for name in names:
                c = results["only"][bucket][name]
                lines.append(f"| {bucket} | {name} | {c['wrong, its paragraph']} | {c['wrong, another paragraph']} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=Path, required=True, help="The --keep-candidates directory")
    parser.add_argument("--readings", nargs="+", required=True, help="Names of readings kept there (NAME.pt)")
    parser.add_argument("--reader", type=Path, default=ROOT / "qa-model" / "kobigbird-e5-korquad",
                        help="The paragraph reader, for its tokenizer's special tokens (never question words)")
    parser.add_argument("--name", default="e7_answer_places")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    args = parser.parse_args()
    split, dev, _, prior, gold_paragraph, starts_of = dev_side_places(args.reader)
    kinds = {}
    for name in args.readings:
        kept = torch.load(args.candidates / f"{name}.pt", weights_only=False)
        read = [row for row in dev if row["id"] in kept["documents"]]
        assert len(read) == len(kept["documents"]), f"{name}: candidates for questions outside the dev side"
        answers = merge_windows(kept["windows"], kept["documents"], DEFAULT_SCORING, prior)
        scores = per_question_scores({row["id"]: answers[row["id"]].text if row["id"] in answers else ""
                                      for row in read}, read, "korquad1-articles")
        kinds[name] = places({row["id"]: answers.get(row["id"]) for row in read}, scores, gold_paragraph, starts_of)
    questions = sorted(set.intersection(*(set(k) for k in kinds.values())))
    bucket_of = {q: "1st paragraph" if gold_paragraph[q] == 0 else "a later paragraph" for q in questions}
    counts = {b: {n: {k: sum(kinds[n][q] == k for q in questions if bucket_of[q] == b) for k in KINDS}
                  for n in args.readings} for b in ("1st paragraph", "a later paragraph")}
    results = {"command": "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
               "held_out": held_out_record(split["train"], split["dev"]),
               "readings": args.readings, "questions": len(questions), "counts": counts, "kinds": kinds}
    if len(args.readings) == 2:
        first, second = args.readings
        results["only"] = {b: {n: {k: sum(kinds[n][q] == "right" and kinds[o][q] == k for q in questions
                                          if bucket_of[q] == b) for k in KINDS}
                               for n, o in ((first, second), (second, first))}
                           for b in ("1st paragraph", "a later paragraph")}
    write_tables(args.out, args.name, results, table(results))
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
