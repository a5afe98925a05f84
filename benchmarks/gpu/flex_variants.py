"""Why is block-masked flex slower than dense flex? Times flex variants at one length (GPU diagnosis script).

Usage: python benchmarks/gpu/flex_variants.py [--length 16384]
Each variant gets its own torch.compile (static shapes) so automatic-dynamic recompiles do not mix them up.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import flex_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from longbird.attention import flex as lf  # noqa: E402
from longbird.bench.models import cuda_median_ms  # noqa: E402
from longbird.positions.alibi import BiALiBi  # noqa: E402


def timed(fn, repeats=10):
    return cuda_median_ms(fn, repeats, warmup=2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--length", type=int, default=16384)
    length = parser.parse_args().length
    heads, dim, b = 12, 64, 64
    q, k, v = (torch.randn(1, heads, length, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    key_mask = torch.ones(1, length, dtype=torch.bool, device="cuda")
    n = length // b
    window = lf.usw_block_table(n, 0, q.device)  # (n, n) at block level, no pack

    def masks(tile, with_mod):
        group = tile // b
        table = window[None, None]
        allowed = lf._tiles(table, group, "any")
        full = lf._tiles(table, group, "all") if with_mod != "none" else allowed
        mods = {
            "none": None,
            "padding": lambda bi, h, qi, ki: key_mask[bi, ki],
            "table": lambda bi, h, qi, ki: table[0, 0, qi // b, ki // b] & key_mask[bi, ki],
        }
        return lf.block_mask_from_tables(allowed, full, tile, mods[with_mod], length, length)

    slopes = BiALiBi(heads).cuda()
    positions = torch.arange(length, device="cuda")[None]
    beta = slopes.beta.float().detach()

    def bias(score, bi, h, qi, ki):
        delta = (positions[bi, qi] - positions[bi, ki]).float()
        return score - beta[h] * delta.abs()

    results = {}

    def variant(name, call, backward=False):
        try:
            if backward:
                qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
                results[name] = timed(lambda: call(qq, kk, vv).sum().backward())
            else:
                with torch.inference_mode():
                    results[name] = timed(lambda: call(q, k, v))
        except Exception as error:
            results[name] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:150]}"
        print(f"{name:<55} {results[name] if isinstance(results[name], str) else f'{results[name]:.3f} ms'}",
              flush=True)

    def fresh():
        return torch.compile(flex_attention, dynamic=False)

    dense = fresh()
    variant("dense, no mask", lambda a, b_, c: dense(a, b_, c))
    for tile, mod in ((128, "none"), (128, "padding"), (128, "table")):
        block_mask = masks(tile, mod)
        compiled = fresh()
        variant(f"tile {tile}, mask_mod {mod}", lambda a, b_, c, m=block_mask, f=compiled: f(a, b_, c, block_mask=m))
    block_mask = masks(128, "table")
    compiled = fresh()
    variant("tile 128, mask_mod table, + bialibi score_mod",
            lambda a, b_, c, f=compiled: f(a, b_, c, score_mod=bias, block_mask=block_mask))
    for mod in ("none", "padding"):
        block_mask = masks(64, mod)
        compiled = fresh()
        options = {"BLOCK_M": 64, "BLOCK_N": 64}
        variant(f"tile 64 (BLOCK 64), mask_mod {mod}",
                lambda a, b_, c, m=block_mask, f=compiled: f(a, b_, c, block_mask=m, kernel_options=options))
        variant(f"tile 64 (BLOCK 64), mask_mod {mod}, fwd+bwd",
                lambda a, b_, c, m=block_mask, f=compiled: f(a, b_, c, block_mask=m, kernel_options=options),
                backward=True)
    compiled = fresh()
    block_mask = masks(128, "table")
    variant("tile 128, mask_mod table, fwd+bwd", lambda a, b_, c, f=compiled: f(a, b_, c, block_mask=block_mask),
            backward=True)
    variant("mask building only (usw tables, tile 128)", lambda a, b_, c: masks(128, "table"))
    variant("ours: usw_flex_attention (model path)",
            lambda a, b_, c: lf.usw_flex_attention(a, b_, c, key_mask, positions, slopes, b))


if __name__ == "__main__":
    main()
