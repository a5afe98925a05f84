"""Padding Insertion (LittleBird §3.4, §4.4): train on short inputs as if they were long.

After a sentence-ending token, with probability `probability`, the position ids of everything that follows
jump by a gap drawn from U(0, max_gap) (both ends included). No token is added: inserting masked padding
would only change BiALiBi distances, so changing position ids is the same thing for free. Tokens, labels,
answer positions and masks keep their indices; only `position_ids` change, and they never decrease.

Where the gaps come from: called with a `key` (the trainer passes the optimiser step, the micro-batch within it and
the process), each row's gaps are drawn from a generator seeded by `mixed_seed(seed, *key, row)`, so they are a pure
function of that key and a run resumed from a checkpoint draws exactly what the uninterrupted run drew (the
generator's state is never part of a checkpoint). Without a key they come from one generator seeded once, as a
stand-alone collator has no step to key by.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..data.null_regions import is_null

SENTENCE_ENDINGS = (".", "?", "!")
_PIECE_MARKERS = ("##", "Ġ", "▁")  # WordPiece, byte-level BPE and SentencePiece word markers


def sentence_end_token_ids(tokenizer, endings: Iterable[str] = SENTENCE_ENDINGS) -> list[int]:
    """Ids of every vocabulary piece that ends a sentence: ".", "?", "!" alone or as a tokenizer piece
    such as "##." or "▁." (and pieces like "...")."""
    endings = tuple(endings)
    ids = []
    for piece, index in tokenizer.get_vocab().items():
        text = piece
        for marker in _PIECE_MARKERS:
            text = text.replace(marker, "")
        if text and all(character in "".join(endings) for character in text):
            ids.append(index)
    if not ids:
        raise ValueError(f"no token of this tokenizer ends a sentence with {endings}; pass sentence_end_ids")
    return sorted(ids)


def mixed_seed(*parts: int) -> int:
    """A torch.Generator seed (63 bits) that is a pure function of integers: blake2b of their 8-byte forms, so
    neighbouring keys (step 7 and 8, row 0 and 1) seed unrelated streams, the same on every machine and in every
    process (Python's `hash` of a tuple is not promised to stay the same across versions)."""
    data = b"".join(int(part).to_bytes(8, "little", signed=True) for part in parts)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


class PaddingInsertion:
    """Callable on a collated batch dict with `input_ids` (B, l) and optionally `attention_mask`/`position_ids`."""

    def __init__(self, sentence_end_ids: Iterable[int], probability: float = 0.2, max_gap: int = 256,
                 seed: int | None = None, max_positions: int | None = None):
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"probability must lie in [0, 1]; got {probability}")
        if max_gap < 0:
            raise ValueError(f"max_gap must be >= 0; got {max_gap}")
        self.sentence_end_ids = torch.tensor(sorted(set(sentence_end_ids)), dtype=torch.long)
        self.probability = probability
        self.max_gap = max_gap
        # A learned position table (`config.uses_position_table`: absolute positions, TAPE over a converted source)
        # has `max_positions` rows: gaps that would run past it are scaled down.
        self.max_positions = max_positions
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed) if seed is not None else None

    def _draws(self, shape: torch.Size, key: tuple[int, ...] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, l) uniform draws in [0, 1) and (B, l) gap sizes in 0..max_gap."""
        if key is None:
            return (torch.rand(shape, generator=self.generator),
                    torch.randint(0, self.max_gap + 1, shape, generator=self.generator))
        if self.seed is None:
            raise ValueError("keyed Padding Insertion draws need a seed: PaddingInsertion(..., seed=...)")
        draws, sizes = [], []
        for row in range(shape[0]):  # one generator per row: a row's gaps do not depend on the rows beside it
            generator = torch.Generator().manual_seed(mixed_seed(self.seed, *key, row))
            draws.append(torch.rand(shape[1:], generator=generator))
            sizes.append(torch.randint(0, self.max_gap + 1, shape[1:], generator=generator))
        return torch.stack(draws), torch.stack(sizes)

    def gaps(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
             key: tuple[int, ...] | None = None) -> torch.Tensor:
        """(B, l) long: the gap inserted right after each token (0 almost everywhere). With `key`, a pure function
        of (seed, key, row); without, the next draws of the instance's generator."""
        is_end = torch.isin(input_ids, self.sentence_end_ids.to(input_ids.device))
        if attention_mask is not None:
            is_end &= attention_mask.bool()
        draw, size = self._draws(input_ids.shape, key)
        return (is_end & (draw < self.probability).to(is_end.device)).long() * size.to(input_ids.device)

    def __call__(self, batch: dict[str, Any], key: tuple[int, ...] | None = None) -> dict[str, Any]:
        input_ids = batch["input_ids"]
        positions = batch.get("position_ids")
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        gaps = self.gaps(input_ids, batch.get("attention_mask"), key)
        if self.max_positions is not None:
            room = (self.max_positions - 1 - positions.max(dim=1).values).clamp(min=0)  # (B,)
            total = gaps.sum(dim=1)
            scale = torch.where(total > room, room / total.clamp(min=1), torch.ones_like(room, dtype=torch.float))
            gaps = (gaps * scale[:, None]).floor().long()
        shift = torch.cumsum(gaps, dim=1) - gaps  # a gap applies to the tokens after the sentence end
        shifted = positions + shift
        if batch.get("region_nulls") is not None:  # regional nulls (data/null_regions.py) stay at position 0
            shifted = shifted.masked_fill(is_null(batch["region_nulls"]), 0)
        return {**batch, "position_ids": shifted}


class PaddingInsertionCollator:
    """Wraps a collator; applies Padding Insertion only in training mode (`.train()` / `.eval()`). For use outside
    the longbird trainer: it draws from the instance's generator, which a resumed run restarts from its seed
    (`LongBirdTrainer(padding_insertion=...)` keys the draws by step instead and resumes exactly)."""

    def __init__(self, collator: Callable[[list], dict], padding_insertion: PaddingInsertion):
        self.collator = collator
        self.padding_insertion = padding_insertion
        self.training = True

    def train(self, mode: bool = True) -> PaddingInsertionCollator:
        self.training = mode
        return self

    def eval(self) -> PaddingInsertionCollator:
        return self.train(False)

    def __call__(self, features: list) -> dict:
        batch = self.collator(features)
        return self.padding_insertion(batch) if self.training else batch
