"""The token-major layout of an attention output: a (B, H, l, dv) tensor laid out as (B, l, H, dv).

The fused CPU kernels write their context in this layout (their output buffers are `empty_token_major`), so
merging the heads back into (B, l, H·dv) is a view.
Opaque ops that return it (`longbird::cpu_full_attention`, `longbird::cpu_usw_attention`,
`longbird::bigbird_rows_token_major`) must say so in their fake kernels: a compiled graph then copies the context
neither into head-major order nor back (two copies of every layer's context otherwise).
"""

from __future__ import annotations

import torch


def empty_token_major(query: torch.Tensor, value_dim: int) -> torch.Tensor:
    """An empty (B, H, l, value_dim) tensor like `query` (B, H, l, d), laid out token-major."""
    batch, heads, length, _ = query.shape
    return query.new_empty((batch, length, heads, value_dim)).transpose(1, 2)


def in_token_major_layout(out: torch.Tensor) -> torch.Tensor:
    """`out` itself when it is laid out token-major (a stride of a dimension of size 1 does not matter, as for one row
    cut from a longer padded buffer), else a token-major copy of it."""
    _, heads, length, value_dim = out.shape
    strides = (length * heads * value_dim, value_dim, heads * value_dim, 1)  # no buffer made just to read its strides
    if all(size == 1 or ours == theirs for size, ours, theirs in zip(out.shape, out.stride(), strides)):
        return out
    return empty_token_major(out, value_dim).copy_(out)
