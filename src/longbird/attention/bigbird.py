"""BigBird ITC block-sparse attention, blocked and batched (no Python loop over blocks).

Global query blocks (first, last) attend densely to every key: (B, H, 2b, l) scores ("first-reads-source": block 0
reads the first blocks only, and there is no last global block).
Middle query blocks gather their k key blocks (k = 5 + r under ITC's sliding window; 1 + w + r in general, w the
window's blocks, `BigBirdPattern.middle_key_blocks`) with one index_select and attend in one batched SDPA call over
(head, block) rows: (B, H(n-2), b, k·b) scores, so time and memory are O(l k b).
SDPA's CPU kernels accumulate the softmax in fp32 whatever the input dtype (bf16 / autocast safe).
"""

from __future__ import annotations

from functools import lru_cache, partial

import torch
import torch.nn.functional as F

from . import cpu_kernel
from .full import as_wide_as_value
from .patterns import BigBirdPattern
from .token_major import empty_token_major
from .tracing import outside_the_trace
from .workspace import scratch_buffer


def _masked_attention(query, key, value, mask, dropout_p=0.0, scale=None):
    """SDPA with a bool mask (True = may attend). SDPA gives zeros (and zero gradients) for rows with no
    allowed key, and a bool mask is faster on CPU than the equivalent additive float bias."""
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=scale)


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
    batch, _, length, _ = query.shape
    n, block = pattern.num_blocks, pattern.block_size
    if length != n * block:
        raise ValueError(f"bigbird_attention expects length = num_blocks * block_size = {n * block}; got {length}")
    if cpu_kernel.usable(query, key, value, dropout_p):  # takes TAPE's wider V as it is
        return _fused_cpu_attention(query, key, value, key_mask, pattern)
    # TAPE's wider V: q and k padded once here (before the gather), so every SDPA call below runs the fused kernel
    query, key, scale = as_wide_as_value(query, key, value)

    # Global query blocks: dense rows over their keys (ITC: all; block 0 of "first-reads-source": its first
    # first_block_keys key blocks, a prefix, so a slice).
    end = pattern.middle_end
    first_keys = pattern.first_block_keys * block
    if pattern.last_global and n > 1 and first_keys == length:  # ITC: both global blocks in one call
        global_query = torch.cat([query[:, :, :block], query[:, :, length - block:]], dim=2)  # (b, h, 2b, d)
        global_out = _masked_attention(global_query, key, value,
                                       key_mask[:, None, None, :].expand(batch, 1, 1, length), dropout_p, scale)
        first_out, last_out = global_out[:, :, :block], global_out[:, :, block:]
    else:
        first_out = _masked_attention(query[:, :, :block], key[:, :, :first_keys], value[:, :, :first_keys],
                                      key_mask[:, None, None, :first_keys], dropout_p, scale)
        last_out = None
        if pattern.last_global and n > 1:
            last_out = _masked_attention(query[:, :, length - block:], key, value, key_mask[:, None, None, :],
                                         dropout_p, scale)
    outputs = [first_out]
    if end > 1:
        outputs.append(_middle_attention(query, key, value, key_mask, pattern, workspace, dropout_p, scale))
    if last_out is not None:
        outputs.append(last_out)
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


def _middle_attention(query, key, value, key_mask, pattern: BigBirdPattern, workspace, dropout_p, scale=None):
    """Middle query blocks 1..end-1: gather window + global + random key blocks per (head, block)."""
    batch, heads, _, dim = query.shape
    value_dim = value.shape[-1]
    n, block, end = pattern.num_blocks, pattern.block_size, pattern.middle_end
    indices, valid = _middle_key_blocks(pattern, query.device)  # (H, end-1, k)
    m = indices.shape[-1]
    # One index_select over (head, block) pairs: much faster than advanced indexing on CPU.
    flat = (torch.arange(heads, device=query.device)[:, None, None] * n + indices).reshape(-1)
    key_blocks = _gather_blocks(key.reshape(batch, heads * n, block, dim), flat, workspace, "key")
    value_blocks = _gather_blocks(value.reshape(batch, heads * n, block, value_dim), flat, workspace, "value")
    mask_blocks = key_mask.view(batch, n, block)[:, indices] & valid[None, :, :, :, None]  # (B, H, end-1, k, b)
    middle_query = query.view(batch, heads, n, block, dim)[:, :, 1:end]  # (B, H, end-1, b, d)
    rows = heads * (end - 1)
    return _masked_attention(
        middle_query.reshape(batch, rows, block, dim),
        key_blocks.view(batch, rows, m * block, dim),
        value_blocks.view(batch, rows, m * block, value_dim),
        mask_blocks.reshape(batch, rows, 1, m * block), dropout_p, scale,
    ).reshape(batch, heads, (end - 1) * block, value_dim)  # CUDA SDPA may return a non-contiguous layout


