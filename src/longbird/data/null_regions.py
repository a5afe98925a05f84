"""Regional nulls: one "no answer here" token per region of a long QA window (issue 24, E7 round 4).

Why: the paragraph reader's start loss is a softmax over one 512-token window with `[CLS]` (the target of a window
without the answer) in it. That loss is blind to a constant added to every start logit of a window, so a sliding
reader ranks its windows by null-relative scores (span minus its window's `[CLS]`, qa.py). A 4096-token window has
one `[CLS]` for the whole article, and experiments/e7_diagnosis.py measured ranking across the article as most of
the long reader's loss to sliding windows. With `config.qa_null_every = R` the long window gets a null per region:
a copy of the window's first token (`[CLS]`) with position id 0 (the row the reader's `[CLS]` always had) is
inserted before document token i of the window for every i >= `config.full_attention_max_length` with
(i - full_attention_max_length) % R == 0. The first region (the source's window: question and first document
tokens) keeps the real `[CLS]` as its null; every later token belongs to the last null before it.

Training takes the start loss per region (region_losses.py `regional_start_loss`), decoding scores a span against its
own region's null (qa.py), as sliding windows score one against their window's `[CLS]`. Zero-shot, scoring against
inserted nulls every 128 tokens gained 4.6 F1 on 200 validation questions (experiments/results/e7_regional_null.md).
Positions: the window's tokens are numbered 0..n-1 after the insertion (each inserted token takes a place), the
nulls themselves 0, as in that probe.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def _nulls_within(length: int, after: int, every: int) -> int:
    """The most nulls a window of `length` tokens receives: one per `every` tokens past the first `after`."""
    return max(0, -(-(length - after) // every))


def is_null(region_nulls: torch.Tensor) -> torch.Tensor:
    """(..., l) bool: the tokens that are their own region's null (the [CLS] at 0 and every inserted one), from the
    (..., l) `region_nulls` of a batch."""
    return region_nulls == torch.arange(region_nulls.shape[-1], device=region_nulls.device)


@dataclass(frozen=True)
class NullRegions:
    """Where nulls go in one model's windows: before every `every`-th document token from index `after` on."""

    every: int  # document tokens per region past the first (config.qa_null_every)
    after: int  # tokens of the first region, whose null is the real [CLS] (config.full_attention_max_length)
    null_id: int  # the token inserted (the tokenizer's [CLS] / <s>)

    @classmethod
    def of(cls, config, tokenizer) -> NullRegions | None:
        """The regions of a model's config (None when `qa_null_every` is 0: one null per window, the [CLS])."""
        if not getattr(config, "qa_null_every", 0):
            return None
        if tokenizer.cls_token_id is None:
            raise ValueError("qa_null_every inserts the tokenizer's [CLS] token, and this tokenizer has none; set "
                             "qa_null_every=0")
        return cls(config.qa_null_every, config.full_attention_max_length, tokenizer.cls_token_id)

    @staticmethod
    def max_regions(config, length: int) -> int:
        """The most regions a window of `length` tokens (nulls included) of a model with `config` holds: the first
        ([CLS] at 0) and one per inserted null. Inserted nulls are `qa_null_every` + 1 tokens apart (a null, then its
        region's tokens) and come after the [CLS], wherever the window starts: in a whole window past the first
        region, in a cut of one (data/layout_cuts.py) right after its first block, so a bound that does not assume
        where the first one sits holds for both."""
        return 1 + _nulls_within(length, 1, max(1, config.qa_null_every) + 1)

    def count(self, length: int) -> int:
        """The most nulls a window of `length` tokens (before insertion) receives."""
        return _nulls_within(length, self.after, self.every)

    def null_indices(self, document: tuple[int, int]) -> np.ndarray:
        """Where `insert` puts the nulls, computed without building the window: their indices after insertion in a
        window whose document tokens are `document` = [first, stop) before insertion (one before every document token
        i >= `after` with (i - after) % every == 0; the k-th null moves k places)."""
        first, stop = document
        start = self.after + -(-max(0, first - self.after) // self.every) * self.every
        preceded = np.arange(start, stop, self.every, dtype=np.int64)
        return preceded + np.arange(len(preceded), dtype=np.int64)

    def room(self, max_length: int) -> int:
        """The longest window (before insertion) that still fits `max_length` tokens once its nulls are in."""
        length = max_length
        while length + self.count(length) > max_length:
            length -= 1
        return length

    def insert(self, input_ids: list[int], is_document: list[bool], token_type_ids: list[int] | None = None
               ) -> dict:
        """The window with its nulls: {"input_ids", "attention_mask", "position_ids", "region_nulls"[,
        "token_type_ids"]} (lists; `region_nulls[i]` is the index of token i's null, 0 in the first region) and
        "kept" (the new index of every old token), "nulls" (the inserted indices). An inserted token takes the
        token type of the document token it precedes."""
        ids, types, region_nulls, kept, nulls = [], [], [], [], []
        null = 0
        for index, token in enumerate(input_ids):
            if is_document[index] and index >= self.after and (index - self.after) % self.every == 0:
                null = len(ids)
                nulls.append(null)
                ids.append(self.null_id)
                region_nulls.append(null)
                if token_type_ids is not None:
                    types.append(token_type_ids[index])
            kept.append(len(ids))
            ids.append(token)
            region_nulls.append(null)
            if token_type_ids is not None:
                types.append(token_type_ids[index])
        positions = list(range(len(ids)))
        for index in nulls:
            positions[index] = 0
        item = {"input_ids": ids, "attention_mask": [1] * len(ids), "position_ids": positions,
                "region_nulls": region_nulls, "kept": kept, "nulls": nulls}
        if token_type_ids is not None:
            item["token_type_ids"] = types
        return item
