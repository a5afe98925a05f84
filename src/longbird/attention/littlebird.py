"""LittleBird attention kernels (Lee et al. 2022, §3.3): pack attention and unpack & sliding-window (USW).

Notation: b = block size, n = blocks, s = pack size, H = heads, d = head dim.
USWAttn(X, C) = softmax(Q(X) [K(C); K(X)]^T / √d − [D_C; D]) [V(C); V(X)]  (LittleBird §3.3), where each
query block sees only: the s packed keys (bias (β+γ)/2·b), the first block (global keys) and its own,
left and right blocks (BiALiBi bias from position ids). Blocked and batched: keys are rolled into
(n, s + 4b) groups, so time and memory are O(l (4b + s)); no l x l tensor is ever built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from .workspace import scratch_buffer


class BiALiBiSlopes(Protocol):
    """Per-head slopes (H,) and the packed-context distance (positions.alibi.BiALiBi satisfies this)."""

    alpha: torch.Tensor
    beta: torch.Tensor
    gamma: torch.Tensor

    def distance(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor: ...
    def pack_distance(self, block_size: int) -> torch.Tensor: ...


def pack_attention(pack_query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor,
                   dropout_p: float = 0.0):
    """C_p = Attn(P, X): pack queries (b, h, s, d) over all real tokens; key_mask (b, l). O(l s)."""
    return F.scaled_dot_product_attention(pack_query, key, value, attn_mask=key_mask[:, None, None, :],
                                          dropout_p=dropout_p)


def _neighbour_blocks(x: torch.Tensor, axis: int, fill) -> torch.Tensor:
    """Blocks on `axis`, tokens on `axis + 1`: returns each block's left, own and right block concatenated
    on the token axis (3b tokens), `fill` beyond the ends."""
    pad = [0, 0] * (x.dim() - axis - 1) + [1, 1]
    padded = F.pad(x, pad, value=fill)
    n = x.shape[axis]
    return torch.cat([padded.narrow(axis, offset, n) for offset in range(3)], dim=axis + 1)


@dataclass
class USWLayout:
    """Which keys each query block sees and their slope-free BiALiBi terms; computed once per forward
    (positions and padding are the same in every layer).

    Key order per query block: [global block 0 | left | own | right] = 4b keys.
    mask (B, n, 4b) bool; left/right/cls (B, 1, n, b, 4b) fp32 (see positions.alibi.bialibi_terms).
    """

    block_size: int
    mask: torch.Tensor
    left: torch.Tensor
    right: torch.Tensor
    cls: torch.Tensor


def usw_layout(key_mask: torch.Tensor, positions: torch.Tensor, block_size: int) -> USWLayout:
    from ..positions.alibi import bialibi_terms

    batch, length = key_mask.shape
    b = block_size
    n = length // b
    if n * b != length:
        raise ValueError(f"usw_attention expects length to be a multiple of block_size ({b}); got {length}")
    mask_blocks = key_mask.view(batch, n, b)
    position_blocks = positions.view(batch, n, b)
    # Blocks 0 and 1 already see block 0 in their window: mask the global copy so no key counts twice.
    global_mask = mask_blocks[:, :1].expand(-1, n, -1) & (torch.arange(n, device=key_mask.device) >= 2)[None, :, None]
    mask = torch.cat([global_mask, _neighbour_blocks(mask_blocks, 1, False)], dim=-1)
    key_positions = torch.cat([position_blocks[:, :1].expand(-1, n, -1), _neighbour_blocks(position_blocks, 1, 0)], -1)
    left, right, cls = (term[:, None] for term in bialibi_terms(position_blocks, key_positions))
    return USWLayout(b, mask, left, right, cls)


def _concat(groups, dim, workspace, name):
    """torch.cat, into a reused buffer at inference."""
    shape = list(groups[0].shape)
    shape[dim] = sum(group.shape[dim] for group in groups)
    out = scratch_buffer(workspace, name, shape, groups[0])
    return torch.cat(groups, dim=dim) if out is None else torch.cat(groups, dim=dim, out=out)


def usw_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: USWLayout,
    slopes: "BiALiBiSlopes",
    pack_key: torch.Tensor | None = None,
    pack_value: torch.Tensor | None = None,
    workspace: dict | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """query/key/value (B, H, l, d), l = n·b (the caller pads); `layout` from `usw_layout`; `slopes` has per-head
    alpha, beta, gamma and pack_distance(b); pack_key/pack_value (B, H, s, d) or None. Returns (B, H, l, d).
    `dropout_p`: attention dropout on the probabilities (0 outside training).

    Softmax and bias arithmetic run in fp32 whatever the input dtype. A query row with no allowed key (only
    possible in an all-padding row without pack tokens) gets an average of masked values, never used.
    """
    batch, heads, length, dim = query.shape
    b = layout.block_size
    n = length // b
    blocks = lambda x: x.view(batch, heads, n, b, dim)  # noqa: E731
    q, k, v = blocks(query), blocks(key), blocks(value)
    key_groups = [k[:, :, :1].expand(-1, -1, n, -1, -1), _neighbour_blocks(k, 2, 0.0)]
    value_groups = [v[:, :, :1].expand(-1, -1, n, -1, -1), _neighbour_blocks(v, 2, 0.0)]
    s = 0 if pack_key is None else pack_key.shape[2]
    mask = layout.mask
    if s:
        key_groups.insert(0, pack_key[:, :, None].expand(-1, -1, n, -1, -1))
        value_groups.insert(0, pack_value[:, :, None].expand(-1, -1, n, -1, -1))
        mask = torch.cat([mask.new_ones(batch, n, s), mask], dim=-1)
    keys = _concat(key_groups, 3, workspace, "keys")  # (B, H, n, s + 4b, d)
    values = _concat(value_groups, 3, workspace, "values")

    scores = torch.matmul(q, keys.transpose(-1, -2))  # (B, H, n, b, s + 4b)
    scores = scores.float() if scores.dtype != torch.float32 else scores
    scores.mul_(1.0 / math.sqrt(dim))
    # score − D with D = β·left + γ·right + α·cls (BiALiBi, LittleBird §3.1), in place: no (B, H, n, b, 4b) temps.
    local = scores[..., s:]
    for slope, term in ((slopes.beta, layout.left), (slopes.gamma, layout.right), (slopes.alpha, layout.cls)):
        local.addcmul_(term, slope.float().view(1, heads, 1, 1, 1), value=-1.0)
    if s:  # packed context: uniform distance (β+γ)/2·b (LittleBird §3.3, D_C)
        scores[..., :s].sub_(slopes.pack_distance(b).view(1, heads, 1, 1, 1))
    scores.masked_fill_(~mask[:, None, :, None, :], torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1)
    if dropout_p:
        probs = F.dropout(probs, dropout_p)
    out = torch.matmul(probs.to(values.dtype), values)
    return out.view(batch, heads, length, dim)


def usw_attention_reference(query, key, value, key_mask, positions, bias: BiALiBiSlopes, block_size,
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
