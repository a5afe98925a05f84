"""Attention kernels: full, BigBird ITC and LittleBird USW/pack attention (blocked, compiled flex, dense oracles), their
block patterns and the per-row plan. Imports only torch and the standard library (`lint-imports` checks it); which
kernel a layer runs is decided above this package, in `longbird.dispatch`.

Notation for tensor shapes, in every docstring and comment of this package and of `longbird.positions`:
    B batch, H heads, l sequence length (tokens), d head size (d_v: the value width, wider when TAPE states ride
    beside V), b block size (tokens per block), n blocks (l / b), r random key blocks per query block, s pack size
    (LittleBird's packed context), T a flex tile (a multiple of b). `*_mask` is bool, True = may attend / real token.
"""

from .bigbird import bigbird_attention
from .full import full_attention
from .littlebird import USWLayout, pack_attention, usw_attention, usw_attention_reference, usw_layout
from .patterns import BigBirdPattern, bigbird_pattern, sliding_window_mask
from .reference import reference_attention

__all__ = [
           "BigBirdPattern",
           "USWLayout",
           "bigbird_attention",
           "bigbird_pattern",
           "full_attention",
           "pack_attention",
           "reference_attention",
           "sliding_window_mask",
           "usw_attention",
           "usw_attention_reference",
           "usw_layout",
]
