"""LittleBird's USW attention at inference (no autograd, no attention dropout): the kernels `usw_attention` calls
(LittleBird §3.3; the layout, training kernel and dense oracle are in `littlebird`).

- `usw_fused_attention` (CPU inference, bf16 or fp32; AVX-512, or AVX2 for fp32): longbird's fused kernel
  (`cpu_kernel`), the BiALiBi distance computed inside it from position ids;
- `usw_split_attention` (CPU, eager): two flash-attention calls merged by their log-sum-exps, no key groups;
- `grouped_usw_inference` (GPUs, compiled graphs, TAPE's wider values): one SDPA call over (head, block) rows of the
  gathered key groups.

Both add the BiALiBi bias −D of every head from (H, 5) × (5, ·) products with the layout's score terms (one per key
set).
`layout` is the call's `littlebird.USWLayout` and `slopes` a `littlebird.BiALiBiSlopes` (not imported: `littlebird`
imports this module).
"""

from __future__ import annotations

from functools import lru_cache, partial

import torch
import torch.nn.functional as F

from . import cpu_kernel
from .token_major import empty_token_major
from .tracing import is_tracing
from .workspace import concat_into


def split_kernel_applies(query, key, value) -> bool:
    """The split kernel needs PyTorch's CPU flash attention with its log-sum-exp (equal head sizes; TAPE's widened
    values are not) and strided views into scratch buffers, which no trace should capture: eager CPU inference only
    (not under torch.compile, torch.export, torch.jit or fake tensors: `tracing.is_tracing`)."""
    return (query.device.type == "cpu" and query.shape[-1] == key.shape[-1] == value.shape[-1]
            and query.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16)
            and not is_tracing())


def _token_major(x: torch.Tensor) -> torch.Tensor:
    """(B, H, l, d) -> (B·l, H, d); a view when the heads were split from a (B, l, H·d) projection, as they are."""
    batch, heads, length, dim = x.shape
    return x.transpose(1, 2).reshape(batch * length, heads, dim)


def _windows(x: torch.Tensor, n: int, b: int, workspace: dict | None, name: str) -> list[torch.Tensor]:
    """Per batch row, each query block's [left | own | right] keys (n, H, 3b, d) as overlapping views of one padded
    copy of `x` (B, H, l, d) in which every row has a zero block at each end: a row's windows never reach into another
    row, so a non-finite value there cannot turn a masked key's 0 weight into NaN (the batch-independence rule)."""
    batch, heads, _, dim = x.shape
    tokens = x.transpose(1, 2)  # (B, l, H, d): a view of the projection's layout
    edge = tokens.new_zeros(batch, b, heads, dim)
    padded = concat_into([edge, tokens, edge], 1, workspace, name)  # (B, l + 2b, H, d)
    return [row.as_strided((n, heads, 3 * b, dim), (b * heads * dim, dim, heads * dim, 1)) for row in padded]


