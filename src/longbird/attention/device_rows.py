"""BigBird's per-row plan made on the device: every row attends as the eager plan says, with no host synchronisation.

The eager plan (`rows.py`) reads each row's real length l_i on the host (`.tolist()`) and runs each group of alike
rows at its own length. A compiled graph cannot branch on l_i, and on a GPU the read itself is a host
synchronisation, which a CUDA graph cannot capture (issue 27, item 3: no synchronisation in a forward for a batch of
given shape). Here one fixed-shape computation over a (B, L = N·b) batch chooses each row's key blocks from l_i on
the device, with the eager plan's decisions (Zaheer et al. 2020 §2, ITC, for the sparse rows):

- a **sparse row** (l_i > F, the full-attention threshold; n_i = ceil(l_i / b) blocks) reads, in each middle query
  block, the key blocks of its own pattern `bigbird_pattern(n_i, ...)` (first global block, window, last global block
  n_i - 1 under ITC, random blocks drawn over its own n_i blocks); under ITC its last block n_i - 1 reads every real
  key, and block 0 reads every key (ITC) or the first `first_block_reach` key blocks;
- a **full row** (l_i <= F) reads, in every query block, its first ceil(F / b) key blocks, which hold all its real
  keys: dense attention over them, as the eager plan's full-attention call;
- query blocks past a row's end (j >= n_i) give 0.

So every real token's output equals the eager plan's up to the order of summation. The cost for a batch of equal
rows is the blocked kernel's (`bigbird.py`: the same gathered key blocks, one SDPA call), plus the per-row tables.
The random blocks of every possible n_i come from one table per layer for the model's longest input, drawn outside
any trace by `bigbird_pattern`'s own draw (a graph holds it as a constant).
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from .full import as_wide_as_value
from .patterns import bigbird_pattern, local_window
from .rows import real_lengths_on_device
from .tracing import exporting, outside_the_trace


def _table_of_layer(layer: int):
    """The random table's accessor for one layer index, which a graph holds as a constant
    (`torch.compiler.assume_constant_result`: called once at trace time, never traced). One function per layer index
    because torch 2.13's Dynamo names the constant after the function's code object and fails on a second call in
    the same graph ("source ConstantSource(source_name='...') already in seen_sources"); each layer is called once."""
    def table(*plan) -> torch.Tensor:
        return _drawn_random_table(*plan)

    name = f"longbird_random_table_layer_{layer}"
    table.__code__ = table.__code__.replace(co_name=name)  # the name Dynamo gives the constant
    table.__name__ = table.__qualname__ = name
    return torch.compiler.assume_constant_result(table)


_TABLE_OF_LAYER = tuple(_table_of_layer(layer) for layer in range(256))  # a deeper model reuses one: Dynamo's error


@lru_cache(maxsize=96)  # the layers of a few models
def _drawn_random_table(max_blocks: int, block_size: int, num_heads: int, full_max_length: int,
                        num_random_blocks: int, seed: int, layer: int, random_blocks: str, first_block_reach: int,
                        last_global: bool, chunk_blocks: int, device: str) -> torch.Tensor:
    """(M + 1, H, M, r) int16 for rows of up to M blocks: row n holds, at slot j - 1 of middle query block j, the
    random key blocks of `bigbird_pattern(n, ...)` (-1 where the pattern has none, and in the rows of every n no
    sparse row can have). A plan depends on n alone, not on the batch's padded length, so the table for the model's
    longest input serves every length, also a graph compiled with dynamic shapes, whose length is symbolic, and the
    graphs of all lengths share it (at 8,192 tokens in blocks of 64, 12 heads and 3 random blocks: 1.2 MB per layer;
    it grows as M², 19 MB per layer at 32K)."""
    r = num_random_blocks
    with outside_the_trace():
        # one slot more than the M - 1 middle blocks: a graph's slice [:N - 1] then never takes the whole dimension,
        # which torch.export would otherwise guard on (an exported range up to M blocks failed at N = M)
        table = torch.full((max_blocks + 1, num_heads, max_blocks, r), -1, dtype=torch.int16)
        smallest_sparse = full_max_length // block_size + 1  # n_i of the shortest row with l_i > F
        for n in range(max(smallest_sparse, 2), max_blocks + 1):
            # the uncached draw: these patterns would only crowd the eager plan's cache
            drawn = bigbird_pattern.__wrapped__(n, block_size, num_heads, r, seed, layer, random_blocks,
                                                first_block_reach, last_global, chunk_blocks).random_blocks  # (H, m, r)
            table[n, :, :drawn.shape[1]] = drawn
        return table.to(device)


def _middle_key_blocks(blocks, full, full_blocks: int, plan, heads: int, n_max: int, device):
    """Per row, head and middle query block j = 1..N-1 (slot j - 1): the key blocks it reads (B, H, N-1, K) long,
    which of them count (bool, same shape), and which query blocks lie outside the row's middle ((B, 1, N-1, 1):
    its last global block under ITC, its padding blocks). A sparse row's columns come in the eager kernel's order:
    first global block, window, last global block (ITC), random blocks; a full row's are its first ceil(F / b)
    blocks. An outside block reads block 0 alone (dropped by the caller): a query with no key is NaN on some
    backends, and NaN times a zero gradient is NaN in backward."""
    batch = blocks.shape[0]
    b, threshold = plan.block_size, plan.full_max_length
    middle = torch.arange(1, n_max, device=device)
    window = local_window(middle, plan.chunk_blocks)  # (N-1, w), unclamped
    last_block = blocks - 1
    window_end = last_block if plan.last_global else blocks  # a window block lies before it (ITC: not the global one)
    window_valid = (window > 0) & (window < window_end[:, None, None])  # (B, N-1, w)
    columns = [torch.zeros_like(window[:, :1]).expand(batch, -1, -1), window.clamp(0, n_max - 1).expand(batch, -1, -1)]
    valid = [torch.ones_like(window_valid[..., :1]), window_valid]
    if plan.last_global:
        columns.append(last_block.clamp(min=0)[:, None, None].expand(-1, n_max - 1, 1))
        valid.append(torch.ones_like(window_valid[..., :1]))
    columns = torch.cat(columns, -1)[:, None].expand(-1, heads, -1, -1)  # (B, H, N-1, 1 + w [+ 1])
    valid = torch.cat(valid, -1)[:, None].expand(-1, heads, -1, -1)
    if plan.num_random_blocks:
        # plain constants for Dynamo's assume_constant_result (it refuses its lazily read dataclass fields)
        table = _TABLE_OF_LAYER[plan.layer % len(_TABLE_OF_LAYER)](
            int(plan.max_blocks), int(b), int(heads), int(threshold), int(plan.num_random_blocks), int(plan.seed),
            int(plan.layer), str(plan.random_blocks), int(plan.first_block_reach), bool(plan.last_global),
            int(plan.chunk_blocks), str(device))
        drawn = table[blocks][:, :, :n_max - 1].long()  # (B, H, N-1, r)
        columns = torch.cat([columns, drawn.clamp(min=0)], -1)
        valid = torch.cat([valid, drawn >= 0], -1)
    width = max(columns.shape[-1], full_blocks)
    slot = torch.arange(width, device=device)
    full_columns = slot.clamp(max=full_blocks - 1)
    full_valid = (full_columns < blocks[:, None]) & (slot < full_blocks)  # (B, K)
    columns = F.pad(columns, (0, width - columns.shape[-1]))
    valid = F.pad(valid, (0, width - valid.shape[-1]), value=False)
    is_full = full[:, None, None, None]
    columns = torch.where(is_full, full_columns, columns)
    # bool selections as logic, not torch.where: ONNX Runtime has no Where over bool values (exports, docs/export.md)
    valid = (is_full & full_valid[:, None, None, :]) | (~is_full & valid)
    middle_end = torch.where(full | (not plan.last_global), blocks, last_block)  # one past the row's last middle block
    outside = (middle[None, :] >= middle_end[:, None])[:, None, :, None]
    return torch.where(outside, 0, columns), (outside & (slot == 0)) | (~outside & valid), outside


def _exported_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """SDPA's mask: the bool mask itself, except under torch.export, where it becomes the additive 0 / -inf mask. The
    ONNX exporter writes SDPA with a bool mask as a Where over the whole score tensor plus a NaN guard after the
    softmax (IsNaN, Where): 29 % of ONNX Runtime's kernel time at 2K tokens (e5-small, docs/export.md); an additive
    mask is one Add. Every query this plan keeps reads at least one key, so no softmax row is all -inf; the rows that
    read none (an empty row's blocks) are dropped by `torch.where`, which does not carry their NaN."""
    if not exporting():
        return mask  # bool: faster than an additive float mask in SDPA's CPU kernels
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def bigbird_rows_on_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor,
                           plan, dropout_p: float = 0.0) -> torch.Tensor:
    """One BigBird layer with each row's own plan, chosen on the device. query/key (B, H, L, d), value (B, H, L, d_v),
    L = N·b > F; key_mask (B, L) bool; `plan` a `dispatch.PlanInGraph` (the layer and the config's pattern
    arguments). Returns (B, H, L, d_v); 0 in the blocks past each row's end."""
    # TAPE's wider V: q and k padded to its width on the CPU, as in the blocked kernel (attention/full.py)
    query, key, scale = as_wide_as_value(query, key, value)
    batch, heads, length, dim = query.shape
    value_dim = value.shape[-1]
    b, threshold = plan.block_size, plan.full_max_length
    n_max = length // b
    if n_max * b != length or length <= threshold:
        raise ValueError(f"bigbird_rows_on_device expects a block multiple longer than {threshold} tokens; got "
                         f"{length} at block {b}")
    device = query.device
    lengths = real_lengths_on_device(key_mask)
    blocks = (lengths + b - 1) // b  # n_i
    full = lengths <= threshold
    full_blocks = -(-threshold // b)  # a full row's real keys lie in its first ceil(F / b) blocks
    last_block = blocks - 1
    columns, valid, outside = _middle_key_blocks(blocks, full, full_blocks, plan, heads, n_max, device)
    width = columns.shape[-1]
    first_slot = torch.arange(width, device=device) == 0

    rows = torch.arange(batch, device=device)[:, None, None, None]
    head_index = torch.arange(heads, device=device)[None, :, None, None]
    key_blocks = key.reshape(batch, heads, n_max, b, dim)[rows, head_index, columns]  # (B, H, N-1, K, b, d)
    value_blocks = value.reshape(batch, heads, n_max, b, value_dim)[rows, head_index, columns]
    mask = key_mask.view(batch, n_max, b)[rows, columns] & valid[..., None]  # (B, H, N-1, K, b)
    mask = mask | (outside[..., None] & first_slot[:, None])  # the dropped blocks read block 0 whatever its mask
    slots = heads * (n_max - 1)
    middle_out = F.scaled_dot_product_attention(
        query.reshape(batch, heads, n_max, b, dim)[:, :, 1:].reshape(batch, slots, b, dim),
        key_blocks.reshape(batch, slots, width * b, dim), value_blocks.reshape(batch, slots, width * b, value_dim),
        attn_mask=_exported_mask(mask.reshape(batch, slots, 1, width * b), query.dtype), dropout_p=dropout_p,
        scale=scale,
    ).reshape(batch, heads, n_max - 1, b, value_dim)

    # Block 0: every key (ITC) or its first `first_block_reach` blocks; a full row's first ceil(F / b) blocks.
    reach = plan.first_block_reach
    prefix = length if reach <= 0 else min(reach * b, length)
    read = max(prefix, min(full_blocks * b, length))
    first_mask = key_mask[:, :read] & ((torch.arange(read, device=device) < prefix)[None] | full[:, None])
    first_out = F.scaled_dot_product_attention(query[:, :, :b], key[:, :, :read], value[:, :, :read],
                                               attn_mask=_exported_mask(first_mask[:, None, None, :], query.dtype),
                                               dropout_p=dropout_p, scale=scale)
    out = torch.cat([first_out[:, :, None], middle_out], dim=2)  # (B, H, N, b, d_v)
    block_index = torch.arange(n_max, device=device)[None, :]
    if plan.last_global:  # a sparse row's last block n_i - 1 reads every real key
        last_query = query.reshape(batch, heads, n_max, b, dim)[torch.arange(batch, device=device), :,
                                                                 last_block.clamp(min=0)]  # (B, H, b, d)
        last_out = F.scaled_dot_product_attention(last_query, key, value,
                                                  attn_mask=_exported_mask(key_mask[:, None, None, :], query.dtype),
                                                  dropout_p=dropout_p, scale=scale)
        is_last = ((block_index == last_block[:, None]) & ~full[:, None])[:, None, :, None, None]
        out = torch.where(is_last, last_out[:, :, None], out)
    inside = (block_index < blocks[:, None])[:, None, :, None, None]
    return torch.where(inside, out, 0).reshape(batch, heads, length, value_dim)
