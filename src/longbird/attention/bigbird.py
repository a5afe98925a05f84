"""BigBird ITC block-sparse attention, blocked and batched (no Python loop over blocks).

Global query blocks (first, last) attend densely to every key: (B, H, 2b, l) scores.
Middle query blocks gather their 5 + r key blocks with one index_select and attend in one batched
SDPA call over (head, block) rows: (B, H(n-2), b, (5+r)b) scores, so time and memory are O(l (5+r) b).
SDPA's CPU kernels accumulate the softmax in fp32 whatever the input dtype (bf16 / autocast safe).
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from .patterns import BigBirdPattern
from .tracing import outside_the_trace
from .workspace import scratch_buffer


def _masked_attention(query, key, value, mask, dropout_p=0.0):
    """SDPA with a bool mask (True = may attend). SDPA gives zeros (and zero gradients) for rows with no
    allowed key, and a bool mask is faster on CPU than the equivalent additive float bias."""
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p)


def _gather_blocks(blocks, index, workspace, name):
    """index_select over (head, block) pairs, into a reused buffer at inference."""
    out = scratch_buffer(workspace, name, (blocks.shape[0], index.numel(), *blocks.shape[2:]), blocks)
    return blocks.index_select(1, index) if out is None else torch.index_select(blocks, 1, index, out=out)


@lru_cache(maxsize=512)
def _middle_key_blocks(pattern: BigBirdPattern, device: torch.device):
    """The pattern's block indices on the input's device, copied once per (layer plan, device); computed outside any
    trace (cached, and a constant of an exported graph)."""
    with outside_the_trace():
        return tuple(tensor.to(device) for tensor in pattern.middle_key_blocks())


def bigbird_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_mask: torch.Tensor,
    pattern: BigBirdPattern,
    workspace: dict | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """query/key/value (B, H, l, d) with l = n·b; key_mask (B, l) bool, True = real token.
    `dropout_p`: attention dropout on the probabilities (0 outside training).

    Returns (B, H, l, d_v): value may be wider than query/key (TAPE carries its position states beside V).
    The caller pads l to a block multiple (padding is masked as keys).
    `workspace`: an optional dict, owned by one forward call, in which inference reuses gather buffers.
    """
    batch, heads, length, dim = query.shape
    value_dim = value.shape[-1]
    n, block = pattern.num_blocks, pattern.block_size
    if length != n * block:
        raise ValueError(f"bigbird_attention expects length = num_blocks * block_size = {n * block}; got {length}")

    # Global query blocks: dense rows over all keys.
    global_rows = [slice(0, block)] if n == 1 else [slice(0, block), slice(length - block, length)]
    global_query = torch.cat([query[:, :, rows] for rows in global_rows], dim=2)  # (b, h, 2b, d)
    global_out = _masked_attention(global_query, key, value, key_mask[:, None, None, :].expand(batch, 1, 1, length),
                                   dropout_p)
    if n <= 2:
        return global_out

    # Middle query blocks: gather window + global + random key blocks per (head, block).
    indices, valid = _middle_key_blocks(pattern, query.device)  # (H, n-2, 5+r)
    m = indices.shape[-1]
    # One index_select over (head, block) pairs: much faster than advanced indexing on CPU.
    flat = (torch.arange(heads, device=query.device)[:, None, None] * n + indices).reshape(-1)
    key_blocks = _gather_blocks(key.reshape(batch, heads * n, block, dim), flat, workspace, "key")
    value_blocks = _gather_blocks(value.reshape(batch, heads * n, block, value_dim), flat, workspace, "value")
    mask_blocks = key_mask.view(batch, n, block)[:, indices] & valid[None, :, :, :, None]  # (B, H, n-2, 5+r, b)
    middle_query = query.view(batch, heads, n, block, dim)[:, :, 1:-1]  # (B, H, n-2, b, d)
    rows = heads * (n - 2)
    middle_out = _masked_attention(
        middle_query.reshape(batch, rows, block, dim),
        key_blocks.view(batch, rows, m * block, dim),
        value_blocks.view(batch, rows, m * block, value_dim),
        mask_blocks.reshape(batch, rows, 1, m * block), dropout_p,
    ).reshape(batch, heads, (n - 2) * block, value_dim)  # CUDA SDPA may return a non-contiguous layout
    return torch.cat([global_out[:, :, :block], middle_out, global_out[:, :, block:]], dim=2)