def usw_split_attention(query, key, value, layout, slopes, pack_key, pack_value,
                         pack_bias, workspace, scale) -> torch.Tensor:
    """USW attention at inference without gathering each block's key group: the same softmax over
    [pack | global block 0 | left | own | right] (LittleBird §3.3) as two flash-attention calls whose partial
    results merge exactly by their log-sum-exps, o = (e^{L_w} o_w + e^{L_g} o_g) / (e^{L_w} + e^{L_g}):
    the window part reads the keys in place through overlapping strided views (`_windows`), the shared part reads
    the s + b keys every query sees. The key groups `_key_groups` copies (five key blocks per query block, for keys
    and values) are what this saves: `cat` and `copy_` took 22 ms of a 232 ms forward at 512 tokens
    (benchmarks/results/floor_littlebird_512.md).
    Returns (B, H, l, d) laid out as (B, l, H, d), the layout the output projection reads."""
    batch, heads, length, dim = query.shape
    b = layout.block_size
    n = length // b
    s = 0 if pack_key is None else pack_key.shape[2]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    compute = _bias_dtype(query.dtype)
    shared_terms, window_terms = layout.split_terms(s, compute)
    weights = _bias_weights(slopes, pack_bias).neg().to(compute)  # (H, 5)
    window_bias = torch.matmul(weights, window_terms).to(query.dtype)  # (B, n, H, b·3b)
    shared_bias = torch.matmul(weights, shared_terms).to(query.dtype)  # (B, H, l·(s + b))
    query_blocks = _token_major(query).view(batch, n, b, heads, dim).transpose(2, 3)  # (B, n, H, b, d)
    window_bias = window_bias.view(batch, n, heads, b, 3 * b)
    parts = [flash(query_blocks[row], keys, values, attn_mask=window_bias[row], scale=scale)
             for row, (keys, values) in enumerate(zip(_windows(key, n, b, workspace, "window-keys"),
                                                      _windows(value, n, b, workspace, "window-values")))]
    windowed, window_lse = parts[0] if batch == 1 else (torch.cat([part[i] for part in parts]) for i in (0, 1))
    shared_keys = [key[:, :, :b]] if pack_key is None else [pack_key, key[:, :, :b]]
    shared_values = [value[:, :, :b]] if pack_value is None else [pack_value, value[:, :, :b]]
    shared, shared_lse = flash(query, torch.cat(shared_keys, dim=2), torch.cat(shared_values, dim=2),
                               attn_mask=shared_bias.view(batch, heads, length, s + b), scale=scale)
    # both outputs are (B, l, H, d) in memory; the log-sum-exps are (B·n, H, b) and (B, H, l) (fp32, fp64 for fp64)
    windowed = windowed.transpose(1, 2).reshape(batch, length, heads, dim)
    window_lse = window_lse.view(batch, n, heads, b).transpose(2, 3).reshape(batch, length, heads, 1)
    weight = torch.sigmoid(window_lse - shared_lse.transpose(1, 2).unsqueeze(-1))  # e^{L_w} / (e^{L_w} + e^{L_g})
    # merged in the log-sum-exps' dtype (fp32, fp64 for fp64): half-precision outputs are upcast, not the weight rounded
    merged = weight.dtype
    out = torch.lerp(shared.transpose(1, 2).to(merged), windowed.to(merged), weight).to(query.dtype)
    return out.transpose(1, 2)


def _bias_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a bias product runs in: bf16/fp16 their own (fp32 accumulation inside the matmul; the bias ends in
    that dtype anyway), fp32 and fp64 (tests) their own precision."""
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.promote_types(dtype, torch.float32)


def _bias_weights(slopes, pack_bias) -> torch.Tensor:
    """(H, 5) fp32: each head's [α, β, γ, D_C, MASKED_BIAS], the coefficients of the layout's score terms."""
    pack = pack_bias if pack_bias is not None else torch.zeros_like(slopes.alpha, dtype=torch.float32)
    return torch.stack([slopes.alpha.float(), slopes.beta.float(), slopes.gamma.float(), pack.float(),
                        torch.full_like(pack, MASKED_BIAS, dtype=torch.float32)], dim=-1)


# Added to the score of a masked key: exp(−1e4 + any real score) is 0 in fp32, and unlike −inf a row whose keys are all
# masked (an all-padding row without pack tokens) stays finite (its output is never used).
MASKED_BIAS = 1e4


def usw_bias(layout, slopes, pack_bias, s: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, H, n·b·(s + 4b)) −D (LittleBird §3.1, §3.3) with masked keys at −MASKED_BIAS, in `dtype` (SDPA takes a
    float mask of the query's dtype): the per-head slopes [α, β, γ, D_C, MASKED_BIAS] times the call's score terms."""
    # In bf16/fp16 the product is computed in that dtype (fp32 accumulation inside the matmul): the bias ends in it
    # anyway, and writing it once instead of as fp32 and then converting took 40 % off the USW kernel at e5-small
    # size (benchmarks/results/usw_bias_dtype.md). The terms' rounding there (distances above 256 in bf16) is ~2^-9 of
    # the bias, as the final rounding already was. fp32 and fp64 inputs (tests) keep their own precision.
    compute = _bias_dtype(dtype)
    key = ("score-terms-as", s, compute)
    if key not in layout.derived:
        layout.derived[key] = layout.score_terms(s).to(compute)
    bias = torch.matmul(_bias_weights(slopes, pack_bias).neg().to(compute), layout.derived[key])
    return bias if bias.dtype == dtype else bias.to(dtype)


