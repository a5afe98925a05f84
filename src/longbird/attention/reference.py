"""Dense oracle attention: deliberately simple, fp32 softmax, used by tests and `attn_implementation="reference"`.

`recording_attention()` collects the probabilities of every token-query call (what distillation compares with a
teacher's attention maps, LittleBird §3.4): the reference path is the only one that materialises them.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass

import torch

_records: contextvars.ContextVar[list | None] = contextvars.ContextVar("longbird_attention_records", default=None)


@dataclass
class AttentionRecord:
    """One layer's attention: `probs` (B, H, q, s + k) fp32 with the s packed keys first; `allowed` broadcastable to
    `probs`, True where the layer may attend."""

    probs: torch.Tensor
    allowed: torch.Tensor
    pack_keys: int = 0


@contextlib.contextmanager
def recording_attention():
    """Within the block, every recorded reference attention call appends an AttentionRecord to the yielded list."""
    token = _records.set([])
    try:
        yield _records.get()
    finally:
        _records.reset(token)


def reference_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    record_pack_keys: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(q k^T · scale + bias, masked) v, scale = 1/sqrt(d) unless given.

    query (B, H, l, d), key/value (B, H, m, d) (m keys); mask broadcastable to (B, H, l, m), True = may attend;
    bias broadcastable to (B, H, l, m). Rows with no allowed key give zeros. `record_pack_keys`: inside
    `recording_attention()`, record this call's probabilities (whose first `record_pack_keys` keys are packed ones).
    """
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = torch.matmul(query, key.transpose(-1, -2)).float() * scale
    if bias is not None:
        scores = scores + bias.float()
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1)
    if mask is not None:
        # An all-masked row would otherwise spread uniform weight over forbidden keys.
        probs = probs * mask
    records = _records.get()
    if records is not None and record_pack_keys is not None:  # token queries only (`record_pack_keys` packed keys)
        allowed = mask if mask is not None else torch.ones((), dtype=torch.bool, device=probs.device)
        records.append(AttentionRecord(probs, allowed, record_pack_keys))
    if dropout_p:
        probs = torch.nn.functional.dropout(probs, dropout_p)
    return torch.matmul(probs.to(value.dtype), value)
