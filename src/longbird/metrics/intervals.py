"""Bootstrap intervals over questions: how far a score measured on a few hundred questions may be from the truth.

A percentile bootstrap (Efron & Tibshirani 1993, ch. 13): resample the questions with replacement, recompute the mean,
take the 2.5th and 97.5th percentiles. For two methods scored on the same questions the *paired* difference is
resampled (one draw of questions for both), which is much tighter than comparing two separate intervals.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def bootstrap_interval(values: Sequence[float], samples: int = 10_000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """(low, high) percentile-bootstrap interval of the mean of `values`."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no values to bootstrap")
    draws = np.random.default_rng(seed).integers(0, values.size, size=(samples, values.size))
    means = values[draws].mean(axis=1)
    tail = (1.0 - level) / 2 * 100
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def paired_difference(values: Sequence[float], baseline: Sequence[float], samples: int = 10_000, seed: int = 0,
                      level: float = 0.95) -> dict[str, float]:
    """Mean of `values - baseline` (the same questions, in the same order) with its paired bootstrap interval."""
    values, baseline = np.asarray(values, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if values.shape != baseline.shape:
        raise ValueError(f"paired scores need the same questions: {values.shape} vs {baseline.shape}")
    low, high = bootstrap_interval(values - baseline, samples, seed, level)
    return {"difference": float((values - baseline).mean()), "low": low, "high": high}


def bucket_summary(scores: dict[str, dict[str, float]], buckets: dict[str, str], names: Sequence[str],
                   baseline: dict[str, dict[str, float]] | None = None) -> dict[str, dict]:
    """Per bucket ("all", then `names`): the questions, the mean EM and F1 with their bootstrap intervals, and with
    `baseline` (per-question scores of another method on the same questions) the paired F1 difference. `scores`
    maps question id -> {"exact_match", "f1"}; `buckets` maps question id -> bucket name."""
    summary = {}
    for bucket in ("all", *names):
        ids = [i for i in scores if bucket == "all" or buckets[i] == bucket]
        if not ids:
            continue
        summary[bucket] = {"questions": len(ids)}
        for metric in ("exact_match", "f1"):
            values = [scores[i][metric] for i in ids]
            summary[bucket][metric] = sum(values) / len(values)
            summary[bucket][f"{metric}_interval"] = bootstrap_interval(values)
        if baseline is not None:
            summary[bucket]["f1_vs_baseline"] = paired_difference([scores[i]["f1"] for i in ids],
                                                                  [baseline[i]["f1"] for i in ids])
    return summary
