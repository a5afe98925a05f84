"""Two paragraph readers' `longbird evaluate` outputs on the same KorQuAD 1.0 questions, compared question by question.

Each EVAL directory holds `metrics.json` and `predictions.json` (`longbird evaluate --out`). Per question: the
official EM and F1 of the format (`longbird.tasks.qa.per_question_scores`, as E7 scores); their means are asserted
to equal each run's own `metrics.json`. Each reader's own record must show it was trained on the train side alone
(`require_trained_apart`), and the scored questions must share no title or text with that side (E7's
`held_out_record`, written into the JSON); the two readers must have had the same time budget (`--cpu-minutes`,
`--wall-minutes`), and what each bought (updates, real tokens, seconds) is written beside its score.
Reported: both readers' scores with 95 % bootstrap intervals over questions,
and the paired difference (reading minus baseline) with its paired interval (`metrics.intervals`, 10,000 resamples,
seed 0). Both runs must have scored the same data file, split and questions.
Usage: python experiments/qa_paired.py READING_EVAL BASELINE_EVAL --name NAME [--label-reading L] [--label-baseline L]
Writes experiments/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from e7_long_reading import held_out_record  # noqa: E402

from longbird.files import write_file_atomically  # noqa: E402
from longbird.metrics.intervals import bootstrap_interval, paired_difference  # noqa: E402
from longbird.tasks.qa import per_question_scores, read_qa_data, require_trained_apart  # noqa: E402

BUDGET_SETTINGS = ("cpu_minutes", "wall_minutes")


def per_question(eval_dir: Path, rows, metrics: dict) -> dict[str, dict[str, float]]:
    """{question id: {"exact_match", "f1"}} (0-100) of one run, the official metric of its format; their means are
    asserted to equal the run's own metrics.json."""
    predictions = json.loads((eval_dir / "predictions.json").read_text(encoding="utf-8"))
    scores = per_question_scores(predictions, rows, metrics["format"])
    for key in ("exact_match", "f1"):
        mean = sum(score[key] for score in scores.values()) / len(scores)
        assert abs(mean - metrics[key]) < 1e-6, f"{eval_dir}: {key} {mean} here against {metrics[key]} in metrics.json"
    return scores


def training_record(model_dir: Path) -> dict:
    """What a reader's training spent, from its own longbird_finetune.json: the budget asked for, the updates, real
    tokens and seconds it bought."""
    record = json.loads((model_dir / "longbird_finetune.json").read_text(encoding="utf-8"))
    settings, metrics = record["settings"], record["metrics"]
    return {**{key: settings.get(key) for key in BUDGET_SETTINGS}, "batch_size": settings["batch_size"],
            "max_steps": settings["max_steps"], "epoch": metrics.get("epoch"),
            "train_seconds": metrics.get("train_runtime"), "real_tokens": metrics.get("tokens_seen"),
            "budgets_used": {key: metrics[key] for key in ("cpu_budget", "wall_budget") if metrics.get(key)}}


def budget_text(training: dict) -> str:
    asked = ", ".join(f"{key.replace('_', ' ')} {training[key]}" for key in BUDGET_SETTINGS if training[key]) or "none"
    updates = [f"{budget['steps']} updates" for budget in training["budgets_used"].values()]
    return ", ".join([f"{asked}; {training['train_seconds']:.0f} s of training", f"{training['epoch']:.2f} epoch",
                      f"{training['real_tokens']:,} real tokens", f"batch {training['batch_size']}", *updates])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reading", type=Path)
    parser.add_argument("baseline", type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--label-reading", default=None)
    parser.add_argument("--label-baseline", default=None)
    args = parser.parse_args()
    runs = {}
    for role, eval_dir, label in (("reading", args.reading, args.label_reading),
                                  ("baseline", args.baseline, args.label_baseline)):
        metrics = json.loads((eval_dir / "metrics.json").read_text())
        runs[role] = {"eval": str(eval_dir), "label": label or metrics["model"], "metrics": metrics}
    first, second = runs["reading"]["metrics"], runs["baseline"]["metrics"]
    for key in ("data", "format", "split", "questions"):
        if first[key] != second[key]:
            raise SystemExit(f"the two runs scored different {key}: {first[key]!r} against {second[key]!r}")
    for role in runs:  # compared readers get the same training budget
        runs[role]["training"] = training_record(ROOT / runs[role]["metrics"]["model"])
    budgets = [{key: runs[role]["training"][key] for key in BUDGET_SETTINGS} for role in runs]
    if budgets[0] != budgets[1]:
        raise SystemExit(f"the two readers were trained with different budgets: {budgets[0]} against {budgets[1]}")
    rows, _ = read_qa_data(ROOT / first["data"], first["format"], first["split"])
    for run in runs.values():  # neither reader read a scored article
        require_trained_apart(ROOT / run["metrics"]["model"], set(rows["title"]), root=ROOT)
    held_out = held_out_record(read_qa_data(ROOT / first["data"], first["format"], "train")[0], rows)
    if len(rows) != first["questions"]:
        raise SystemExit(f"{first['data']} ({first['split']}) holds {len(rows)} questions; the runs scored "
                         f"{first['questions']}")
    reading = per_question(args.reading, rows, first)
    baseline = per_question(args.baseline, rows, second)
    ids = [row["id"] for row in rows]
    result = {"questions": len(ids), "data": first["data"], "split": first["split"], "runs": runs, "scores": {},
              "held_out": held_out}
    for measure, key in (("em", "exact_match"), ("f1", "f1")):
        values = [reading[i][key] for i in ids]
        base = [baseline[i][key] for i in ids]
        result["scores"][measure] = {
            "reading": {"mean": sum(values) / len(ids), "interval": bootstrap_interval(values)},
            "baseline": {"mean": sum(base) / len(ids), "interval": bootstrap_interval(base)},
            "paired_difference": paired_difference(values, base)}
    out = ROOT / "experiments" / "results" / args.name
    write_file_atomically(out.with_suffix(".json"), json.dumps(result, indent=1, ensure_ascii=False))
    lines = [f"# {args.name}: {runs['reading']['label']} against {runs['baseline']['label']}", "",
             f"Command: `python experiments/qa_paired.py {args.reading} {args.baseline} --name {args.name}"
             + "".join(f" {flag} '{value}'" for flag, value in (("--label-reading", args.label_reading),
                                                                 ("--label-baseline", args.label_baseline)) if value)
             + "`  ",
             f"{len(ids)} questions of {first['data']} (split {first['split']}), official KorQuAD 1.0 EM/F1; 95 % "
             "bootstrap intervals over questions, paired for the difference (10,000 resamples, seed 0). Both readers "
             f"were trained on the train side only: the {len(held_out['dev_titles'])} scored articles share no title "
             f"and no text with the {len(held_out['train_titles'])} training articles (both lists in the JSON).", "",
             *[f"- {runs[role]['label']}: budget {budget_text(runs[role]['training'])}" for role in runs], "",
             "| measure | reading | baseline | reading − baseline |", "|---|---:|---:|---:|"]
    for measure, scores in result["scores"].items():
        cells = [f"{scores[role]['mean']:.2f} ({scores[role]['interval'][0]:.1f}–{scores[role]['interval'][1]:.1f})"
                 for role in ("reading", "baseline")]
        difference = scores["paired_difference"]
        cells.append(f"{difference['difference']:+.2f} ({difference['low']:+.1f} to {difference['high']:+.1f})")
        lines.append(f"| {measure.upper()} | " + " | ".join(cells) + " |")
    write_file_atomically(out.with_suffix(".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
