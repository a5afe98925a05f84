"""Arms of several seeds: a method's readings averaged per question and paired with the baseline's (E7 round 31,
measurement only; no model runs).

Round 30 found the sliding-512 baseline 1.6 F1 apart between two seeds of one recipe, as far as any long reader has
been from it, so one reading per arm cannot carry a comparison. An *arm* here is one recipe read at several seeds:
`--arm NAME=READING,READING,...` names readings already in an `e7_paragraph_layout.py` results file. Each arm's score
for a question is the mean of its readings' scores for it, the expected score of the recipe over the seeds drawn; the
first arm is the baseline and every other arm is paired with it over articles (cluster bootstrap), overall and by
answer position. Within each arm, every further seed is paired with its first: the spread a single reading carries.

Usage: python experiments/e7_seeds.py \
           --arm sliding-512=sliding-512-577linear,sliding-512-577linear-seed1 \
           --arm layout=sliding385linear-global-s12,sliding385linear-global-s12-seed1
Writes experiments/results/NAME.{json,md} (default e7_seeds).
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

from e4_korquad_articles import BUCKETS, answer_buckets  # noqa: E402
from e7_answer_places import dev_side_places  # noqa: E402
from e7_long_reading import held_out_record, write_tables  # noqa: E402

from longbird.metrics.intervals import bucket_summary, paired_difference  # noqa: E402

PRIORS = ("default", "none")  # the library's default lexical prior, and none (the readings' `none` row)
METRICS = ("exact_match", "f1")
TARGET = 3.0  # issue 24: F1 points above the baseline


def parse_arm(text: str) -> tuple[str, list[str]]:
    """'NAME=R1,R2' -> (NAME, [R1, R2]); a clear error for anything else."""
    name, sep, readings = text.partition("=")
    members = [r for r in readings.split(",") if r]
    if not sep or not name or not members:
        raise argparse.ArgumentTypeError(f"--arm {text!r}: expected NAME=READING[,READING...]")
    if len(set(members)) != len(members):
        raise argparse.ArgumentTypeError(f"--arm {text!r}: a reading is named twice")
    return name, members


def arm_mean(per_question: list[dict[str, dict]]) -> dict[str, dict[str, float]]:
    """Per question: the mean EM and F1 over the arm's readings, which must score the same questions."""
    ids = set(per_question[0])
    for scores in per_question[1:]:
        if set(scores) != ids:
            raise ValueError("the readings of an arm score different questions; read them on the same dev side")
    return {q: {m: sum(scores[q][m] for scores in per_question) / len(per_question) for m in METRICS}
            for q in per_question[0]}


def compare_arms(arms: dict[str, list[dict[str, dict]]], buckets: dict[str, str],
                 article_of: dict[str, str]) -> dict[str, dict]:
    """Per arm (the first is the baseline): the summary of its per-question mean (`bucket_summary`, paired with the
    baseline arm's mean for every other arm) and, for each further seed, its paired difference from the arm's first."""
    means = {name: arm_mean(readings) for name, readings in arms.items()}
    baseline = next(iter(means))
    out = {}
    for name, readings in arms.items():
        out[name] = {"summary": bucket_summary(means[name], buckets, BUCKETS,
                                               None if name == baseline else means[baseline], article_of),
                     "seeds": [{"f1": sum(s["f1"] for s in scores.values()) / len(scores),
                                "vs_first": None if k == 0 else
                                paired_difference([scores[q]["f1"] for q in scores],
                                                  [readings[0][q]["f1"] for q in scores],
                                                  clusters=[article_of[q] for q in scores])}
                               for k, scores in enumerate(readings)],
                     "per_question": means[name]}
    return out


