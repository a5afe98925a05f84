"""Bootstrap intervals over questions: how far a score measured on a few hundred questions may be from the truth.

A percentile bootstrap (Efron & Tibshirani 1993, ch. 13): resample the questions with replacement, recompute the mean,
take the 2.5th and 97.5th percentiles. For two methods scored on the same questions the *paired* difference is
resampled (one draw of questions for both), which is much tighter than comparing two separate intervals.

Questions written on one article are not independent draws: they share its text, its length and the reader's luck
on it. With `clusters` (each question's article) the bootstrap resamples whole articles instead, the cluster bootstrap
(Davison & Hinkley 1997, sec. 3.8; Field & Welsh 2007): each draw takes C articles with replacement, C the number of
articles, and its statistic is the mean over every question of the drawn articles (the same question-weighted mean the
point estimate is). Its interval is the honest one when a test set holds a few articles; resampling questions alone
reads it too narrow.
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


def cluster_bootstrap_interval(values: Sequence[float], clusters: Sequence, samples: int = 10_000, seed: int = 0,
                               level: float = 0.95) -> tuple[float, float]:
    """(low, high) percentile interval of the mean of `values` when whole clusters are resampled: `clusters[i]` names
    the cluster (article) of `values[i]`. With every value its own cluster this is `bootstrap_interval` (same draws)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no values to bootstrap")
    if len(clusters) != values.size:
        raise ValueError(f"one cluster per value is needed: {len(clusters)} clusters for {values.size} values")
    names, index = np.unique(np.asarray([str(c) for c in clusters]), return_inverse=True)
    sums = np.bincount(index, weights=values, minlength=names.size)
    counts = np.bincount(index, minlength=names.size).astype(np.float64)
    draws = np.random.default_rng(seed).integers(0, names.size, size=(samples, names.size))
    means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    tail = (1.0 - level) / 2 * 100
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def paired_difference(values: Sequence[float], baseline: Sequence[float], samples: int = 10_000, seed: int = 0,
                      level: float = 0.95, clusters: Sequence | None = None) -> dict[str, float]:
    """Mean of `values - baseline` (the same questions, in the same order) with its paired bootstrap interval; with
    `clusters` (each question's article) the draws resample articles (`cluster_bootstrap_interval`)."""
    values, baseline = np.asarray(values, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if values.shape != baseline.shape:
        raise ValueError(f"paired scores need the same questions: {values.shape} vs {baseline.shape}")
    if clusters is None:
        low, high = bootstrap_interval(values - baseline, samples, seed, level)
    else:
        low, high = cluster_bootstrap_interval(values - baseline, clusters, samples, seed, level)
    return {"difference": float((values - baseline).mean()), "low": low, "high": high}


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """(low, high) Wilson score interval of a proportion (Wilson 1927; Newcombe 1998, method 3), in [0, 1]: for scores
    kept only as counts, and at 0 or n successes, where a bootstrap of the samples collapses to a point (40 of 40 right
    reads 100-100 %, yet a true rate of 92 % gives 40 of 40 one time in 28)."""
    _check_proportion(successes, n)
    if successes == 0:  # the closed forms at the edges: exactly 0 and 1, not 1e-17 away from them
        return 0.0, z * z / (n + z * z)
    if successes == n:
        return n / (n + z * z), 1.0
    p = successes / n
    centre, half = p + z * z / (2 * n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return float((centre - half) / (1 + z * z / n)), float((centre + half) / (1 + z * z / n))


def proportion_difference(successes: int, n: int, baseline_successes: int, baseline_n: int) -> dict[str, float]:
    """p - p_baseline of two independent proportions with Newcombe's hybrid score interval (Newcombe 1998, "Interval
    estimation for the difference between independent proportions", method 10), built from each side's Wilson
    interval: (d - sqrt((p - l)^2 + (u_b - p_b)^2), d + sqrt((u - p)^2 + (p_b - l_b)^2)). Conservative for two scores
    of the same samples (a paired interval would be narrower)."""
    _check_proportion(successes, n)
    _check_proportion(baseline_successes, baseline_n)
    p, q = successes / n, baseline_successes / baseline_n
    (low, high), (low_b, high_b) = wilson_interval(successes, n), wilson_interval(baseline_successes, baseline_n)
    d = p - q
    return {"difference": d, "low": float(d - np.hypot(p - low, high_b - q)),
            "high": float(d + np.hypot(high - p, q - low_b))}


def _check_proportion(successes: int, n: int) -> None:
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"a proportion needs 0 <= successes <= n and n >= 1; got {successes} of {n}")


def bucket_summary(scores: dict[str, dict[str, float]], buckets: dict[str, str], names: Sequence[str],
                   baseline: dict[str, dict[str, float]] | None = None,
                   clusters: dict[str, str] | None = None) -> dict[str, dict]:
    """Per bucket ("all", then `names`): the questions, the mean EM and F1 with their bootstrap intervals, and with
    `baseline` (per-question scores of another method on the same questions) the paired F1 difference. `scores`
    maps question id -> {"exact_match", "f1"}; `buckets` maps question id -> bucket name; `clusters` (question id ->
    article) makes every interval a cluster bootstrap over articles and records how many articles each bucket holds."""
    summary = {}
    for bucket in ("all", *names):
        ids = [i for i in scores if bucket == "all" or buckets[i] == bucket]
        if not ids:
            continue
        summary[bucket] = {"questions": len(ids)}
        groups = None if clusters is None else [clusters[i] for i in ids]
        if groups is not None:
            summary[bucket]["articles"] = len(set(groups))
        for metric in ("exact_match", "f1"):
            values = [scores[i][metric] for i in ids]
            summary[bucket][metric] = sum(values) / len(values)
            summary[bucket][f"{metric}_interval"] = (bootstrap_interval(values) if groups is None
                                                     else cluster_bootstrap_interval(values, groups))
    if baseline is not None:
        for bucket, paired in paired_by_bucket(scores, buckets, names, baseline, clusters).items():
            summary[bucket]["f1_vs_baseline"] = paired
    return summary


def paired_by_bucket(scores: dict[str, dict[str, float]], buckets: dict[str, str], names: Sequence[str],
                     baseline: dict[str, dict[str, float]],
                     clusters: dict[str, str] | None = None) -> dict[str, dict[str, float]]:
    """Per bucket ("all", then `names`, those with questions): the paired F1 difference of `scores` from `baseline`
    on the same questions (`paired_difference`, resampling `clusters` when given); `bucket_summary`'s
    `f1_vs_baseline`, alone, for pairing a reading with a further baseline without summarising it again."""
    paired = {}
    for bucket in ("all", *names):
        ids = [i for i in scores if bucket == "all" or buckets[i] == bucket]
        if ids:
            paired[bucket] = paired_difference([scores[i]["f1"] for i in ids], [baseline[i]["f1"] for i in ids],
                                               clusters=None if clusters is None else [clusters[i] for i in ids])
    return paired
