"""Dense oracle attention: deliberately simple, fp32 softmax, used by tests and `attn_implementation="reference"`."""

from __future__ import annotations

import math

import torch


def reference_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias, masked) v.

    query (b, h, n, d), key/value (b, h, m, d); mask broadcastable to (b, h, n, m), True = may attend;
    bias broadcastable to (b, h, n, m). Rows with no allowed key give zeros.
    """
    scores = torch.matmul(query, key.transpose(-1, -2)).float() / math.sqrt(query.shape[-1])
    if bias is not None:
        scores = scores + bias.float()
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1)
    if mask is not None:
        # An all-masked row would otherwise spread uniform weight over forbidden keys.
        probs = probs * mask
    if dropout_p:
        probs = torch.nn.functional.dropout(probs, dropout_p)
    return torch.matmul(probs.to(value.dtype), value)
