"""Batching: pad lists of token-id features to the longest one (training, prediction, classification), and which
windows to read together (`plan_batches`: prediction and the server)."""

from __future__ import annotations

import torch


class PaddedBatches:
    """Pads a list of feature dicts to the longest one, rounded up to a multiple of `multiple` when given (a compiled
    encoder then sees one kind of length: compilation.batch_multiple); keeps labels as they are."""

    def __init__(self, pad_token_id: int, multiple: int | None = None):
        self.pad_token_id = pad_token_id
        self.multiple = multiple

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(len(item["input_ids"]) for item in items)
        if self.multiple:
            longest = -(-longest // self.multiple) * self.multiple
        batch: dict[str, torch.Tensor] = {}
        for key in items[0]:
            values = [item[key] for item in items]
            if isinstance(values[0], (list, tuple)):
                fill = self.pad_token_id if key == "input_ids" else 0
                batch[key] = torch.tensor([list(v) + [fill] * (longest - len(v)) for v in values], dtype=torch.long)
            else:
                batch[key] = torch.tensor(values)
        return batch


# A window joins a batch only if it is at least this share of the batch's longest window (see plan_batches).
MIN_BATCH_FILL = 0.75


def plan_batches(lengths: list[int], max_windows: int | None = None, max_tokens: int | None = None,
                 min_fill: float = MIN_BATCH_FILL) -> list[list[int]]:
    """Indices of windows grouped into padded batches, longest first (ties in the given order). A window joins the
    current batch while the batch keeps at most `max_windows` windows and `max_tokens` padded tokens (windows x
    longest; a window longer than the budget goes alone) and the window is at least `min_fill` of the batch's longest.

    Why the fill bound: padding costs about what real tokens cost, while batching windows of like length pays. Measured
    on a 2-core AMX Xeon in bf16 (benchmarks/batch_plan.py, `batch_plan_amx_bf16`): a 4,096-token document read by the
    long reader (windows of 4,096 and 2,096 tokens) took 1.21 s padded into one batch and 0.93 s one window at a time;
    `make qa-model`'s reader read 16 windows of 128 tokens 2.45x faster in one batch than one by one, 4 of 512 1.51x."""
    if max_windows is not None and max_windows < 1:
        raise ValueError(f"a batch holds at least one window; got max_windows={max_windows}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for index in order:
        if batches:
            batch = batches[-1]
            longest = lengths[batch[0]]
            if ((max_windows is None or len(batch) < max_windows)
                    and (max_tokens is None or (len(batch) + 1) * longest <= max_tokens)
                    and lengths[index] >= min_fill * longest):
                batch.append(index)
                continue
        batches.append([index])
    return batches
