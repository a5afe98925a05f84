"""Training items for linked windows (linked_windows.py, E7 round 13): each item is a group of sliding windows of one
question's document, read in one batch with the rows of the group linked.

A group holds every window with the answer and windows without it drawn at random from the same question's windows,
up to `size` windows, in document order. Why not all of a document's windows: E7's training questions have 17
512-token windows each on average (82,390 for 4,843 questions), where the sliding reader (`--negative-fraction 0.1`)
trains on about 2.9 (13,884); a few windows without the answer per question keep the budget on questions while every
group still holds windows to rank against each other. Questions whose answer is in no window (an answer longer than
the stride, or dropped by preprocessing) are left out and counted (`skipped`).
"""

from __future__ import annotations

import random

import torch

from .batching import PaddedBatches
from .windows import QAWindows


class WindowGroups:
    """Item i is {"windows": [window items]} (each as `QAWindows[j]`), one question's group. `windows`: a
    `QAWindows` built with `negative_fraction=1.0` (every window of every question); `windows.windows` is kept as
    the count before any draw."""

    def __init__(self, windows: QAWindows, size: int, seed: int = 0):
        if size < 1:
            raise ValueError(f"a group of linked windows holds at least one window; got {size}")
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
            drawn = rng.sample(negative, min(max(size - len(positive), 0), len(negative)))
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
