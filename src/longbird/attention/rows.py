"""Per-row attention plan for BigBird ITC: a document's output never depends on what it is batched with.

Every decision is made from the row's own real length l_i (last real token + 1), never from the padded batch:
full attention when l_i <= the full-attention threshold, else block-sparse over n_i = ceil(l_i / b) blocks, so the
last global block is the row's last real block and the layer's random plan is drawn over the row's n_i blocks
(random blocks never point into batch padding). Rows that share a decision (full, or the same n_i) form one group
and run as one kernel call on the group's rows cut to the group's length; a batch of equal-length rows is a single
group and costs what it did before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class RowGroup:
    """Rows that attend alike. `rows`: batch indices (None = every row); `length`: tokens they are cut to (n·b when
    sparse); `num_blocks`: 0 for full attention, else the rows' block count n_i."""

    rows: torch.Tensor | None
    length: int
    num_blocks: int

    @property
    def sparse(self) -> bool:
        return self.num_blocks > 0


def real_lengths_on_device(key_mask: torch.Tensor) -> torch.Tensor:
    """(B,) long: per row the index of its last real token + 1 (0 for a row with no real token), on the mask's
    device (no host synchronisation: the compiled graph's plan, `device_rows`, reads it there)."""
    length = key_mask.shape[1]
    last = length - key_mask.flip(-1).to(torch.int8).argmax(-1)
    return torch.where(key_mask.any(-1), last, 0)


def real_lengths(key_mask: torch.Tensor) -> list[int]:
    """Per row, the index of its last real token + 1 (0 for a row with no real token), read on the host."""
    return real_lengths_on_device(key_mask).tolist()


def plan_batch(length: int, block_size: int, full_max_length: int) -> list[RowGroup]:
    """One decision for the whole batch from its length (for traced graphs, which cannot read row lengths)."""
    if length <= full_max_length:
        return [RowGroup(None, length, 0)]
    blocks = -(-length // block_size)
    return [RowGroup(None, blocks * block_size, blocks)]


def plan_rows(key_mask: torch.Tensor, block_size: int, full_max_length: int) -> list[RowGroup]:
    """The batch's row groups (in order: full first, then by block count)."""
    lengths = real_lengths(key_mask)
    blocks = [0 if length <= full_max_length else -(-length // block_size) for length in lengths]
    groups = []
    for num_blocks in sorted(set(blocks)):
        members = [row for row, value in enumerate(blocks) if value == num_blocks]
        length = num_blocks * block_size if num_blocks else max(max(lengths[row] for row in members), 1)
        rows = None if len(members) == len(lengths) else torch.tensor(members, device=key_mask.device)
        groups.append(RowGroup(rows, length, num_blocks))
    if len(groups) == 1 and not groups[0].sparse:
        # Every row is short: one full-attention call over the whole (padded) batch, as without a plan.
        return plan_batch(key_mask.shape[1], block_size, key_mask.shape[1])
    return groups


def padded_length(groups: list[RowGroup], length: int) -> int:
    """The batch length the layers run at: the input length, or the longest sparse group's n·b if longer."""
    return max([length] + [group.length for group in groups])


def cut_to_group(x: torch.Tensor, group: RowGroup) -> torch.Tensor:
    """The group's rows of `x` ((B, H, l, d) or a (B, l) mask), cut to the group's length."""
    x = x if group.rows is None else x.index_select(0, group.rows)
    return x[:, :, :group.length] if x.dim() == 4 else x[:, :group.length]


def place_group(out: torch.Tensor, group: RowGroup, part: torch.Tensor) -> torch.Tensor:
    """`out` (B, H, l, d_v) with the group's output (its rows, its length) placed back; 0 past the group's length."""
    part = F.pad(part, (0, 0, 0, out.shape[2] - group.length))
    return part if group.rows is None else out.index_copy(0, group.rows, part)
