"""TAPE: contextualised, equivariant position states (Zhu et al. 2025, arXiv 2501.00712; design.md §4).

Every token carries, per head, a position state e ∈ C^{d/2} stored as real (re, im) pairs: shape (B, H, l, d/2, 2).
- Attention reads it as RoPE reads its angles: a_ij = softmax(Re⟨q_i ⊙ e_i, k_j ⊙ e_j⟩ / √d), i.e. q and k are
  multiplied (complex, pair by pair) by their token's state and any kernel then runs unchanged (`rotate`).
- Attention writes it: e_i^h ← e_i^h + Σ_h' W_post[h, h'] Σ_j a^{h'}_ij e_j^{h'}. The sum over j is computed by the
  attention kernel itself, the states riding beside V (`with_states` / `split_states`); W_post (H × H, real, zero at
  init) really mixes heads (the official code only rescales each head by a row sum).
- The feed-forward block writes it: e_i^h ← e_i^h + Σ_c W2[h, c] · act(W_x m_i)[c] · Σ_h' W1[c, h'] e_i^{h'}
  (`TapeFeedForward`; W1 zero at init, I = 4H channels by default).
- The layer's input turns it (`TapePhase`, issue 26): e_i^{h,f} ← e_i^{h,f} · exp(i g_{h,f} c_h(x_i)), a rotation
  of each pair by an angle generated from the token's content: c_h = w_h · x_i is a per-head "clock" read from the
  hidden state, g_{h,f} a per-head, per-frequency gate, zero at init.
The maps of the attention and feed-forward sides are real and act on the head axis only, never on the (re, im) pair;
the phase is a multiplication by a unit complex number per token, head and pair. All of them commute with a rotation
common to all states (e.g. shifting every position id under `rope` init, or any unit complex per pair): it multiplies
every q_i ⊙ e_i and k_j ⊙ e_j alike and cancels in the logits, so relative-position invariance holds in every layer.

Why the phase. Without it, identity states (e = 1, the default for a converted absolute-position source) can never
leave the real line: every other map is real and treats all pairs alike, so e stays real and equal across pairs, and
attention computes s_i · s_j · q_i·k_j — a learned per-token temperature, not a position code. The paper's states
are tensorial and its updates equivariant under rotations of the state (Zhu et al. 2025, §3); its code starts from
RoPE angles. A converted source must equal itself at init, so longbird starts at e = 1 and lets the content turn the
states: the gate is zero (the source is reproduced exactly), its gradient at init is
∂L/∂g_{h,f} = Σ_i c_h(x_i) · ∂L/∂φ_{i,h,f} ≠ 0, and since a converted source's hidden states carry its absolute
positions, c_h(x_i) can learn to track position p_i and g_{h,f} the frequencies θ_f, which is RoPE
(φ = p·θ_f, RoFormer eq. 15) grown out of the source, then contextualised by the two updates above.
The rotation is in SO(2) per pair, so reflections (O(2)) are not an invariance: only rotations are needed for shifts.
"""

from __future__ import annotations

import torch
from torch import nn

TAPE_INITS = ("rope", "identity")  # the initial states: RoPE angles, or e = 1 (see `initial_states`)