def grouped_usw_inference(query, keys, values, layout, slopes, pack_bias, s: int,
                          scale: float) -> torch.Tensor:
    """query (B, H, l, d), each query block's gathered keys and values (B, H, n, s + 4b, d / d_v): one fused SDPA call
    over (head, block) rows, softmax accumulated in fp32 inside the kernel, with the BiALiBi bias of every head from
    one small product (USWLayout.score_terms); masked keys get −MASKED_BIAS. Returns (B, H, l, d_v)."""
    batch, heads, length, dim = query.shape
    b = layout.block_size
    n = length // b
    keys_per_block, value_dim = keys.shape[3], values.shape[-1]
    bias = usw_bias(layout, slopes, pack_bias, s, query.dtype)
    out = F.scaled_dot_product_attention(
        query.reshape(batch, heads * n, b, dim), keys.view(batch, heads * n, keys_per_block, dim),
        values.view(batch, heads * n, keys_per_block, value_dim),
        attn_mask=bias.view(batch, heads * n, b, keys_per_block), scale=scale)
    # reshape, not view: SDPA's CUDA kernels may return a layout other than (B, H·n, b, d_v) contiguous (seen on an
    # H100 when d_v != d, as TAPE's values carry position states: "view size is not compatible"); a contiguous
    # output is still reshaped without a copy.
    return out.reshape(batch, heads, length, value_dim)


def fused_kernel_applies(query, key, value, layout, s: int) -> bool:
    """The fused CPU kernel (bf16 or fp32) takes this call, eagerly or as an op in a torch.compile graph
    (`cpu_kernel.usable`, `usable_in_compiled_graph`): blocks of a multiple of 32 tokens (it reads them packed),
    packed-context keys in whole blocks, and a layout that carries the call's positions."""
    b = layout.block_size
    return (layout.positions is not None and b % 32 == 0 and s % b == 0
            and (cpu_kernel.usable(query, key, value) or cpu_kernel.usable_in_compiled_graph(query, key, value)))


def usw_fused_attention(query, key, value, layout, slopes, pack_key, pack_value, pack_bias, scale) -> torch.Tensor:
    """USW attention (LittleBird §3.3) in the fused CPU kernel (bf16 or fp32): each query block of each head attends to
    [pack | global block 0 | left | own | right], the packed-context keys and the token keys packed once per call,
    its score minus the BiALiBi distance D computed in the kernel from the position ids (§3.1: α at [CLS], β left,
    γ right, D_C to packed keys). The global copy of block 0 is masked for query blocks 0 and 1, which see it in
    their window, and window blocks past either end are masked, as in `usw_layout`. A query with no allowed key gets
    0 (the blocked kernels give an average of masked values; such a row is never used). In a torch.compile graph
    the kernel is one opaque op (`longbird::cpu_usw_attention`).
    Returns (B, H, l, d_v) laid out as (B, l, H, d_v)."""
    pack = pack_bias if pack_bias is not None else torch.zeros_like(slopes.alpha, dtype=torch.float32)
    head_slopes = torch.stack([slopes.alpha.float(), slopes.beta.float(), slopes.gamma.float(), pack.float()], dim=-1)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    s = 0 if pack_key is None else pack_key.shape[2]
    key_mask, positions = layout.kernel_keys(s)  # made once per call, read by every layer
    run = _usw_kernel_op if is_tracing() else _usw_kernel
    return run(query, key, value, pack_key, pack_value, key_mask, positions, head_slopes, layout.block_size, scale)


