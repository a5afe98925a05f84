"""Where the time of longbird's sparse attention goes on a GPU: kernels alone, mask building, and one model forward.

Usage (GPU machine): python benchmarks/gpu/profile_flex.py [--lengths 4096 16384] [--out DIR]
Prints one table of medians (CUDA events) and a torch.profiler summary of one littlebird / kobigbird forward.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from longbird.attention import bigbird_attention, bigbird_pattern, usw_attention, usw_layout  # noqa: E402
from longbird.attention.flex import (bigbird_flex_attention, compiled_flex_attention,  # noqa: E402
                                     usw_flex_attention)
from longbird.bench.models import build_model, cuda_median_ms, forward_fn  # noqa: E402
from longbird.files import write_file_atomically  # noqa: E402
from longbird.positions.alibi import BiALiBi  # noqa: E402


def timed(fn, repeats=10):
    return cuda_median_ms(fn, repeats, warmup=3)


def kernels(length, dtype=torch.bfloat16, heads=12, dim=64, block=64):
    device = torch.device("cuda")
    q, k, v = (torch.randn(1, heads, length, dim, device=device, dtype=dtype) for _ in range(3))
    pk, pv = (torch.randn(1, heads, 64, dim, device=device, dtype=dtype) for _ in range(2))
    key_mask = torch.ones(1, length, dtype=torch.bool, device=device)
    positions = torch.arange(length, device=device)[None]
    slopes = BiALiBi(heads).to(device)
    pattern = bigbird_pattern(length // block, block, heads, 3, 0, 0)
    flex = compiled_flex_attention()
    rows = {
        "sdpa dense (flash)": lambda: F.scaled_dot_product_attention(q, k, v),
        "flex dense, no mask": lambda: flex(q, k, v),
        "usw flex (ours)": lambda: usw_flex_attention(q, k, v, key_mask, positions, slopes, block, pk, pv),
        "usw blocked": lambda: usw_attention(q, k, v, usw_layout(key_mask, positions, block, slopes), slopes, pk, pv),
        "bigbird flex (ours)": lambda: bigbird_flex_attention(q, k, v, key_mask, pattern),
        "bigbird blocked": lambda: bigbird_attention(q, k, v, key_mask, pattern),
    }
    results = {}
    with torch.inference_mode():
        for name, fn in rows.items():
            try:
                results[name] = f"{timed(fn):.3f} ms"
            except Exception as error:  # report and go on: this is a diagnosis script
                results[name] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
    return results


def profile_model(name, length):
    from torch.profiler import ProfilerActivity, profile

    model = build_model(name, length).to("cuda", torch.bfloat16)
    run = forward_fn(model, length, backward=False)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        run()
        torch.cuda.synchronize()
    table = profiler.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60)
    cpu = profiler.key_averages().table(sort_by="cpu_time_total", row_limit=8, max_name_column_width=60)
    return table, cpu


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    lines = []
    for length in args.lengths:
        for name, value in kernels(length).items():
            lines.append(f"{length:>6} | {name:<22} | {value}")
    report = []
    for model in ("littlebird", "kobigbird"):
        table, cpu = profile_model(model, args.lengths[0])
        report += [f"== {model} forward at {args.lengths[0]} (bf16), by CUDA time", table, "by CPU time", cpu]
    from torch._dynamo.utils import counters

    report.append(f"dynamo counters: { {k: dict(v) for k, v in counters.items() if k in ('stats', 'recompiles')} }")
    text = "\n".join(report + ["", "length | kernel                 | median"] + lines)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        write_file_atomically(args.out / "profile_flex.txt", text)
    print(text)


if __name__ == "__main__":
    main()
