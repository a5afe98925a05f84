"""LittleBird attention kernels (Lee et al. 2022, §3.3): pack attention and unpack & sliding-window (USW).

Shapes in the notation of `longbird.attention` (B, H, l, d, b, n, s).
USWAttn(X, C) = softmax(Q(X) [K(C); K(X)]^T / √d − [D_C; D]) [V(C); V(X)]  (LittleBird §3.3), where each
query block sees only: the s packed keys (bias (β+γ)/2·b), the first block (global keys) and its own,
left and right blocks (BiALiBi bias from position ids). Blocked and batched: keys are rolled into
(n, s + 4b) groups, so time and memory are O(l (4b + s)); no l x l tensor is ever built. The inference kernels
(without autograd or dropout) are in `usw_inference`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F

from .full import full_attention
from .token_major import empty_token_major
from .usw_inference import (
    fused_kernel_applies,
    grouped_usw_inference,
    split_kernel_applies,
    usw_fused_attention,
    usw_split_attention,
)
from .workspace import concat_into


class BiALiBiSlopes(Protocol):
    """Per-head slopes (H,), the slope-free distance terms and the packed-context distance (positions.alibi.BiALiBi
    satisfies this; the kernels take it as an argument, so this package imports no position method)."""

    alpha: torch.Tensor
    beta: torch.Tensor
    gamma: torch.Tensor

    def terms(self, query_positions: torch.Tensor,
              key_positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...
    def distance(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor: ...
    def pack_distance(self, block_size: int) -> torch.Tensor: ...


def pack_attention(pack_query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor,
                   dropout_p: float = 0.0):
    """C_p = Attn(P, X): pack queries (B, H, s, d) over all real tokens; key_mask (B, l). O(l s). Full attention
    (`full.full_attention`): SDPA, or the fused CPU kernel at inference, and TAPE's wider values kept on SDPA's
    fused path."""
    return full_attention(pack_query, key, value, key_mask, dropout_p)


def _neighbour_blocks(x: torch.Tensor, axis: int, fill) -> torch.Tensor:
    """Blocks on `axis`, tokens on `axis + 1`: returns each block's left, own and right block concatenated
    on the token axis (3b tokens), `fill` beyond the ends."""
    # cat with a filled block rather than F.pad: Inductor's CPU code for a padded bool/int64 tensor fused into the
    # layout does not compile (torch 2.13, "operands to '?:' have different types VecMask<long> and VecMask<float>")
    edge = x.narrow(axis, 0, 1)
    edge = torch.full(edge.shape, fill, dtype=x.dtype, device=x.device)
    padded = torch.cat([edge, x, edge], dim=axis)
    n = x.shape[axis]
    return torch.cat([padded.narrow(axis, offset, n) for offset in range(3)], dim=axis + 1)


@dataclass
class USWLayout:
    """Which keys each query block sees and their slope-free BiALiBi terms; computed once per forward
    (positions and padding are the same in every layer).

    Key order per query block: [global block 0 | left | own | right] = 4b keys.
    mask (B, n, 4b) bool; left/right/cls (B, 1, n, b, 4b) fp32 (`BiALiBiSlopes.terms`).
    """

    block_size: int
    mask: torch.Tensor
    left: torch.Tensor
    right: torch.Tensor
    cls: torch.Tensor
    derived: dict = field(default_factory=dict)  # per pack size s: what every layer of the call reuses
    key_mask: torch.Tensor | None = None  # (B, l) bool and position ids (B, l): what the fused CPU kernel reads
    positions: torch.Tensor | None = None

    def mask_with_pack(self, s: int) -> torch.Tensor:
        """(B, n, s + 4b) bool: the key mask with s always-visible packed keys in front."""
        if not s:
            return self.mask
        key = ("mask", s)
        if key not in self.derived:
            self.derived[key] = torch.cat([self.mask.new_ones(*self.mask.shape[:2], s), self.mask], dim=-1)
        return self.derived[key]

    def kernel_keys(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, s + l) uint8 key mask and int64 position ids as the fused CPU kernel reads them: s packed-context keys
        in front (always visible; their positions are not read), then the tokens."""
        key = ("kernel", s)
        if key not in self.derived:
            mask, positions = self.key_mask.to(torch.uint8), self.positions.to(torch.int64)
            if s:
                mask = torch.cat([mask.new_ones(mask.shape[0], s), mask], dim=1)
                positions = torch.cat([positions.new_zeros(positions.shape[0], s), positions], dim=1)
            self.derived[key] = (mask, positions)
        return self.derived[key]

    def score_terms(self, s: int) -> torch.Tensor:
        """(B, 5, n·b·(s + 4b)) fp32: per score, the coefficients of [α, β, γ, D_C, MASKED] in D, the last one 1 where
        the key is masked. One (H, 5) x (5, ·) product per layer then gives every head's bias in the layout SDPA reads
        (inference; `usw_attention`), instead of four passes over the (B, H, n, b, s + 4b) scores."""
        key = ("score-terms", s)
        if key not in self.derived:
            batch, n, keys = self.mask_with_pack(s).shape
            b = self.block_size
            terms = self.bias_terms(s, torch.float32).view(batch, n, b, keys, 4)
            masked = (~self.mask_with_pack(s))[:, :, None, :, None].expand(batch, n, b, keys, 1).float()
            self.derived[key] = torch.cat([terms, masked], dim=-1).view(batch, -1, 5).transpose(1, 2).contiguous()
        return self.derived[key]

    def split_terms(self, s: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The score terms of `score_terms` in `dtype`, split for `usw_inference.usw_split_attention`: (B, 5, l·(s + b))
        for every query over [pack | global block 0] and (B, n, 5, b·3b) for each query block over its
        [left | own | right] window, laid out so that one (H, 5) product per layer gives each bias in the layout SDPA
        reads."""
        key = ("split-terms", s, dtype)
        if key not in self.derived:
            batch, n, keys = self.mask_with_pack(s).shape
            b = self.block_size
            terms = self.score_terms(s).view(batch, 5, n, b, keys)
            shared = terms[..., :s + b].reshape(batch, 5, -1).to(dtype)
            window = terms[..., s + b:].permute(0, 2, 1, 3, 4).reshape(batch, n, 5, -1).to(dtype)
            self.derived[key] = (shared, window)
        return self.derived[key]

    def bias_terms(self, s: int, dtype: torch.dtype) -> torch.Tensor:
        """(B, n·b·(s + 4b), 4): per score, the coefficients of [α, β, γ, D_C] in D, so that the gradients of the four
        slopes are one matrix product with dS (instead of four multiply-and-sum passes)."""
        key = ("terms", s, dtype)
        if key not in self.derived:
            local = torch.stack([self.cls, self.left, self.right, torch.zeros_like(self.cls)], dim=-1)[:, 0]
            pack = local.new_zeros(*local.shape[:3], s, 4)
            pack[..., 3] = 1.0
            terms = torch.cat([pack, local], dim=3)  # (B, n, b, s + 4b, 4)
            self.derived[key] = terms.reshape(terms.shape[0], -1, 4).to(dtype)
        return self.derived[key]


def usw_layout(key_mask: torch.Tensor, positions: torch.Tensor, block_size: int, bialibi: BiALiBiSlopes) -> USWLayout:
    """The call's USWLayout from key_mask (B, l) and position ids (B, l); `bialibi` gives the slope-free distance terms
    (the same for every layer, whose slopes differ)."""
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
    left, right, cls = (term[:, None] for term in bialibi.terms(position_blocks, key_positions))
    return USWLayout(b, mask, left, right, cls, key_mask=key_mask, positions=positions)


def _key_groups(k, v, pack_key, pack_value, n, workspace):
    """Each query block's keys and values, [pack | global block 0 | left | own | right]: (B, H, n, s + 4b, d)."""
    key_groups = [k[:, :, :1].expand(-1, -1, n, -1, -1), _neighbour_blocks(k, 2, 0.0)]
    value_groups = [v[:, :, :1].expand(-1, -1, n, -1, -1), _neighbour_blocks(v, 2, 0.0)]
    if pack_key is not None:
        key_groups.insert(0, pack_key[:, :, None].expand(-1, -1, n, -1, -1))
        value_groups.insert(0, pack_value[:, :, None].expand(-1, -1, n, -1, -1))
    return concat_into(key_groups, 3, workspace, "keys"), concat_into(value_groups, 3, workspace, "values")


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """fp32 for half-precision tensors (softmax and bias arithmetic), unchanged otherwise (fp32, fp64 in tests)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _biased_scores(q, keys, layout: USWLayout, alpha, beta, gamma, pack_bias, s: int, scale: float) -> torch.Tensor:
    """(B, H, n, b, s + 4b) fp32 scores · scale − D, masked (in place on a fresh tensor; differentiable)."""
    heads = q.shape[1]
    scores = _upcast(torch.matmul(q, keys.transpose(-1, -2)))
    scores.mul_(scale)
    # score − D with D = β·left + γ·right + α·cls (BiALiBi, LittleBird §3.1), in place: no (B, H, n, b, 4b) temps.
    local = scores[..., s:]
    for slope, term in ((beta, layout.left), (gamma, layout.right), (alpha, layout.cls)):
        local.addcmul_(term.to(scores.dtype), slope.to(scores.dtype).view(1, heads, 1, 1, 1), value=-1.0)
    if s:  # packed context: uniform distance (β+γ)/2·b (LittleBird §3.3, D_C)
        scores[..., :s].sub_(pack_bias.to(scores.dtype).view(1, heads, 1, 1, 1))
    return scores.masked_fill_(~layout.mask_with_pack(s)[:, None, :, None, :], torch.finfo(scores.dtype).min)


def _scatter_key_grads(grouped: torch.Tensor, s: int, block: int):
    """Gradients w.r.t. the grouped keys (B, H, n, s + 4b, d) -> (token keys (B, H, n, b, d), pack keys (B, H, s, d)):
    every group slot is summed back into the key it was copied from."""
    b = block
    pack = grouped[:, :, :, :s].sum(2) if s else None
    tokens = grouped[:, :, :, s + 2 * b:s + 3 * b].clone()  # own block
    tokens[:, :, :-1] += grouped[:, :, 1:, s + b:s + 2 * b]  # block i-1 was query block i's left neighbour
    tokens[:, :, 1:] += grouped[:, :, :-1, s + 3 * b:]  # block i+1 was query block i's right neighbour
    tokens[:, :, 0] += grouped[:, :, :, s:s + b].sum(2)  # the global block 0, seen by every query block
    return tokens, pack


# Heads are independent: the hand-written forward and backward run a few heads at a time so that the grouped keys,
# scores and probabilities of one layer (each (B, H, n, b, s + 4b), 63 MiB per tensor at base size and 4096 tokens)
# never exist for all heads at once; about this many score elements per chunk (16 MiB in fp32).
_CHUNK_ELEMENTS = 1 << 22


def _head_chunks(heads: int, per_head: int):
    if torch.compiler.is_exporting():
        # One graph for every batch and length (ONNX): a step computed from symbolic sizes would be fixed at the
        # example's value by a guard, and the graph would refuse any input with more elements per head.
        return [slice(0, heads)]
    step = max(1, min(heads, _CHUNK_ELEMENTS // max(per_head, 1)))
    return [slice(start, min(start + step, heads)) for start in range(0, heads, step)]


class _USWAttention(torch.autograd.Function):
    """USW attention with a hand-written backward (LittleBird §3.3): forward saves q, k, v, the pack keys/values and
    the output only, and backward recomputes the scores and probabilities block by block, as flash attention does,
    a few heads at a time (`_head_chunks`). Autograd through the blocked forward would keep the fp32 score and
    probability blocks of every layer and replay the gather copies in backward."""

    @staticmethod
    def forward(ctx, query, key, value, pack_key, pack_value, alpha, beta, gamma, pack_bias, layout, scale):
        batch, heads, length, _ = query.shape
        dim = value.shape[-1]  # may exceed the query's (TAPE: the position states ride beside V)
        b = layout.block_size
        n = length // b
        s = 0 if pack_key is None else pack_key.shape[2]
        # token-major: merging the heads for the output projection is then a view, not a second copy that autograd
        # would keep beside this one (as SDPA's output is laid out)
        out = empty_token_major(value, dim)
        for h in _head_chunks(heads, batch * length * (s + 4 * b)):
            blocks = lambda x, h=h: x[:, h].reshape(batch, -1, n, b, x.shape[-1])
            keys, values = _key_groups(blocks(key), blocks(value), _heads_of(pack_key, h), _heads_of(pack_value, h),
                                       n, None)
            probs = torch.softmax(_biased_scores(blocks(query), keys, layout, alpha[h], beta[h], gamma[h],
                                                 _heads_of(pack_bias, h), s, scale), dim=-1)
            del keys
            out[:, h] = torch.matmul(probs.to(values.dtype), values).view(batch, -1, length, dim)
        ctx.layout, ctx.s, ctx.scale = layout, s, scale
        ctx.save_for_backward(query, key, value, pack_key, pack_value, alpha, beta, gamma, pack_bias, out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, pack_key, pack_value, alpha, beta, gamma, pack_bias, out = ctx.saved_tensors
        layout, s, scale = ctx.layout, ctx.s, ctx.scale
        batch, heads, length, _ = query.shape
        b = layout.block_size
        n = length // b
        grad_out = grad_out.to(query.dtype)
        # softmax backward needs rowsum(dO ⊙ O) per query: (B, H, l) -> per block below.
        row_dot_all = (_upcast(grad_out) * _upcast(out)).sum(-1)
        grad_query, grad_key, grad_value = (torch.empty_like(query) for _ in range(3))
        grad_pack_key = grad_pack_value = None
        if s:
            grad_pack_key, grad_pack_value = torch.empty_like(pack_key), torch.empty_like(pack_value)
        slopes_needed = any(ctx.needs_input_grad[5:9])
        per_slope = torch.zeros(heads, 4, dtype=torch.promote_types(_upcast(query).dtype, torch.float32),
                                device=query.device) if slopes_needed else None
        terms = layout.bias_terms(s, per_slope.dtype) if slopes_needed else None
        for h in _head_chunks(heads, batch * length * (s + 4 * b)):
            blocks = lambda x, h=h: x[:, h].reshape(batch, -1, n, b, x.shape[-1])
            q, grad_o = blocks(query), blocks(grad_out)
            chunk = q.shape[1]
            keys, values = _key_groups(blocks(key), blocks(value), _heads_of(pack_key, h), _heads_of(pack_value, h),
                                       n, None)
            # The probabilities again, by the same fused softmax as forward (cheaper on CPU than exp(S − logsumexp)).
            probs = torch.softmax(_biased_scores(q, keys, layout, alpha[h], beta[h], gamma[h],
                                                 _heads_of(pack_bias, h), s, scale), dim=-1)
            # (B, H', n, s + 4b, d), H' = the heads of this chunk
            grad_values = torch.matmul(probs.to(values.dtype).transpose(-1, -2), grad_o)
            tokens, packed = _scatter_key_grads(grad_values, s, b)
            grad_value[:, h] = tokens.view(batch, chunk, length, value.shape[-1])
            if s:
                grad_pack_value[:, h] = packed
            del grad_values, tokens, packed
            grad_probs = _upcast(torch.matmul(grad_o, values.transpose(-1, -2)))
            del values
            # softmax backward: dS = P ⊙ (dP − rowsum(dO ⊙ O)).
            grad_scores = grad_probs.sub_(row_dot_all[:, h].reshape(batch, chunk, n, b, 1)).mul_(probs)  # unscaled
            del probs
            if slopes_needed:
                # S − D with D = α·cls + β·left + γ·right on token keys and D_C on packed keys: d(slope) = −Σ dS·term.
                per_slope[h] = -torch.bmm(grad_scores.view(batch, chunk, -1), terms).sum(0)
            grad_scores = grad_scores.mul_(scale).to(query.dtype)
            grad_query[:, h] = torch.matmul(grad_scores, keys).view(batch, chunk, length, query.shape[-1])
            del keys
            tokens, packed = _scatter_key_grads(torch.matmul(grad_scores.transpose(-1, -2), q), s, b)
            grad_key[:, h] = tokens.view(batch, chunk, length, query.shape[-1])
            if s:
                grad_pack_key[:, h] = packed
            del grad_scores, tokens, packed
        if slopes_needed:
            grad_slopes = [per_slope[:, i].to(t.dtype) if ctx.needs_input_grad[5 + i] else None
                           for i, t in enumerate((alpha, beta, gamma))]
            grad_pack_bias = per_slope[:, 3].to(pack_bias.dtype) if s and ctx.needs_input_grad[8] else None
        else:
            grad_slopes, grad_pack_bias = [None, None, None], None
        return (grad_query, grad_key, grad_value, grad_pack_key, grad_pack_value, *grad_slopes, grad_pack_bias, None,
                None)


def _heads_of(x: torch.Tensor | None, heads: slice) -> torch.Tensor | None:
    """Heads `heads` of a per-head tensor ((B, H, ...) pack keys/values or (H,) pack bias); None stays None."""
    if x is None:
        return None
    return x[heads] if x.dim() == 1 else x[:, heads]


def usw_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: USWLayout,
    slopes: BiALiBiSlopes,
    pack_key: torch.Tensor | None = None,
    pack_value: torch.Tensor | None = None,
    workspace: dict | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """query/key (B, H, l, d), value (B, H, l, d_v), l = n·b (the caller pads); `layout` from `usw_layout`; `slopes`
    has per-head alpha, beta, gamma and pack_distance(b); pack_key/pack_value (B, H, s, d / d_v) or None. Returns
    (B, H, l, d_v). `dropout_p`: attention dropout on the probabilities (0 outside training). `scale` multiplies
    q·k (default 1/√d; TAPE widens q and k and keeps the head's own scale).

    Softmax and bias arithmetic run in fp32 whatever the input dtype. A query row with no allowed key (only
    possible in an all-padding row without pack tokens) gets an average of masked values, never used.
    With autograd on (and no attention dropout) the hand-written backward of `_USWAttention` runs.
    """
    batch, heads, length, dim = query.shape
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    b = layout.block_size
    n = length // b
    s = 0 if pack_key is None else pack_key.shape[2]
    if s == 0:
        pack_key = pack_value = None
    pack_bias = slopes.pack_distance(b) if s else None
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (query, key, value, pack_key, pack_value, slopes.alpha))
    if needs_grad and not dropout_p:
        with torch.autocast(query.device.type, enabled=False):  # dtypes are explicit inside
            common = torch.promote_types(query.dtype, key.dtype)
            cast = lambda x: None if x is None else x.to(common)
            if any(t.requires_grad for t in (slopes.alpha, slopes.beta, slopes.gamma)):
                # the slopes' backward reads these terms: made here, so that backward only reads the layout's cache
                # (torch.compile cannot trace a backward that writes to an object from outside it)
                layout.bias_terms(s, torch.promote_types(_upcast(cast(query)).dtype, torch.float32))
            return _USWAttention.apply(cast(query), cast(key), cast(value), cast(pack_key), cast(pack_value),
                                       slopes.alpha, slopes.beta, slopes.gamma, pack_bias, layout, scale)
    if not dropout_p and fused_kernel_applies(query, key, value, layout, s):
        return usw_fused_attention(query, key, value, layout, slopes, pack_key, pack_value, pack_bias, scale)
    if not dropout_p and split_kernel_applies(query, key, value):
        return usw_split_attention(query, key, value, layout, slopes, pack_key, pack_value, pack_bias, workspace,
                                   scale)
    blocks = lambda x: x.view(batch, heads, n, b, x.shape[-1])
    keys, values = _key_groups(blocks(key), blocks(value), pack_key, pack_value, n, workspace)
    if not dropout_p:
        return grouped_usw_inference(query, keys, values, layout, slopes, pack_bias, s, scale)
    scores = _biased_scores(blocks(query), keys, layout, slopes.alpha, slopes.beta, slopes.gamma, pack_bias, s,
                            scale)
    probs = F.dropout(torch.softmax(scores, dim=-1), dropout_p)
    out = torch.matmul(probs.to(values.dtype), values)
    return out.view(batch, heads, length, value.shape[-1])


def usw_attention_reference(query, key, value, key_mask, positions, bias: BiALiBiSlopes, block_size,
                            pack_key=None, pack_value=None, scale: float | None = None):
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
    s = 0 if pack_key is None else pack_key.shape[2]
    return reference_attention(query, key, value, mask[:, None], -distance, record_pack_keys=s, scale=scale)
