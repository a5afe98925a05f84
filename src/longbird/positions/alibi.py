"""BiALiBi: bidirectional ALiBi with learnable per-head slopes (LittleBird, Lee et al. 2022, §3.1).

Notation: p = position ids (HF convention), H = heads. The attention score is q·k/√d − D with
  D_ij = 0                    if p_i = p_j
       = α_h                  if p_i = 0 or p_j = 0   (the [CLS] position: a constant, not times distance)
       = β_h (p_i − p_j)      if p_i > p_j            (key on the left)
       = γ_h (p_j − p_i)      if p_i < p_j            (key on the right)
D is computed from position ids, not token indices, so Padding Insertion (a jump in p) changes
distances and nothing else. Packed context keys get the uniform distance (β_h + γ_h)/2 · b (§3.3).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's geometric slopes (Press et al. 2021): 2^(-8h/H) for h = 1..H, interleaved when H is not 2^k."""
    def power_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if math.log2(num_heads).is_integer():
        return torch.tensor(power_of_two(num_heads))
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(power_of_two(closest) + extra)


def bialibi_terms(query_positions: torch.Tensor, key_positions: torch.Tensor):
    """The slope-free parts of D, each (..., q, k) fp32, so that D_h = β_h·left + γ_h·right + α_h·cls.

    left = p_i − p_j where the key is on the left, right = p_j − p_i where it is on the right, cls = 1 where
    either position is 0 (and p_i ≠ p_j); left and right are 0 where cls applies.
    """
    delta = query_positions[..., :, None].float() - key_positions[..., None, :].float()
    cls = ((query_positions[..., :, None] == 0) | (key_positions[..., None, :] == 0)) & (delta != 0)
    not_cls = (~cls).float()
    return delta.clamp(min=0) * not_cls, (-delta).clamp(min=0) * not_cls, cls.float()


class BiALiBi(nn.Module):
    """Per-head α, β, γ (learnable unless `learnable=False`), initialised from ALiBi's slopes."""

    def __init__(self, num_heads: int, learnable: bool = True):
        super().__init__()
        slopes = alibi_slopes(num_heads)
        self.alpha = nn.Parameter(slopes.clone(), requires_grad=learnable)
        self.beta = nn.Parameter(slopes.clone(), requires_grad=learnable)
        self.gamma = nn.Parameter(slopes.clone(), requires_grad=learnable)

    terms = staticmethod(bialibi_terms)  # what the blocked USW kernel's layout reads (attention.littlebird)

    def distance(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """D for query positions (..., q) and key positions (..., k) -> (..., H, q, k), fp32.

        Leading dims broadcast; heads are inserted before the last two dims.
        """
        left, right, cls = (term[..., None, :, :] for term in bialibi_terms(query_positions, key_positions))
        alpha, beta, gamma = (s.float().view(-1, 1, 1) for s in (self.alpha, self.beta, self.gamma))
        return beta * left + gamma * right + alpha * cls

    def pack_distance(self, block_size: int) -> torch.Tensor:
        """(H,) uniform distance to packed context tokens: (β + γ)/2 · b (LittleBird §3.3, D_C)."""
        return (self.beta.float() + self.gamma.float()) / 2 * block_size