def _usw_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, pack_key: torch.Tensor | None,
                pack_value: torch.Tensor | None, key_mask: torch.Tensor, positions: torch.Tensor,
                head_slopes: torch.Tensor, b: int, scale: float) -> torch.Tensor:
    """`usw_fused_attention` on tensors: key_mask (B, s + l) uint8 and positions (B, s + l) int64 with the s packed
    keys in front (`USWLayout.kernel_keys`), head_slopes (H, 4) fp32 [α, β, γ, D_C]."""
    batch, heads, length, dim = query.shape
    n = length // b
    s = 0 if pack_key is None else pack_key.shape[2]
    keys = key if not s else torch.cat([pack_key, key], dim=2)  # (B, H, s + l, d): one tensor of every key
    values = value if not s else torch.cat([pack_value, value], dim=2)
    front = s // b  # packed-context blocks in front of a row's token blocks
    value_dim = values.shape[-1]
    tables = _fused_usw_tables(batch, heads, n, b, front, cpu_kernel.packed_units(query.dtype, dim, value_dim, b),
                               value_dim, keys.stride(), values.stride(), query.stride())
    key_packed, value_packed = cpu_kernel.pack_blocks(keys, tables["key_blocks"], values, tables["value_blocks"], b)
    out = empty_token_major(query, value_dim)
    group_slopes = head_slopes[None, :, None].expand(batch, heads, n, 4).reshape(-1, 4)
    return cpu_kernel.attend_blocks(
        query, tables["queries"], b, key_packed, tables["keys"], value_packed, tables["values"], key_mask,
        tables["masks"], b, out, tables["outs"], scale, packed=True,
        bialibi=(group_slopes, positions, tables["query_positions"], tables["key_positions"]))


@torch.library.custom_op("longbird::cpu_usw_attention", mutates_args=())
def _usw_kernel_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, pack_key: torch.Tensor | None,
                   pack_value: torch.Tensor | None, key_mask: torch.Tensor, positions: torch.Tensor,
                   head_slopes: torch.Tensor, b: int, scale: float) -> torch.Tensor:
    return _usw_kernel(query, key, value, pack_key, pack_value, key_mask, positions, head_slopes, b, scale)


@_usw_kernel_op.register_fake
def _(query, key, value, pack_key, pack_value, key_mask, positions, head_slopes, b, scale):
    return empty_token_major(query, value.shape[-1])  # the kernel's layout


@lru_cache(maxsize=64)
def _fused_usw_tables(batch, heads, n, b, front, packed_units, value_dim, key_strides, value_strides,
                      query_strides) -> dict:
    """Offset tables of `usw_fused_attention` (a function of the shapes and strides only). Key blocks of a row: the
    `front` packed-context blocks, then the n token blocks; each query block reads [pack blocks | 0 | i−1 | i | i+1]
    (token block indices), the invalid ones pointing at its own block and masked (offset −1)."""
    total_blocks, length = front + n, n * b
    offsets = partial(cpu_kernel.token_offsets, batch=batch, heads=heads)
    token = torch.arange(n)[:, None]
    chosen = torch.cat([torch.zeros_like(token), token - 1, token, token + 1], dim=1)  # (n, 4) token blocks
    valid = torch.stack([token[:, 0] >= 2, token[:, 0] >= 1, torch.ones(n, dtype=torch.bool), token[:, 0] < n - 1], 1)
    chosen = torch.where(valid, chosen, token)
    front_blocks = torch.arange(front).expand(n, front)
    index = torch.cat([front_blocks, chosen + front], dim=1)[None]  # (1, n, k) into a row's key blocks
    packed = offsets((heads * total_blocks, total_blocks, 1), tokens=index)  # (b, h, block) order of pack_blocks
    usable = torch.cat([torch.ones(n, front, dtype=torch.bool), valid], dim=1)[None, None]
    key_rows = offsets((front * b + length, 0, 1), tokens=index * b)  # into the (B, s + l) mask and positions
    masks = torch.where(usable, key_rows, -1)
    key_positions = torch.where(index[None] >= front, key_rows, -1)
    every_block = torch.arange(total_blocks)[None] * b
    query_blocks = torch.arange(n)[None] * b
    out_strides = (length * heads * value_dim, value_dim, heads * value_dim, 1)  # token-major, as allocated
    k = index.shape[-1]
    return {
        "key_blocks": offsets(key_strides, tokens=every_block).reshape(-1),
        "value_blocks": offsets(value_strides, tokens=every_block).reshape(-1),
        "keys": (packed * packed_units[0]).reshape(-1, k), "values": (packed * packed_units[1]).reshape(-1, k),
        "masks": masks.reshape(-1, k).contiguous(), "key_positions": key_positions.reshape(-1, k).contiguous(),
        "queries": offsets(query_strides, tokens=query_blocks).reshape(-1),
        "outs": offsets(out_strides, tokens=query_blocks).reshape(-1),
        "query_positions": offsets((front * b + length, 0, 1), tokens=front * b + query_blocks).reshape(-1),
    }
