"""How far each reading could go with perfect ranking: the +3 target against what a reader's own candidates hold
(E7 round 30, measurement only).

Reads the candidates `e7_paragraph_layout.py --keep-candidates DIR` saved (no model runs) and ranks every question's
distinct answers with the library's default lexical prior, as the results file's `default` reading does. For each
reading it scores four choices among those answers:

- `default`: the best-ranked answer, the reading itself (its F1 equals the results file's `default` row);
- `its paragraph`: the best-ranked answer inside the gold answer's paragraph, a ranker that always picks the right
  paragraph and leaves the choice within it to the reader (no answer there: F1 0);
- `best of top 5` and `best of top 20`: the answer with the highest F1 among the 5 or 20 best-ranked, a perfect
  reranker of the reader's own shortlist.

Each is paired with the baseline reading's `default` over articles, overall and by answer position: a reading whose
`its paragraph` lies less than 3 F1 above the baseline cannot reach issue 24's target by ranking better; it has to
read the answer's paragraph better. Each is also paired with the baseline's same choice: `its paragraph` against the
baseline's `its paragraph` compares how the two read the gold paragraph when both rank perfectly.

Usage: python experiments/e7_headroom.py --candidates experiments/runs/e7_round29/candidates \
           --baseline sliding-512-577linear --readings sliding385linear-global-s12 sliding-512-385of577linear
Writes experiments/results/NAME.{json,md} (default e7_headroom).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e4_korquad_articles import BUCKETS, answer_buckets  # noqa: E402
from e7_answer_places import dev_side_places, paragraph_index  # noqa: E402
from e7_long_reading import held_out_record, write_tables  # noqa: E402

from longbird.metrics.intervals import bucket_summary, paired_by_bucket  # noqa: E402
from longbird.qa import DEFAULT_SCORING, rank_answers  # noqa: E402
from longbird.tasks.qa import per_question_scores  # noqa: E402

SHORTLISTS = (5, 20)  # the rerankers' shortlist lengths
CHOICES = ("default", "its paragraph", *(f"best of top {k}" for k in SHORTLISTS))
TARGET = 3.0  # issue 24: F1 points above the baseline


def first_in_its_paragraph(ranked: dict, rows, gold_paragraph: dict, starts_of: dict) -> dict:
    """Per question of `rows`: its best-ranked answer inside the gold answer's paragraph, or None."""
    return {row["id"]: next((a for a in ranked.get(row["id"], [])
                             if paragraph_index(starts_of[row["id"]], a.start) == gold_paragraph[row["id"]]), None)
            for row in rows}


def choices(ranked: dict, rows, gold_paragraph: dict, starts_of: dict) -> dict[str, dict[str, dict]]:
    """{choice: per-question scores} from one reading's ranked answers (best first) for `rows`."""
    def score(texts: dict[str, str]) -> dict[str, dict]:
        return per_question_scores(texts, rows, "korquad1-articles")

    by_rank = [score({row["id"]: (ranked[row["id"]][r].text if r < len(ranked.get(row["id"], [])) else "")
                      for row in rows}) for r in range(max(SHORTLISTS))]
    own = first_in_its_paragraph(ranked, rows, gold_paragraph, starts_of)
    out = {"default": by_rank[0], "its paragraph": score({q: a.text if a else "" for q, a in own.items()})}
    for k in SHORTLISTS:
        out[f"best of top {k}"] = {q: max((by_rank[r][q] for r in range(k)), key=lambda s: (s["f1"], s["exact_match"]))
                                   for q in by_rank[0]}
    return out


