"""E7: learning curves (F1 against the training budget in CPU minutes) of E7 rows stored in several results files.

Each E7 results file holds one budget (`--cpu-minutes`); a row's `-untrained` twin is its 0-minute point. This script
puts the points of a method together, one curve per method, with the 95 % bootstrap interval of each point and, at
each budget both curves reached, the paired difference of every curve against the first (the baseline). All points
must score the same questions of the same held-out articles (asserted from the files).

Usage: python experiments/e7_learning_curves.py \\
           --curve sliding-512=R/e7_round2.json:sliding-512-untrained,R/e7_round2.json:sliding-512,\\
R/e7_round4_budget.json:sliding-512 --curve kobigbird-long-b128qn=...
       (R = experiments/results, one argument per curve without spaces; the full command is in e7_learning_curves.md)
Writes experiments/results/NAME.{json,md,png} (--name, default e7_learning_curves).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from longbird.files import save_figure_atomically, write_file_atomically  # noqa: E402
from longbird.metrics.intervals import paired_difference  # noqa: E402

BUCKETS = ("all", "first 512", "beyond 512")


def load_point(spec: str, cache: dict) -> dict:
    """One point FILE:METHOD: its budget, score summary, per-question F1 and the files' held-out record."""
    path, _, method = spec.rpartition(":")
    if path not in cache:
        cache[path] = json.loads(Path(path).read_text())
    results = cache[path]
    if method not in results["methods"]:
        raise SystemExit(f"{path} has no row {method!r}; it has {sorted(results['methods'])}")
    row = results["methods"][method]
    budget = row["cpu_budget"]
    return {"file": path, "method": method, "budget_minutes": budget["minutes"],
            "train_cpu_minutes": budget["cpu_seconds"] / 60, "updates": budget["steps"], "tokens": row["tokens_seen"],
            "summary": {bucket: row["summary"][bucket] for bucket in BUCKETS},
            "per_question": {qid: value["f1"] for qid, value in row["per_question"].items()},
            "held_out": results["held_out"], "machine": _rates(row.get("machine"))}


def _rates(machine: dict | None) -> str:
    # rows older than E7 round 4 did not record their machine (only the file's latest run is at its top level)
    if not machine:
        return "not recorded"
    return " / ".join(f"{name.split()[0]} {rate:.3f}" for name, rate in machine["matmul_tflops"].items()) + " TFLOP/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--curve", action="append", required=True,
                        help="LABEL=FILE:METHOD[,FILE:METHOD...] (repeatable; the first curve is the baseline)")
    parser.add_argument("--name", default="e7_learning_curves")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    args = parser.parse_args()

    cache: dict = {}
    curves = {}
    for spec in args.curve:
        label, _, points = spec.partition("=")
        if not points:
            raise SystemExit(f"--curve {spec!r}: expected LABEL=FILE:METHOD[,FILE:METHOD...]")
        curves[label] = sorted((load_point(point, cache) for point in points.split(",")),
                               key=lambda point: point["budget_minutes"])
    points = [point for curve in curves.values() for point in curve]
    questions = set(points[0]["per_question"])
    for point in points:  # one question set, one held-out split: the points are comparable
        if set(point["per_question"]) != questions or point["held_out"] != points[0]["held_out"]:
            raise SystemExit(f"{point['file']}:{point['method']} scores other questions or another held-out split "
                             f"than {points[0]['file']}:{points[0]['method']}")

    baseline_label = next(iter(curves))
    by_budget = {point["budget_minutes"]: point for point in curves[baseline_label]}
    ids = sorted(questions)
    for curve in curves.values():
        for point in curve:
            base = by_budget.get(point["budget_minutes"])
            point["paired_vs_baseline"] = None if base is None or base is point else paired_difference(
                [point["per_question"][i] for i in ids], [base["per_question"][i] for i in ids])

    command = "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])
    lines = [f"Command: `{command}`  ", "",
             f"F1 on the {len(ids)} questions of E7's held-out test articles against the training budget (process CPU "
             f"minutes); 0 minutes is the conversion or reader as it starts. Paired differences against "
             f"{baseline_label} at the same budget (95 % bootstrap intervals).", "",
             "| method | budget (CPU min) | updates | tokens | F1 (95 % CI) | F1 first 512 | F1 beyond 512 | "
             f"F1 − {baseline_label} (paired 95 % CI) | machine (matmul fp32 / bf16) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for label, curve in curves.items():
        for point in curve:
            summary, paired = point["summary"], point["paired_vs_baseline"]
            low, high = summary["all"]["f1_interval"]
            difference = "—" if paired is None else (
                f"{paired['difference']:+.1f} ({paired['low']:+.1f} to {paired['high']:+.1f})")
            lines.append(f"| {label} | {point['budget_minutes']:g} | {point['updates']} | {point['tokens']:,} | "
                         f"{summary['all']['f1']:.1f} ({low:.1f}–{high:.1f}) | {summary['first 512']['f1']:.1f} | "
                         f"{summary['beyond 512']['f1']:.1f} | {difference} | {point['machine']} |")
    args.out.mkdir(parents=True, exist_ok=True)
    write_file_atomically(args.out / f"{args.name}.md", "\n".join(lines) + "\n")
    record = {"command": command, "baseline": baseline_label, "questions": len(ids),
              "curves": {label: [{key: value for key, value in point.items() if key not in ("per_question", "held_out")}
                                 for point in curve] for label, curve in curves.items()}}
    write_file_atomically(args.out / f"{args.name}.json", json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    plot(curves, args.out / f"{args.name}.png")
    print("\n".join(lines))


def plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for axis, bucket in zip(axes, ("all", "beyond 512")):
        for label, curve in curves.items():
            minutes = [point["budget_minutes"] for point in curve]
            f1 = [point["summary"][bucket]["f1"] for point in curve]
            line, = axis.plot(minutes, f1, marker="o", label=label)
            if bucket == "all":
                low = [point["summary"][bucket]["f1_interval"][0] for point in curve]
                high = [point["summary"][bucket]["f1_interval"][1] for point in curve]
                axis.fill_between(minutes, low, high, color=line.get_color(), alpha=0.15)
        axis.set_title(f"F1, {'every question' if bucket == 'all' else 'answers beyond 512 tokens'}")
        axis.set_xlabel("training budget (CPU minutes)")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("F1 (KorQuAD 1.0, held-out articles)")
    axes[0].legend()
    figure.tight_layout()
    save_figure_atomically(figure, path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    main()
