"""LittleBird attention kernels (Lee et al. 2022, §3.3): pack attention and unpack & sliding-window (USW).

Notation: b = block size, n = blocks, s = pack size, H = heads, d = head dim.
USWAttn(X, C) = softmax(Q(X) [K(C); K(X)]^T / √d − [D_C; D]) [V(C); V(X)]  (LittleBird §3.3), where each
query block sees only: the s packed keys (bias (β+γ)/2·b), the first block (global keys) and its own,
left and right blocks (BiALiBi bias from position ids). Blocked and batched: keys are rolled into
(n, s + 4b) groups, so time and memory are O(l (4b + s)); no l x l tensor is ever built.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F


class PositionBias(Protocol):
    def distance(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor: ...
    def pack_distance(self, block_size: int) -> torch.Tensor: ...


def pack_attention(pack_query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor):
    """C_p = Attn(P, X): pack queries (b, h, s, d) over all real tokens; key_mask (b, l). O(l s)."""
    return F.scaled_dot_product_attention(pack_query, key, value, attn_mask=key_mask[:, None, None, :])


def _neighbour_blocks(x: torch.Tensor, axis: int, fill) -> torch.Tensor:
    """Blocks on `axis`, tokens on `axis + 1`: returns each block's left, own and right block concatenated
    on the token axis (3b tokens), `fill` beyond the ends."""
    pad = [0, 0] * (x.dim() - axis - 1) + [1, 1]
    padded = F.pad(x, pad, value=fill)
    n = x.shape[axis]
    return torch.cat([padded.narrow(axis, offset, n) for offset in range(3)], dim=axis + 1)


def usw_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_mask: torch.Tensor,
    positions: torch.Tensor,
    bias: PositionBias,
    block_size: int,
    pack_key: torch.Tensor | None = None,
    pack_value: torch.Tensor | None = None,
) -> torch.Tensor:
    """query/key/value (B, H, l, d), l = n·b (the caller pads); key_mask (B, l) bool; positions (B, l) long;
    pack_key/pack_value (B, H, s, d) or None (pack_size 0). Returns (B, H, l, d).

    Softmax and bias arithmetic run in fp32 whatever the input dtype.
    """
    batch, heads, length, dim = query.shape
    b = block_size
    n = length // b
    if n * b != length:
        raise ValueError(f"usw_attention expects length to be a multiple of block_size ({b}); got {length}")
    blocks = lambda x: x.view(batch, heads, n, b, dim)  # noqa: E731
    q, k, v = blocks(query), blocks(key), blocks(value)
    mask_blocks = key_mask.view(batch, n, b)
    position_blocks = positions.view(batch, n, b)

    # Keys per query block: [global block 0 | left | own | right] (+ packed context in front).
    window_k, window_v = _neighbour_blocks(k, 2, 0.0), _neighbour_blocks(v, 2, 0.0)  # (B, H, n, 3b, d)
    window_mask = _neighbour_blocks(mask_blocks, 1, False)  # (B, n, 3b)
    window_positions = _neighbour_blocks(position_blocks, 1, 0)
    global_k = k[:, :, :1].expand(-1, -1, n, -1, -1)
    global_v = v[:, :, :1].expand(-1, -1, n, -1, -1)
    # Blocks 0 and 1 already see block 0 in their window: mask the global copy so no key counts twice.
    global_mask = mask_blocks[:, :1].expand(-1, n, -1) & (torch.arange(n, device=query.device) >= 2)[None, :, None]
    global_positions = position_blocks[:, :1].expand(-1, n, -1)

    key_groups = [global_k, window_k]
    value_groups = [global_v, window_v]
    distance = torch.cat([bias.distance(position_blocks, global_positions),
                          bias.distance(position_blocks, window_positions)], dim=-1)  # (B, n, H, b, 4b)
    mask = torch.cat([global_mask, window_mask], dim=-1)  # (B, n, 4b)
    if pack_key is not None and pack_key.shape[2] > 0:
        s = pack_key.shape[2]
        key_groups.insert(0, pack_key[:, :, None].expand(-1, -1, n, -1, -1))
        value_groups.insert(0, pack_value[:, :, None].expand(-1, -1, n, -1, -1))
        pack_distance = bias.pack_distance(b).view(1, 1, heads, 1, 1).expand(batch, n, heads, b, s)
        distance = torch.cat([pack_distance, distance], dim=-1)
        mask = torch.cat([mask.new_ones(batch, n, s), mask], dim=-1)
    keys = torch.cat(key_groups, dim=3)  # (B, H, n, s + 4b, d)
    values = torch.cat(value_groups, dim=3)

    scores = torch.matmul(q, keys.transpose(-1, -2)).float() / math.sqrt(dim)  # (B, H, n, b, s + 4b)
    scores = scores - distance.permute(0, 2, 1, 3, 4)  # score − D (BiALiBi, LittleBird §3.1)
    allowed = mask[:, None, :, None, :]  # (B, 1, n, 1, s + 4b)
    scores = scores.masked_fill(~allowed, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1) * allowed  # all-masked rows -> zeros, as the reference
    out = torch.matmul(probs.to(values.dtype), values)
    return out.view(batch, heads, length, dim)


def usw_attention_reference(query, key, value, key_mask, positions, bias: PositionBias, block_size,
                            pack_key=None, pack_value=None):
    """Dense oracle for `usw_attention`: the pattern and BiALiBi bias materialised as (l, s + l) tensors."""
    from .patterns import sliding_window_mask
    from .reference import reference_attention

    batch, heads, length, _ = query.shape
    mask = sliding_window_mask(length // block_size, block_size).to(query.device)[None] & key_mask[:, None, :]
    distance = bias.distance(positions, positions)  # (B, H, l, l)
    if pack_key is not None and pack_key.shape[2] > 0:
        s = pack_key.shape[2]
        mask = torch.cat([mask.new_ones(batch, length, s), mask], dim=-1)
        pack_distance = bias.pack_distance(block_size).view(1, heads, 1, 1).expand(batch, heads, length, s)
        distance = torch.cat([pack_distance, distance], dim=-1)
        key, value = torch.cat([pack_key, key], dim=2), torch.cat([pack_value, value], dim=2)
    return reference_attention(query, key, value, mask[:, None], -distance)
