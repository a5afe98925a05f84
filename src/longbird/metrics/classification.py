"""Classification scores: accuracy and macro-F1 (unweighted mean of per-class F1 over the gold and
predicted classes; a class never predicted and never gold does not count)."""

from __future__ import annotations

from collections.abc import Sequence


def accuracy(predictions: Sequence, golds: Sequence) -> float:
    if len(predictions) != len(golds) or not golds:
        raise ValueError(f"need equally many predictions and gold labels, at least one; got {len(predictions)} "
                         f"and {len(golds)}")
    return sum(p == g for p, g in zip(predictions, golds)) / len(golds)


def macro_f1(predictions: Sequence, golds: Sequence) -> float:
    accuracy(predictions, golds)  # same length checks
    scores = []
    for label in set(golds) | set(predictions):
        true_positive = sum(p == label and g == label for p, g in zip(predictions, golds))
        predicted = sum(p == label for p in predictions)
        gold = sum(g == label for g in golds)
        scores.append(0.0 if true_positive == 0 else 2 * true_positive / (predicted + gold))
    return sum(scores) / len(scores)
