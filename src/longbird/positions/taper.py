"""TAPER: Tapered Absolute Positional Encoding Representations (KoBigBird-large, arXiv 2309.10339).

Notation: S (L, w) = the source's usable learned position rows (w: the embedding width), K = number of
repetitions, a_k = amplitude of repetition k (a_0 = 1), tau = temperature. The paper does not publish the exact
law; design.md §4 fixes it:
  scale:    E[k L + p] = a_k S[p]
  centered: E[k L + p] = mean(S) + a_k (S[p] - mean(S))
  exp:   a_k = exp(-k / tau);   power: a_k = tau^-k;   copy: a_k = 1 (Longformer's copy baseline).
Repeating from row s0 (`start`, longbird's addition for readers, issue 24): the repetitions beyond L cycle over the
source rows s0..L-1 only, with period P = L - s0 and k counted from 1 beyond L:
  E[L + m] = a_k S[s0 + (m mod P)],  k = 1 + floor(m / P)   (scale; centered alike),
so a reader whose question sits in rows 0..s0-1 never sees a document token with a question position. s0 = 0 is
the law above.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

TaperSchedule = Literal["exp", "power", "copy"]
TaperMode = Literal["scale", "centered"]
TAPER_SCHEDULES: tuple[str, ...] = ("exp", "power", "copy")
TAPER_MODES: tuple[str, ...] = ("scale", "centered")


def taper_amplitudes(repetitions: int, schedule: TaperSchedule = "exp", tau: float = 2.0) -> torch.Tensor:
    """a_k for k = 0..K-1 (design.md §4), float64 so the table is computed once at full precision."""
    k = torch.arange(repetitions, dtype=torch.float64)
    if schedule == "exp":
        return torch.exp(-k / tau)  # a_k = exp(-k/τ)
    if schedule == "power":
        return torch.tensor(tau, dtype=torch.float64) ** (-k)  # a_k = τ^-k
    if schedule == "copy":
        return torch.ones_like(k)  # a_k = 1
    raise ValueError(f"TAPER schedule must be one of {TAPER_SCHEDULES}; got {schedule!r}")


def extend_position_table(
    source_rows: torch.Tensor,
    target_length: int,
    schedule: TaperSchedule = "exp",
    mode: TaperMode = "scale",
    tau: float = 2.0,
    start: int = 0,
) -> torch.Tensor:
    """Extend S (L, w) to (target_length, w); rows 0..L-1 are bit-identical to S; rows beyond repeat S[start:]."""
    source_length = source_rows.shape[0]
    if target_length < source_length:
        raise ValueError(
            f"target length ({target_length}) is below the source's {source_length} positions; "
            f"use max_length >= {source_length}"
        )
    if mode not in TAPER_MODES:
        raise ValueError(f"TAPER mode must be one of {TAPER_MODES}; got {mode!r}")
    if tau <= 0:
        raise ValueError(f"TAPER tau must be > 0; got {tau}")
    if not 0 <= start < source_length:
        raise ValueError(f"TAPER start must be a source row, 0 <= start < {source_length}; got {start}")
    if start:
        return _extend_from(source_rows, target_length, schedule, mode, tau, start)
    repetitions = math.ceil(target_length / source_length)
    amplitudes = taper_amplitudes(repetitions, schedule, tau)[:, None, None]  # (K, 1, 1)
    rows = source_rows.detach().to(torch.float64)
    if mode == "scale":
        table = amplitudes * rows[None]
    else:
        mean = rows.mean(dim=0, keepdim=True)
        table = mean[None] + amplitudes * (rows - mean)[None]
    table = table.reshape(repetitions * source_length, -1)[:target_length].to(source_rows.dtype)
    table[:source_length] = source_rows.detach()  # exact copy: no float64 round trip on the source rows
    return table


def _extend_from(source_rows: torch.Tensor, target_length: int, schedule: TaperSchedule, mode: TaperMode, tau: float,
                 start: int) -> torch.Tensor:
    """The table with the repetitions cycling over rows start..L-1 (module docstring)."""
    source_length = source_rows.shape[0]
    period = source_length - start
    beyond = torch.arange(target_length - source_length)
    repetition = 1 + beyond // period  # k >= 1: row L + m is in repetition k
    amplitudes = taper_amplitudes(int(repetition.max()) + 1 if len(beyond) else 1, schedule, tau)[repetition, None]
    rows = source_rows.detach().to(torch.float64)
    picked = rows[start + beyond % period]
    if mode == "scale":
        extension = amplitudes * picked
    else:
        mean = rows.mean(dim=0, keepdim=True)
        extension = mean + amplitudes * (picked - mean)
    return torch.cat([source_rows.detach(), extension.to(source_rows.dtype)])