def initial_states(position_ids: torch.Tensor, heads: int, head_dim: int, init: str, base: float = 10000.0,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B, H, l, d/2, 2) states from position ids (B, l). `rope`: angles p·θ_f with θ_f = base^(−2f/d) (RoFormer
    eq. 15), the same in every head; `identity`: e = 1 (a converted absolute-position model then equals its source)."""
    if head_dim % 2:
        raise ValueError("TAPE stores position states as complex pairs: the head dimension must be even; "
                         f"got {head_dim}")
    batch, length = position_ids.shape
    if init == "identity":
        states = torch.zeros(batch, 1, length, head_dim // 2, 2, dtype=dtype, device=position_ids.device)
        states[..., 0] = 1.0
    elif init == "rope":
        even = torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float64)
        frequencies = base ** (-even / head_dim)
        angles = position_ids.to(torch.float64)[:, None, :, None] * frequencies  # (B, 1, l, d/2)
        states = torch.stack([angles.cos(), angles.sin()], dim=-1).to(dtype)
    else:
        raise ValueError(f"tape_init must be one of {TAPE_INITS}; got {init!r}")
    return states.expand(batch, heads, length, head_dim // 2, 2).contiguous()


def rotate(x: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """x ⊙ e, pair by pair as complex numbers: x (B, H, l, d), states (B, H, l, d/2, 2) -> (B, H, l, d). The real dot
    product of two rotated vectors is Re⟨q ⊙ e_i, k ⊙ e_j⟩ (TAPE eq. for the attention logits)."""
    pairs = x.unflatten(-1, (-1, 2))
    re, im = pairs[..., 0], pairs[..., 1]
    c, s = states[..., 0].to(x.dtype), states[..., 1].to(x.dtype)
    # (re + i·im)(c + i·s) = (re·c − im·s) + i(re·s + im·c); with conj on k: Re⟨a, b⟩ = a_re·b_re + a_im·b_im.
    return torch.stack([re * c - im * s, re * s + im * c], dim=-1).flatten(-2)


def with_states(value: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """V and the states side by side, (B, H, l, d + d): the kernel's Σ_j a_ij [v_j, e_j] gives both sums at once."""
    return torch.cat([value, states.flatten(-2).to(value.dtype)], dim=-1)


def split_states(context: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel output of `with_states` values -> (context (B, H, l, d), Σ_j a_ij e_j (B, H, l, d/2, 2))."""
    return context[..., :head_dim], context[..., head_dim:].unflatten(-1, (-1, 2))


def mix_heads(weight: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """Σ_h' W[h, h'] e^{h'}: a real (H, H) map on the head axis of (B, H, l, d/2, 2) states."""
    return torch.einsum("hg,bgl...->bhl...", weight.to(states.dtype), states)


class TapeFeedForward(nn.Module):
    """e_i^h ← e_i^h + Σ_c W2[h, c] · act(W_x m_i)[c] · Σ_h' W1[c, h'] e_i^{h'} (TAPE, feed-forward side), with m_i
    the layer's output hidden state. W1 (`tape_ffn_in`) starts at zero, so the states are unchanged at init."""

    def __init__(self, hidden_size: int, heads: int, channels: int, activation: nn.Module):
        super().__init__()
        self.tape_ffn_gate = nn.Linear(hidden_size, channels)  # W_x
        self.tape_ffn_in = nn.Parameter(torch.zeros(channels, heads))  # W1: heads -> channels
        self.tape_ffn_out = nn.Parameter(torch.empty(heads, channels))  # W2: channels -> heads
        nn.init.normal_(self.tape_ffn_out, std=channels ** -0.5)
        self.activation = activation  # the model's hidden activation (config.hidden_act)

    def forward(self, states: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        gate = self.activation(self.tape_ffn_gate(hidden)).to(states.dtype)  # (B, l, I)
        channels = torch.einsum("ch,bhl...->bcl...", self.tape_ffn_in.to(states.dtype), states)
        channels = channels * gate.transpose(1, 2)[..., None, None]
        return states + torch.einsum("hc,bcl...->bhl...", self.tape_ffn_out.to(states.dtype), channels)


class TapePhase(nn.Module):
    """e_i^{h,f} ← e_i^{h,f} · exp(i g_{h,f} c_h(x_i)) with c_h(x) = w_h · x (`tape_phase_clock`, no bias: a constant
    angle would be a common rotation, which cancels) and g (`tape_phase_gate`, H × d/2) zero at init, so the states
    are unchanged at init and the gradient reaches g (see the module docstring)."""

    def __init__(self, hidden_size: int, heads: int, pairs: int):
        super().__init__()
        self.tape_phase_clock = nn.Linear(hidden_size, heads, bias=False)
        self.tape_phase_gate = nn.Parameter(torch.zeros(heads, pairs))

    def forward(self, states: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        clock = self.tape_phase_clock(hidden).to(states.dtype).transpose(1, 2)  # (B, H, l)
        angles = clock[..., None] * self.tape_phase_gate.to(states.dtype)[:, None, :]  # (B, H, l, d/2)
        turn = torch.stack([angles.cos(), angles.sin()], dim=-1)  # unit complex numbers, as states
        return rotate(states.flatten(-2), turn).unflatten(-1, (-1, 2))  # e · exp(iφ), pair by pair
