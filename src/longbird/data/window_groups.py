"""Training items for linked windows (linked_windows.py, E7 round 13): each item is a group of sliding windows of one
question's document, read in one batch with the rows of the group linked.

A group holds every window with the answer and windows without it drawn at random from the same question's windows,
up to `size` windows, in document order. Why not all of a document's windows: E7's training questions have 17
512-token windows each on average (82,390 for 4,843 questions), where the sliding reader (`--negative-fraction 0.1`)
trains on about 2.9 (13,884); a few windows without the answer per question keep the budget on questions while every
group still holds windows to rank against each other. Questions whose answer is in no window (an answer longer than
the stride, or dropped by preprocessing) are left out and counted (`skipped`).

Which windows without the answer (`negatives`): "random" draws them uniformly; "lexical" takes those whose text matches
the question best by BM25 (Robertson & Zaragoza 2009, Okapi BM25 with rank_bm25's defaults k1 = 1.5, b = 0.75, its
IDF over that question's windows), the distractors a reader most confuses with the answer's window. Clark & Gardner
(2018, "Simple and Effective Multi-Paragraph Reading Comprehension", sec. 3.3) train their shared-normalisation
objective, the cross-window ranking term here, on the paragraphs a TF-IDF ranker puts first. Scored on the
tokenizer's ids (subwords), each distinct question token once; ties keep document order.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from rank_bm25 import BM25Okapi

from .batching import PaddedBatches
from .windows import QAWindows

NEGATIVES = ("random", "lexical")


def lexical_order(windows: QAWindows, indices: list[int]) -> list[int]:
    """`indices` (windows of one question) from the best BM25 match of the question's tokens to the worst."""
    question = windows.questions[int(windows.items[indices[0], 0])]
    texts = [windows.documents[int(windows.items[i, 1])].ids[windows.items[i, 2]:windows.items[i, 3]].tolist()
             for i in indices]
    scores = BM25Okapi(texts).get_scores(list(dict.fromkeys(question)))
    return [indices[k] for k in np.argsort(-scores, kind="stable")]


class WindowGroups:
    """Item i is {"windows": [window items]} (each as `QAWindows[j]`), one question's group. `windows`: a
    `QAWindows` built with `negative_fraction=1.0` (every window of every question); `windows.windows` is kept as
    the count before any draw. `negatives`: how the windows without the answer are chosen (one of `NEGATIVES`)."""

    def __init__(self, windows: QAWindows, size: int, seed: int = 0, negatives: str = "random"):
        if size < 1:
            raise ValueError(f"a group of linked windows holds at least one window; got {size}")
        if negatives not in NEGATIVES:
            raise ValueError(f"negatives {negatives!r} is not one of {', '.join(NEGATIVES)}")
        self.long, self.size, self.windows = windows, size, windows.windows
        rng = random.Random(seed)
        by_question: dict[int, list[int]] = {}
        for index, question in enumerate(windows.items[:, 0].tolist()):
            by_question.setdefault(question, []).append(index)
        self.groups: list[list[int]] = []
        self.skipped = 0
        for indices in by_question.values():
            positive = [i for i in indices if windows.items[i, 4] > 0]
            if not positive:
                self.skipped += 1
                continue
            negative = [i for i in indices if windows.items[i, 4] == 0]
            wanted = min(max(size - len(positive), 0), len(negative))
            if negatives == "lexical":
                drawn = lexical_order(windows, negative)[:wanted] if wanted else []
            else:
                drawn = rng.sample(negative, wanted)
            self.groups.append(sorted(positive[:size] + drawn))

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, index: int) -> dict:
        return {"windows": [self.long[i] for i in self.groups[index]]}

    def lengths(self) -> list[int]:
        """Tokens of every group (its windows' lengths summed), without building the items."""
        window_lengths = self.long.lengths()
        return [sum(window_lengths[i] for i in group) for group in self.groups]


class LinkedBatches:
    """Collates groups into one padded batch of their windows with `document_ids` (B,): the group each row is from."""

    def __init__(self, pad_token_id: int):
        self.pad = PaddedBatches(pad_token_id)

    def __call__(self, groups: list[dict]) -> dict[str, torch.Tensor]:
        rows = [window for group in groups for window in group["windows"]]
        batch = self.pad(rows)
        batch["document_ids"] = torch.tensor([g for g, group in enumerate(groups) for _ in group["windows"]])
        return batch