def table(results: dict) -> list[str]:
    lines = [f"Command: `{results['command']}`", "",
             f"{results['questions']} dev-side questions of {results['articles']} held-out articles. Each arm's score "
             "for a question is the mean over its readings (seeds); every arm is paired with the first arm, "
             "`" + results["baseline"] + "`, and every further seed with its arm's first; intervals resample articles.",
             ""]
    for prior, arms in results["priors"].items():
        base_f1 = arms[results["baseline"]]["summary"]["all"]["f1"]
        lines += [f"**Prior: {prior}** (issue 24's margin above the first arm: {base_f1:.1f} + {TARGET:.0f} = "
                  f"{base_f1 + TARGET:.1f})", "",
                  "| arm | readings (F1 each) | F1 of the mean (95 % CI) | EM | − baseline arm (95 % CI) "
                  "| first 512 / beyond 512 | spread: seed − first seed (95 % CI) |",
                  "|---|---|---:|---:|---:|---:|---|"]
        for name, arm in arms.items():
            s = arm["summary"]
            low, high = s["all"]["f1_interval"]
            paired = s["all"].get("f1_vs_baseline")
            spread = "; ".join(f"{seed['vs_first']['difference']:+.1f} ({seed['vs_first']['low']:+.1f} to "
                               f"{seed['vs_first']['high']:+.1f})" for seed in arm["seeds"][1:]) or "one reading"
            lines.append(
                f"| {name} | " + ", ".join(f"`{r}` {seed['f1']:.1f}" for r, seed in zip(results["arms"][name],
                                                                                    arm["seeds"]))
                + f" | {s['all']['f1']:.1f} ({low:.1f}–{high:.1f}) | {s['all']['exact_match']:.1f} | "
                + (f"{paired['difference']:+.1f} ({paired['low']:+.1f} to {paired['high']:+.1f}) | "
                   + " / ".join(f"{s[b]['f1_vs_baseline']['difference']:+.1f}" for b in BUCKETS if b in s)
                   if paired else "(the baseline) | ")
                + f" | {spread} |")
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", type=parse_arm, action="append", required=True,
                        help="NAME=READING,READING,...: one recipe's readings at several seeds; the first arm is "
                             "the baseline")
    parser.add_argument("--results", type=Path, default=ROOT / "experiments" / "results" / "e7_whole_articles.json",
                        help="The e7_paragraph_layout.py results file holding the readings")
    parser.add_argument("--reader", type=Path, default=ROOT / "qa-model" / "kobigbird-e5-korquad",
                        help="The paragraph reader, for its tokenizer (answer buckets)")
    parser.add_argument("--name", default="e7_seeds")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    args = parser.parse_args()
    arms = dict(args.arm)
    if len(arms) != len(args.arm) or len(arms) < 2:
        raise SystemExit("--arm: name at least two arms, each once (the first is the baseline)")
    source = json.loads(args.results.read_text(encoding="utf-8"))
    missing = [r for readings in arms.values() for r in readings if r not in source["readings"]]
    if missing:
        raise SystemExit(f"{args.results} holds no reading {missing}; it holds {sorted(source['readings'])}")
    split, dev, tokenizer, _, _, _ = dev_side_places(args.reader)
    held_out = held_out_record(split["train"], split["dev"])
    if held_out["dev_titles"] != sorted(source["held_out"]["dev_titles"]):
        raise SystemExit(f"{args.results} was read on other dev-side articles than this split's; read it again")
    article_of = {row["id"]: row["title"] for row in dev}
    for reading in {r for readings in arms.values() for r in readings}:
        for prior in PRIORS:
            if set(source["readings"][reading][prior]["per_question"]) != set(article_of):
                raise SystemExit(f"{args.results}: `{reading}` ({prior}) scores other questions than the {len(dev)} "
                                 "dev-side ones; read it again with e7_paragraph_layout.py")
    buckets = answer_buckets(dev, tokenizer)
    results = {"command": "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
               "results_file": args.results.relative_to(ROOT).as_posix() if args.results.is_relative_to(ROOT)
               else str(args.results),
               "held_out": held_out, "questions": len(dev), "articles": len(set(article_of.values())),
               "baseline": next(iter(arms)), "target_points": TARGET, "arms": arms,
               "priors": {prior: compare_arms({name: [source["readings"][r][prior]["per_question"] for r in readings]
                                               for name, readings in arms.items()}, buckets, article_of)
                          for prior in PRIORS}}
    write_tables(args.out, args.name, results, table(results))
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
