"""Compiled block-sparse backend: BigBird ITC and LittleBird USW on `torch.nn.attention.flex_attention`.

Shapes in the notation of `longbird.attention` (B, H, l, d, b, n, s, T).
The pattern is a block table (which key blocks each query block sees, (n, n_kv) at block level, never l x l),
handed to flex as a `BlockMask` built from block indices (`BlockMask.from_kv_blocks`). Tiles whose keys are all
real and all allowed are "full": no mask_mod runs there, and measured on an H100 a mask_mod costs ~10x in the
tiles it runs in (benchmarks/results/flex_variants_h100.md). So tiles are the pattern's own blocks (T = b, exact:
only tiles holding padding run the mask_mod) wherever flex has a kernel for them: on CPU, and for inference on
CUDA (Triton tiles of b). flex's CUDA backward kernels need 128-token tiles, so with autograd on CUDA the b-block
table is OR-ed into T = 128 tiles (inputs padded to a tile multiple) and the mask_mod, which always repeats the
exact b-block pattern and the key padding, carves the pattern inside them: the function is the same at any tile.
A BlockMask depends on the padding only, so one forward call builds it once (`workspace`) for all its layers.
BiALiBi (LittleBird §3.1) and the packed-context distance (§3.3, D_C) are a `score_mod` on position ids.

Both functions compute exactly what `bigbird_attention` / `usw_attention` compute (tests compare them with the
dense references); flex's kernel is a fused online-softmax one, so no score tensor is stored.
Without `torch.compile` flex runs its dense math path: correct (used by CPU tests) but O(l^2).
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from .patterns import BigBirdPattern, sliding_window_blocks
from .tracing import outside_the_trace

GPU_TILE = 128  # flex's default sparse block: every default GPU kernel configuration divides it


@functools.cache
def compiled_flex_attention():
    """flex_attention through torch.compile, built once per process. The first call compiles; a second shape
    compiles once more with dynamic shapes (torch.compile's default), so new lengths do not recompile again.
    Each (score_mod, dtype, autograd) combination is a graph of its own: past dynamo's default limit of 8 it would
    silently fall back to eager flex (O(l^2) memory), so the limit is raised."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 128)
    return torch.compile(flex_attention)


def flex_tile(device: torch.device, block_size: int, grad: bool) -> int:
    """The flex tile: b (exact) on CPU and for CUDA inference; with autograd on CUDA 128 when b divides it."""
    if device.type == "cuda" and grad and GPU_TILE % block_size == 0:
        return GPU_TILE
    return block_size


def _kernel_options(device: torch.device, tile: int) -> dict | None:
    # Triton's forward tiles must divide ours: its defaults are 128 wide.
    return {"BLOCK_M": tile, "BLOCK_N": tile} if device.type == "cuda" and tile < GPU_TILE else None


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


_FROM_KV_TAKES_LENGTHS = "seq_lengths" in inspect.signature(BlockMask.from_kv_blocks).parameters


def _tiles(table: torch.Tensor, group: int, reduce: str) -> torch.Tensor:
    """(..., n_q, n_kv) block table -> (..., n_q/g, n_kv/g) tile table with any() or all() over each g x g group."""
    *lead, n_q, n_kv = table.shape
    grouped = table.reshape(*lead, n_q // group, group, n_kv // group, group)
    reduced = getattr(grouped, reduce)(dim=-1)
    return getattr(reduced, reduce)(dim=-2)


def block_mask_from_tables(allowed: torch.Tensor, full: torch.Tensor, tile: int, mask_mod,
                           query_length: int, key_length: int) -> BlockMask:
    """A BlockMask from tile tables (B, H, n_q, n_kv) bool: `allowed` tiles, of which `full` need no mask_mod."""
    allowed, full = torch.broadcast_tensors(allowed, full)
    partial = allowed & ~full

    def indices(table):
        counts = table.sum(-1, dtype=torch.int32)
        # Listed tiles first, in increasing order (stable sort on "not listed").
        order = torch.sort((~table).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
        return counts, order

    kv_num, kv_index = indices(partial)
    full_num, full_index = indices(full)
    extra = {"seq_lengths": (query_length, key_length)} if _FROM_KV_TAKES_LENGTHS else {}
    return BlockMask.from_kv_blocks(kv_num, kv_index, full_num, full_index, BLOCK_SIZE=tile, mask_mod=mask_mod,
                                    **extra)


def _pad_length(x: torch.Tensor, dim: int, length: int, value=0) -> torch.Tensor:
    extra = length - x.shape[dim]
    if extra == 0:
        return x
    pad = [0, 0] * (x.dim() - dim - 1) + [0, extra]
    return F.pad(x, pad, value=value)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _run(query, key, value, score_mod, block_mask, compiled, tile):
    attend = compiled_flex_attention() if compiled else flex_attention
    return attend(query, key, value, score_mod=score_mod, block_mask=block_mask,
                  kernel_options=_kernel_options(query.device, tile))


def _once_per_call(workspace: dict | None, key, build):
    """`build()` once per forward call (the workspace dict lives for one call), every time without one."""
    if workspace is None:
        return build()
    if key not in workspace:
        workspace[key] = build()
    return workspace[key]


@functools.lru_cache(maxsize=96)  # 8 lengths x 12 layers; a table at 32K is H x 512 x 512 bytes on the device
def bigbird_block_table(pattern: BigBirdPattern, device: torch.device) -> torch.Tensor:
    """The pattern's (H, n, n) block table on `device`, copied once per (layer plan, device), outside any trace."""
    with outside_the_trace():
        return pattern.block_table().to(device)


def bigbird_flex_attention(query, key, value, key_mask, pattern: BigBirdPattern, compiled: bool = True,
                           tile: int | None = None, workspace: dict | None = None):
    """Same contract as `bigbird_attention`: (B, H, l, d) with l = n·b, key_mask (B, l) bool.
    `tile` (a multiple of b) overrides the device's flex tile (tests); `workspace`: a dict owned by one forward
    call, in which the layers' block masks are kept (they depend on the layer's plan and the padding only)."""
    batch, _, length, _ = query.shape
    b, n = pattern.block_size, pattern.num_blocks
    tile = tile or flex_tile(query.device, b, _needs_grad(query, key, value))
    padded = _round_up(length, tile)
    n_padded = padded // b
    query, key, value = (_pad_length(x, 2, padded) for x in (query, key, value))
    key_mask = _pad_length(key_mask, 1, padded, False)

    table = F.pad(bigbird_block_table(pattern, query.device), (0, n_padded - n, 0, n_padded - n))[None]

    def key_padding(batch_index, head, query_index, key_index):
        # The exact b-block pattern at token level: tiles may be coarser, and the eager path reads only this.
        return table[0, head, query_index // b, key_index // b] & key_mask[batch_index, key_index]

    def build():
        real = key_mask.view(batch, n_padded, b).all(-1)  # (B, n') key blocks without padding
        group = tile // b
        return block_mask_from_tables(_tiles(table, group, "any"), _tiles(table & real[:, None, None, :], group, "all"),
                                      tile, key_padding, padded, padded)

    block_mask = _once_per_call(workspace, ("flex-bigbird", id(pattern), tile, padded), build)
    return _run(query, key, value, None, block_mask, compiled, tile)[:, :, :length]


def usw_block_table(num_blocks: int, pack_blocks: int, device) -> torch.Tensor:
    """(n, P + n) bool: query block i sees the P pack blocks, token block 0 (global) and blocks i-1, i, i+1."""
    tokens = sliding_window_blocks(num_blocks, device)
    return torch.cat([tokens.new_ones(num_blocks, pack_blocks), tokens], dim=1)


def usw_flex_attention(query, key, value, key_mask, positions, slopes, block_size: int,
                       pack_key=None, pack_value=None, compiled: bool = True, tile: int | None = None,
                       workspace: dict | None = None):
    """Same contract as `usw_attention` (LittleBird §3.3) with key_mask (B, l) and position ids (B, l).

    Pack keys are placed in front of the token keys, padded to a tile multiple (the padding is masked).
    `tile` (a multiple of b) overrides the device's flex tile (tests); `workspace` as in bigbird_flex_attention
    (one block mask serves every layer of a call).
    """
    batch, _, length, _ = query.shape
    b = block_size
    n = length // b
    grad = _needs_grad(query, key, value, pack_key, pack_value, slopes.alpha, slopes.beta, slopes.gamma)
    tile = tile or flex_tile(query.device, b, grad)
    padded = _round_up(length, tile)
    n_padded = padded // b
    s = 0 if pack_key is None else pack_key.shape[2]
    front = _round_up(s, tile)  # key index of the first token key
    pack_blocks = front // b
    query, key, value = (_pad_length(x, 2, padded) for x in (query, key, value))
    key_mask = _pad_length(key_mask, 1, padded, False)
    positions = _pad_length(positions, 1, padded)
    if s:
        key = torch.cat([_pad_length(pack_key, 2, front), key], dim=2)
        value = torch.cat([_pad_length(pack_value, 2, front), value], dim=2)

    table = _once_per_call(workspace, ("flex-usw-table", tile, padded, s), lambda: F.pad(
        usw_block_table(n, pack_blocks, query.device), (0, n_padded - n, 0, n_padded - n))[None, None])  # (1,1,n',P+n')

    def key_padding(batch_index, head, query_index, key_index):
        # The exact b-block pattern at token level: tiles may be coarser, and the eager path reads only this.
        token = (key_index - front).clamp(min=0)
        allowed = table[0, 0, query_index // b, key_index // b]
        return allowed & torch.where(key_index < front, key_index < s, key_mask[batch_index, token])

    alpha, beta, gamma = (slope.float() for slope in (slopes.alpha, slopes.beta, slopes.gamma))
    # (H,); without pack keys a constant (a score_mod may index a tensor that needs grad only once).
    pack_distance = slopes.pack_distance(b) if s else torch.zeros_like(alpha)

    def bialibi(score, batch_index, head, query_index, key_index):
        # score − D (LittleBird §3.1 for token keys; §3.3 D_C = (β+γ)/2·b for packed keys).
        token = (key_index - front).clamp(min=0)
        p_query, p_key = positions[batch_index, query_index], positions[batch_index, token]
        delta = (p_query - p_key).float()
        is_cls = ((p_query == 0) | (p_key == 0)) & (delta != 0)
        distance = torch.where(delta > 0, beta[head] * delta, -gamma[head] * delta)
        distance = torch.where(is_cls, alpha[head], distance)
        distance = torch.where(key_index < front, pack_distance[head], distance)
        return score - distance

    def build():
        real_pack = torch.arange(pack_blocks, device=query.device) < s // b  # pack blocks without padding
        real = torch.cat([real_pack[None].expand(batch, -1), key_mask.view(batch, n_padded, b).all(-1)], dim=1)
        group = tile // b
        return block_mask_from_tables(_tiles(table, group, "any"), _tiles(table & real[:, None, None, :], group, "all"),
                                      tile, key_padding, padded, key.shape[2])

    block_mask = _once_per_call(workspace, ("flex-usw", tile, padded, s), build)
    return _run(query, key, value, bialibi, block_mask, compiled, tile)[:, :, :length]
