"""BigBird ITC block-sparse attention, blocked and batched (no Python loop over blocks).

Global query blocks (first, last) attend densely to every key: (b, h, 2b, l) scores.
Middle query blocks gather their 5 + r key blocks with one advanced-indexing op and attend in one
batched matmul: (b, h, n-2, b, (5+r)b) scores, so time and memory are O(l (5+r) b).
Softmax is computed in fp32 whatever the input dtype (bf16 / autocast safe).
"""

from __future__ import annotations

import math

import torch

from .patterns import BigBirdPattern


def _masked_attention(query, key, value, mask, scale):
    """softmax(q k^T * scale) v with a bool mask, fp32 softmax, all-masked rows -> zeros."""
    scores = torch.matmul(query, key.transpose(-1, -2)).float() * scale
    scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1) * mask
    return torch.matmul(probs.to(value.dtype), value)


def bigbird_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_mask: torch.Tensor,
    pattern: BigBirdPattern,
) -> torch.Tensor:
    """query/key/value (b, h, l, d) with l = n * block; key_mask (b, l) bool, True = real token.

    Returns (b, h, l, d). The caller pads l to a block multiple (padding is masked as keys).
    """
    batch, heads, length, dim = query.shape
    n, block = pattern.num_blocks, pattern.block_size
    if length != n * block:
        raise ValueError(f"bigbird_attention expects length = num_blocks * block_size = {n * block}; got {length}")
    scale = 1.0 / math.sqrt(dim)

    # Global query blocks: dense rows over all keys.
    global_rows = [slice(0, block)] if n == 1 else [slice(0, block), slice(length - block, length)]
    global_query = torch.cat([query[:, :, rows] for rows in global_rows], dim=2)  # (b, h, 2b, d)
    global_out = _masked_attention(global_query, key, value, key_mask[:, None, None, :], scale)
    if n <= 2:
        return global_out

    # Middle query blocks: gather window + global + random key blocks per (head, block).
    indices, valid = pattern.middle_key_blocks()  # (h, n-2, m)
    indices, valid = indices.to(query.device), valid.to(query.device)
    m = indices.shape[-1]
    head_index = torch.arange(heads, device=query.device)[:, None, None]
    key_blocks = key.view(batch, heads, n, block, dim)[:, head_index, indices]  # (b, h, n-2, m, blk, d)
    value_blocks = value.view(batch, heads, n, block, dim)[:, head_index, indices]
    mask_blocks = key_mask.view(batch, n, block)[:, indices] & valid[None, :, :, :, None]  # (b, h, n-2, m, blk)
    middle_query = query.view(batch, heads, n, block, dim)[:, :, 1:-1]  # (b, h, n-2, blk, d)
    middle_out = _masked_attention(
        middle_query,
        key_blocks.reshape(batch, heads, n - 2, m * block, dim),
        value_blocks.reshape(batch, heads, n - 2, m * block, dim),
        mask_blocks.reshape(batch, heads, n - 2, 1, m * block),
        scale,
    ).reshape(batch, heads, (n - 2) * block, dim)
    return torch.cat([global_out[:, :, :block], middle_out, global_out[:, :, block:]], dim=2)
