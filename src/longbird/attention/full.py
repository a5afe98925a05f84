"""Full attention through PyTorch SDPA (the fast dense path used at or below the source length)."""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from . import cpu_kernel
from .token_major import empty_token_major
from .tracing import is_tracing, outside_the_trace


def full_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """query (B, H, q, d), key/value (B, H, l, d / d_v); key_mask (B, l) bool, True = real token. Returns
    (B, H, q, d_v): value may be wider than query and key (TAPE); q is l but for LittleBird's pack attention.
    `dropout_p`: attention dropout on the probabilities (the caller passes 0 outside training)."""
    if cpu_kernel.usable(query, key, value, dropout_p):
        return _fused_cpu_attention(query, key, value, key_mask)
    if cpu_kernel.usable_in_compiled_graph(query, key, value, dropout_p):
        # torch.compile (not export): the kernel as one opaque op, so a compiled model reads as fast as eager
        return _fused_cpu_attention_op(query, key, value, key_mask)
    # Without padding SDPA runs unmasked (faster); a traced graph cannot branch on the mask's data, so it keeps it.
    unmasked = key_mask is None or (not is_tracing() and bool(key_mask.all()))
    attn_mask = None if unmasked else key_mask[:, None, None, :]
    query, key, scale = as_wide_as_value(query, key, value)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)


def as_wide_as_value(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
    """(query, key, scale) for SDPA when V may be wider than Q and K (TAPE: the position states ride beside V).

    SDPA's fused CPU kernel needs q, k and v of one width; otherwise it takes the math path, which materialises every
    score: 5x slower for full attention at 8K tokens, and 4.7x for a TAPE + BigBird forward at 4K (3.95 s against
    0.83 s for its kobigbird twin, bf16; the blocked kernel's middle rows went through the math path). Zero columns
    leave q·k unchanged and the scale is passed as 1/sqrt(d_h) of the unpadded head. Not measured on CUDA (where the
    memory-efficient kernel takes a wider V), so left to SDPA's own choice there: scale None, inputs unchanged."""
    if value.shape[-1] <= query.shape[-1] or query.device.type != "cpu":
        return query, key, None
    width = value.shape[-1] - query.shape[-1]
    return F.pad(query, (0, width)), F.pad(key, (0, width)), query.shape[-1] ** -0.5


def _fused_cpu_attention(query, key, value, key_mask):
    """CPU inference (bf16 or fp32) in longbird's fused kernel (`cpu_kernel`): one group per (row, head), its queries
    over all its keys (in bf16 2.2-2.7x SDPA's flash kernel at e5-small heads, 384-1024 tokens: docs/benchmarks.md;
    fp32: "The fused kernel in fp32" there). The kernel packs
    each group's keys once and takes V wider than Q and K as it is (TAPE). Queries and keys may differ in number
    (LittleBird's pack attention: s pack queries over the l tokens)."""
    batch, heads, queries, _ = query.shape
    keys = key.shape[2]
    out = empty_token_major(query, value.shape[-1])  # the output projection's reshape is then a view, not a copy
    mask = (torch.ones(batch, keys, dtype=torch.uint8) if key_mask is None else key_mask.to(torch.uint8))
    query_rows, key_rows, value_rows, mask_rows, out_rows = _fused_tables(
        batch, heads, keys, query.stride(), key.stride(), value.stride(), out.stride())
    return cpu_kernel.attend_blocks(query, query_rows, queries, key, key_rows, value, value_rows, mask, mask_rows,
                                    keys, out, out_rows, query.shape[-1] ** -0.5)


@lru_cache(maxsize=64)
def _fused_tables(batch, heads, keys, query_strides, key_strides, value_strides, out_strides):
    """The kernel's offset tables for full attention (a function of the shapes and strides only, so built once per
    shape rather than in every layer): each (row, head)'s first query, key, value, mask and output element."""
    with outside_the_trace():  # cached: never fake or recorded tensors
        first = torch.zeros(1, 1, dtype=torch.long)

        def rows(strides):  # (B·H, 1) element offset of each (row, head)'s first token
            return cpu_kernel.token_offsets(strides, batch, heads, first).reshape(-1, 1).contiguous()

        return (rows(query_strides)[:, 0].contiguous(), rows(key_strides), rows(value_strides), rows((keys, 0, 1)),
                rows(out_strides)[:, 0].contiguous())


@torch.library.custom_op("longbird::cpu_full_attention", mutates_args=())
def _fused_cpu_attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            key_mask: torch.Tensor | None) -> torch.Tensor:
    return _fused_cpu_attention(query, key, value, key_mask)


@_fused_cpu_attention_op.register_fake
def _(query, key, value, key_mask):
    return empty_token_major(query, value.shape[-1])  # the kernel's layout
