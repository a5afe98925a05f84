"""Attention kernels. Imports only torch (the flex failure record, `flex_failures.py`, also uses longbird's stdlib-only
`sources.cache_root` and `files`). Layout (b, h, n, d); `*_mask` is bool, True = may attend."""

from .bigbird import bigbird_attention
from .full import full_attention
from .littlebird import USWLayout, pack_attention, usw_attention, usw_attention_reference, usw_layout
from .patterns import BigBirdPattern, bigbird_pattern, sliding_window_mask
from .reference import reference_attention

__all__ = ["BigBirdPattern", "USWLayout", "usw_layout", "bigbird_attention", "bigbird_pattern", "full_attention", "pack_attention",
           "reference_attention", "sliding_window_mask", "usw_attention", "usw_attention_reference"]
