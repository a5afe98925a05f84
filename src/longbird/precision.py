"""Whether bf16 is worth asking for on a device.

bf16 autocast is a speed-up only where the hardware multiplies bf16: CUDA GPUs, and CPUs with AVX-512 bf16 or AMX
(which oneDNN reports through `torch.ops.mkldnn._is_mkldnn_bf16_supported`). Elsewhere (AVX2-only CPUs) bf16 matrix
products fall back to a reference kernel: a 4096x768x3072 product measured 0.001 TFLOP/s in bf16 against 0.075 in fp32
on an AVX2-only AMD EPYC with torch 2.13, so a `--bf16` run there is about 75x slower, not 2x faster.
"""

from __future__ import annotations

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