def table(results: dict) -> list[str]:
    baseline = results["baseline"]
    base_f1 = results["readings"][baseline]["default"]["all"]["f1"]
    lines = [f"Command: `{results['command']}`", "",
             f"{results['questions']} dev-side questions of {results['articles']} held-out articles; each reading's "
             f"distinct answers ranked with the default lexical prior. Paired differences are against `{baseline}` "
             "read as it is (`default`); intervals resample articles. Issue 24's target lies at "
             f"{base_f1:.1f} + {TARGET:.0f} = **{base_f1 + TARGET:.1f}**.", "",
             "| reading | choice | F1 (95 % CI) | EM | − baseline (95 % CI) | first 512 / beyond 512 "
             "| − the baseline's same choice (95 % CI) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, by_choice in results["readings"].items():
        for choice in CHOICES:
            s = by_choice[choice]
            low, high = s["all"]["f1_interval"]
            paired = s["all"].get("f1_vs_baseline")
            lines.append(
                f"| {name} | {choice} | {s['all']['f1']:.1f} ({low:.1f}–{high:.1f}) | {s['all']['exact_match']:.1f} | "
                + (f"{paired['difference']:+.1f} ({paired['low']:+.1f} to {paired['high']:+.1f}) | "
                   + " / ".join(f"{s[b]['f1_vs_baseline']['difference']:+.1f}" for b in BUCKETS if b in s)
                   if paired else "(the baseline) | ")
                + " | " + (f"{same['difference']:+.1f} ({same['low']:+.1f} to {same['high']:+.1f})"
                           if (same := s["all"].get("f1_vs_same_choice")) else "")
                + " |")
    lines += ["", "Questions whose ranked answers hold none inside the gold answer's paragraph: "
              + ", ".join(f"`{n}` {c}" for n, c in results["no_answer_in_its_paragraph"].items()) + "."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=Path, required=True, help="The --keep-candidates directory")
    parser.add_argument("--baseline", required=True, help="The reading every choice is paired with (NAME.pt)")
    parser.add_argument("--readings", nargs="*", default=[], help="Further readings kept there (NAME.pt)")
    parser.add_argument("--reader", type=Path, default=ROOT / "qa-model" / "kobigbird-e5-korquad",
                        help="The paragraph reader, for its tokenizer (answer buckets, the prior's special tokens)")
    parser.add_argument("--name", default="e7_headroom")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    args = parser.parse_args()
    split, dev, tokenizer, prior, gold_paragraph, starts_of = dev_side_places(args.reader)
    article_of = {row["id"]: row["title"] for row in dev}
    buckets = answer_buckets(dev, tokenizer)
    names = [args.baseline] + [n for n in args.readings if n != args.baseline]
    per_choice, missing = {}, {}
    for name in names:
        kept = torch.load(args.candidates / f"{name}.pt", weights_only=False)
        if set(kept["documents"]) != {row["id"] for row in dev}:
            raise SystemExit(f"{name}: its candidates cover {len(kept['documents'])} questions, not the "
                             f"{len(dev)} dev-side ones; read it again with e7_paragraph_layout.py --keep-candidates")
        # deeper than the longest shortlist, so that `its paragraph` finds the gold paragraph's answer further down
        ranked = rank_answers(kept["windows"], kept["documents"], DEFAULT_SCORING, max(SHORTLISTS) * 5, prior,
                              distinct="span")
        per_choice[name] = choices(ranked, dev, gold_paragraph, starts_of)
        missing[name] = sum(answer is None
                            for answer in first_in_its_paragraph(ranked, dev, gold_paragraph, starts_of).values())
        print(name, {c: round(sum(s["f1"] for s in v.values()) / len(v), 2) for c, v in per_choice[name].items()},
              flush=True)
    base = per_choice[args.baseline]["default"]
    results = {"command": "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
               "held_out": held_out_record(split["train"], split["dev"]), "questions": len(dev),
               "articles": len(set(article_of.values())), "baseline": args.baseline, "target_points": TARGET,
               "no_answer_in_its_paragraph": missing,
               "readings": {name: {choice: {**bucket_summary(s, buckets, BUCKETS,
                                                             None if (name, choice) == (args.baseline, "default")
                                                             else base, article_of), "per_question": s}
                                   for choice, s in by_choice.items()}
                            for name, by_choice in per_choice.items()}}
    for name, by_choice in results["readings"].items():
        if name != args.baseline:
            for choice, summary in by_choice.items():
                if choice == "default":  # the baseline's same choice is the baseline: the pairing bucket_summary made
                    for bucket in ("all", *BUCKETS):
                        if bucket in summary:
                            summary[bucket]["f1_vs_same_choice"] = summary[bucket]["f1_vs_baseline"]
                    continue
                for bucket, paired in paired_by_bucket(summary["per_question"], buckets, BUCKETS,
                                                       per_choice[args.baseline][choice], article_of).items():
                    summary[bucket]["f1_vs_same_choice"] = paired
    write_tables(args.out, args.name, results, table(results))
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
