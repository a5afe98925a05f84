"""Scratch buffers shared by the layers of one forward call (inference only).

On CPU a fresh multi-MB tensor costs more in page faults than the copy that fills it, so kernels write
their gathered/concatenated key and value blocks into one buffer per shape, reused layer after layer.
"""

from __future__ import annotations

import torch


def scratch_buffer(workspace: dict | None, name: str, shape, like: torch.Tensor) -> torch.Tensor | None:
    """A reusable buffer, or None when there is no workspace or autograd is on (it may save the tensor)."""
    if workspace is None or torch.is_grad_enabled():
        return None
    key = (name, tuple(shape), like.dtype, like.device)
    if key not in workspace:
        workspace[key] = torch.empty(shape, dtype=like.dtype, device=like.device)
    return workspace[key]


def concat_into(groups, dim: int, workspace: dict | None, name: str) -> torch.Tensor:
    """torch.cat, into a reused buffer at inference."""
    shape = list(groups[0].shape)
    shape[dim] = sum(group.shape[dim] for group in groups)
    out = scratch_buffer(workspace, name, shape, groups[0])
    return torch.cat(groups, dim=dim) if out is None else torch.cat(groups, dim=dim, out=out)
