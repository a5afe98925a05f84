"""95 % intervals for the passkey accuracies of E3 and E6, read from their committed results (no model is run).

E3 and E6 score 40 samples per length and report accuracies alone. Their JSONs keep each row's accuracy and sample
count, not which samples were right, so:
- each accuracy gets the Wilson score interval of its proportion (`metrics.intervals.wilson_interval`): a bootstrap
  of the row's 0/1 outcomes would collapse to a point at 0 or 40 right, which most rows at 512-1024 tokens are;
- each comparison named below gets Newcombe's hybrid score interval for two independent proportions
  (`proportion_difference`). Every row reads the same 40 samples per length (E3's fixed seeds), so a paired interval
  would be narrower; this one is conservative.

What the samples hold out: each passkey's five-digit code and its depth are drawn afresh (its name comes from a fixed
list of 24 that training uses too); the filler sentences come from one pool, the KorQuAD 1.0 dev paragraphs, for
training and evaluation alike (the task reads the key, not the filler). Training is at 512 tokens; every longer length
is unseen in training.
Usage: python experiments/passkey_intervals.py  (writes experiments/results/passkey_intervals.{json,md})
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from longbird.files import write_file_atomically  # noqa: E402
from longbird.metrics.intervals import proportion_difference, wilson_interval  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
SOURCES = {"E3": "e3_extrapolation.json", "E6": "e6_tape_passkey.json"}
# (experiment, row, baseline row): the differences the README and the docs state
COMPARISONS = [("E3", "kobigbird copy/scale", "kobigbird exp/scale"), ("E3", "littlebird", "kobigbird copy/scale"),
               ("E6", "tape-peft", "lora"), ("E6", "tape-peft-seed1", "lora-seed1"),
               ("E6", "tape-peft", "tape-gain-only"), ("E6", "tape-peft-seed1", "tape-gain-only-seed1"),
               ("E6", "kobigbird-copy", "tape-peft")]


def successes(row: dict) -> int:
    right = round(row["exact_match"] * row["n"] / 100)
    assert abs(100 * right / row["n"] - row["exact_match"]) < 1e-9, row  # an accuracy of whole samples
    return right


def main() -> None:
    rows = {(experiment, row["variant"], row["length"]): row for experiment, name in SOURCES.items()
            for row in json.loads((RESULTS / name).read_text(encoding="utf-8"))["rows"]}
    accuracies = [{"experiment": experiment, "row": variant, "length": length, "n": row["n"],
                   "accuracy": row["exact_match"],
                   "interval": [100 * bound for bound in wilson_interval(successes(row), row["n"])]}
                  for (experiment, variant, length), row in sorted(rows.items())]
    lengths = sorted({length for _, _, length in rows})
    differences = []
    for experiment, name, baseline in COMPARISONS:
        for length in lengths:
            if (experiment, name, length) in rows and (experiment, baseline, length) in rows:
                row, other = rows[experiment, name, length], rows[experiment, baseline, length]
                result = proportion_difference(successes(row), row["n"], successes(other), other["n"])
                differences.append({"experiment": experiment, "row": name, "baseline": baseline, "length": length,
                                    **{key: 100 * value for key, value in result.items()}})
    report = {"command": "python experiments/passkey_intervals.py", "sources": SOURCES, "accuracies": accuracies,
              "differences": differences}
    lines = [f"Command: `{report['command']}` (from the committed {', '.join(SOURCES.values())}; no model run)  ",
             "Passkey accuracy (%) with 95 % Wilson score intervals; differences with Newcombe's hybrid score interval "
             "for independent proportions (the samples were shared, so a paired interval would be narrower).", "",
             "| experiment | row | " + " | ".join(str(length) for length in lengths) + " |",
             "|---|---|" + "---:|" * len(lengths)]
    by_row: dict[tuple[str, str], dict[int, dict]] = {}
    for item in accuracies:
        by_row.setdefault((item["experiment"], item["row"]), {})[item["length"]] = item
    for (experiment, name), cells in by_row.items():
        shown = [f"{cells[length]['accuracy']:.1f} ({cells[length]['interval'][0]:.1f}–"
                 f"{cells[length]['interval'][1]:.1f})" if length in cells else "" for length in lengths]
        lines.append(f"| {experiment} | {name} (n = {next(iter(cells.values()))['n']}) | " + " | ".join(shown) + " |")
    lines += ["", "| experiment | row − baseline | " + " | ".join(str(length) for length in lengths) + " |",
              "|---|---|" + "---:|" * len(lengths)]
    pairs: dict[tuple[str, str, str], dict[int, dict]] = {}
    for item in differences:
        pairs.setdefault((item["experiment"], item["row"], item["baseline"]), {})[item["length"]] = item
    for (experiment, name, baseline), cells in pairs.items():
        shown = [f"{cells[length]['difference']:+.1f} ({cells[length]['low']:+.1f} to {cells[length]['high']:+.1f})"
                 if length in cells else "" for length in lengths]
        lines.append(f"| {experiment} | {name} − {baseline} | " + " | ".join(shown) + " |")
    write_file_atomically(RESULTS / "passkey_intervals.json", json.dumps(report, indent=1) + "\n")
    write_file_atomically(RESULTS / "passkey_intervals.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