def _fused_cpu_attention(query, key, value, key_mask, pattern: BigBirdPattern):
    """CPU inference in bf16 or fp32: every query block in the fused kernel (`cpu_kernel`), written straight into the
    (B, H, l, d_v) output (token-major in memory); same pattern as the SDPA path above. With blocks of a multiple of
    32 rows every key and value block is packed once per call and read in place by each query block that attends to
    it (a middle block's 8 key blocks are other blocks' keys too); otherwise each query block packs its own."""
    batch, heads, _, dim = query.shape
    block, value_dim = pattern.block_size, value.shape[-1]
    scale = dim ** -0.5
    out = empty_token_major(query, value_dim)  # the output projection's reshape is then a view, not a copy
    mask = key_mask.to(torch.uint8)
    packed = block % 32 == 0
    units = cpu_kernel.packed_units(query.dtype, dim, value_dim, block) if packed else None
    tables, pack_offsets = _fused_tables(pattern, batch, heads, query.stride(), key.stride(), value.stride(),
                                         out.stride(), units)
    if packed:
        key, value = cpu_kernel.pack_blocks(key, pack_offsets[0], value, pack_offsets[1], block)
    for query_offsets, key_offsets, value_offsets, mask_offsets, out_offsets in tables:
        cpu_kernel.attend_blocks(query, query_offsets, block, key, key_offsets, value, value_offsets, mask,
                                 mask_offsets, block, out, out_offsets, scale, packed=packed)
    return out


@lru_cache(maxsize=256)
def _fused_tables(pattern: BigBirdPattern, batch: int, heads: int, query_strides, key_strides, value_strides,
                  out_strides, packed_units):
    """Offset tables of the fused kernel's calls, one per set of query blocks that read the same number of key
    blocks: the global blocks (ITC: first and last over every key block; "first-reads-source": block 0 over its
    prefix), then the middle blocks over their window, global and random blocks (`middle_key_blocks`; an invalid
    slot is a masked block). Element offsets from the tensors' strides; masks are (B, l) uint8. `packed_units`
    (`cpu_kernel.packed_units`): key and value offsets index `cpu_kernel.pack_blocks`' output for blocks in
    (b, h, block) order, whose row offsets are returned beside the tables (else None)."""
    with outside_the_trace():
        n, block = pattern.num_blocks, pattern.block_size
        length = n * block
        offsets = partial(cpu_kernel.token_offsets, batch=batch, heads=heads)

        def table(query_blocks, key_blocks, valid=None):  # query_blocks (H, G); key_blocks (H, G, k)
            if packed_units is None:
                key_rows = offsets(key_strides, tokens=key_blocks * block)
                value_rows = offsets(value_strides, tokens=key_blocks * block)
            else:
                index = offsets((heads * n, n, 1), tokens=key_blocks)  # (b, h, block) order of pack_blocks
                key_rows, value_rows = index * packed_units[0], index * packed_units[1]
            mask_rows = offsets((length, 0, 1), tokens=key_blocks * block)
            if valid is not None:
                mask_rows = torch.where(valid[None], mask_rows, -1)
            k = key_blocks.shape[-1]
            return (offsets(query_strides, tokens=query_blocks * block).reshape(-1), key_rows.reshape(-1, k),
                    value_rows.reshape(-1, k), mask_rows.reshape(-1, k),
                    offsets(out_strides, tokens=query_blocks * block).reshape(-1))

        tables = []
        first_blocks = pattern.first_block_keys
        global_queries = [0] + ([n - 1] if pattern.last_global and n > 1 else [])
        if first_blocks == n:
            queries = torch.tensor(global_queries).expand(heads, -1)
            tables.append(table(queries, torch.arange(n).expand(heads, len(global_queries), n)))
        else:
            tables.append(table(torch.zeros(heads, 1, dtype=torch.long),
                                torch.arange(first_blocks).expand(heads, 1, -1)))
            if len(global_queries) > 1:
                tables.append(table(torch.full((heads, 1), n - 1), torch.arange(n).expand(heads, 1, n)))
        if pattern.middle_end > 1:
            indices, valid = pattern.middle_key_blocks()  # (H, end-1, k)
            queries = torch.arange(1, pattern.middle_end).expand(heads, -1)
            tables.append(table(queries, indices, valid))
        pack_offsets = None
        if packed_units is not None:
            every_block = torch.arange(n)[None] * block
            pack_offsets = (offsets(key_strides, tokens=every_block).reshape(-1),
                            offsets(value_strides, tokens=every_block).reshape(-1))
        return tuple(tuple(t.contiguous() for t in entry) for entry in tables), pack_offsets
