"""Attention kernels. Imports only torch. Layout (b, h, n, d); `*_mask` is bool, True = may attend."""

from .bigbird import bigbird_attention
from .full import full_attention
from .patterns import BigBirdPattern, bigbird_pattern
from .reference import reference_attention

__all__ = ["BigBirdPattern", "bigbird_attention", "bigbird_pattern", "full_attention", "reference_attention"]
