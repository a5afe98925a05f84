"""E7: the paired F1 difference of two readings stored in different results files (same questions).

The diagnosis files (e7_diagnosis.py) each hold their own readers; a comparison across two of them (e.g. round 4's
regional-null reader against round 3's on the same test questions) pairs their per-question scores here, with the
same paired bootstrap as every E7 table (`metrics.intervals.paired_difference`, 10,000 resamples, seed 0).

Usage: python experiments/e7_paired.py \\
           experiments/results/e7_diagnosis_nulls.json:kobigbird-long-b128qn:whole \\
           experiments/results/e7_diagnosis.json:kobigbird-long-b128q:whole
A reading is FILE:READER:READING (whole or near) of a diagnosis file, or FILE:METHOD of an e7_long_reading file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from longbird.metrics.intervals import paired_difference  # noqa: E402


def per_question(spec: str) -> tuple[dict[str, dict], dict]:
    """(per-question scores, the results file) of FILE:READER:READING or FILE:METHOD."""
    path, _, rest = spec.partition(":")
    results = json.loads(Path(path).read_text())
    if "readers" in results:
        reader, _, reading = rest.rpartition(":")
        return results["readers"][reader][reading]["per_question"], results
    return results["methods"][rest]["per_question"], results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reading", help="FILE:READER:READING or FILE:METHOD (the values)")
    parser.add_argument("baseline", help="the same for the baseline")
    args = parser.parse_args()
    values, _ = per_question(args.reading)
    baseline, _ = per_question(args.baseline)
    if set(values) != set(baseline):
        raise SystemExit(f"the two readings score different questions ({len(values)} and {len(baseline)}): "
                         "pair readings of the same question set")
    ids = sorted(values)
    difference = paired_difference([values[i]["f1"] for i in ids], [baseline[i]["f1"] for i in ids])
    print(json.dumps({"questions": len(ids), "f1": sum(values[i]["f1"] for i in ids) / len(ids),
                      "baseline_f1": sum(baseline[i]["f1"] for i in ids) / len(ids), **difference}))


if __name__ == "__main__":
    main()
