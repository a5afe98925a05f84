"""Whether bf16 is worth asking for on a device.

bf16 autocast is a speed-up only where the hardware multiplies bf16: CUDA GPUs, and CPUs with AVX-512 bf16 or AMX
(which oneDNN reports through `torch.ops.mkldnn._is_mkldnn_bf16_supported`). Elsewhere (AVX2-only CPUs) bf16 matrix
products fall back to a reference kernel: a 4096x768x3072 product measured 0.001 TFLOP/s in bf16 against 0.075 in fp32
on an AVX2-only AMD EPYC with torch 2.13, so a `--bf16` run there is about 75x slower, not 2x faster.
"""

from __future__ import annotations

import contextlib

import torch


def native_bf16(device: str) -> bool:
    """True when `device` ("cpu", "cuda", "cuda:N") multiplies bf16 in hardware."""
    if device.split(":")[0] == "cuda":
        return True
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def slow_bf16_warning(device: str) -> str | None:
    """The warning to show when bf16 on `device` would be emulated, else None."""
    if native_bf16(device):
        return None
    return ("--bf16: this CPU has no bf16 arithmetic (no AVX-512 bf16 or AMX), so bf16 matrix products are emulated "
            "and far slower than fp32; leave out --bf16 here")


def store_encoder_linears_in(model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """`model` with the weights and biases of its encoder's `nn.Linear` layers stored in `dtype`, in place, for
    inference under `dtype` autocast (`--bf16` of `answer`, `evaluate`, `serve`); returns `model`.

    Autocast casts an fp32 weight to bf16 at every call of a Linear (round to nearest even, as `.to` does) and the
    product runs in bf16 either way, so the arithmetic is the same bit for bit and only the casts go: on an Intel Xeon
    with AMX a 4,096-token forward of the long reader took 0.827 s with fp32 weights and 0.751 s with bf16 ones
    (benchmarks/results/bf16_stored_linears_amx.md). Only the encoder (`model.base_model`): the conditional end head
    adds its Linear's bias to a bf16 product by hand, where an fp32 bias promotes the sum to fp32 and a bf16 one would
    not; LayerNorm, embeddings and position tables stay fp32, as autocast keeps them. The model then runs only under
    `dtype` autocast (an fp32 input to a bf16 Linear is a dtype error)."""
    for module in model.base_model.modules():
        if isinstance(module, torch.nn.Linear):
            module.to(dtype)
    return model


def bf16_autocast(device_type: str, enabled: bool):
    """bf16 autocast on `device_type` when `enabled`, else no context at all: `torch.autocast(enabled=False)` would
    switch off an autocast the caller already entered."""
    return torch.autocast(device_type, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()
