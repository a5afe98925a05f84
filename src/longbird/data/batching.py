"""Batching: pad lists of token-id features to the longest one (training, prediction, classification)."""

from __future__ import annotations

import torch


class PaddedBatches:
    """Pads a list of feature dicts to the longest one; keeps labels as they are."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(len(item["input_ids"]) for item in items)
        batch: dict[str, torch.Tensor] = {}
        for key in items[0]:
            values = [item[key] for item in items]
            if isinstance(values[0], (list, tuple)):
                fill = self.pad_token_id if key == "input_ids" else 0
                batch[key] = torch.tensor([list(v) + [fill] * (longest - len(v)) for v in values], dtype=torch.long)
            else:
                batch[key] = torch.tensor(values)
        return batch
