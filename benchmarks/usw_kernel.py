"""LittleBird's USW attention at inference, one layer, four ways, timed alternately in one process (batch 1, 12
heads, b = 64, s = 64 pack tokens, contiguous positions):

- `chain`: the kernel before issue 27: bf16/fp32 scores by matmul, upcast to fp32, scale, BiALiBi bias by three
  addcmul passes, masked_fill, softmax, cast, matmul (still the path with attention dropout);
- `sdpa-fp32-bias`: one SDPA call over (head, block) rows, the bias of every head from an fp32 (H, 5) x (5, ·) product
  converted to the query's dtype;
- `sdpa`: the same with the bias product computed in the query's dtype (the CPU inference kernel until the split),
  its key groups written into reused buffers as in the model;
- `split` (what `usw_attention` runs at CPU inference now): no key groups; two flash-attention calls, the window
  keys read in place, merged by their log-sum-exps (`usw_inference.usw_split_attention`).

Usage: python benchmarks/usw_kernel.py [--head-dims 32 64] [--lengths 4096] [--dtypes bf16 fp32] [--repeats 7]
[--name usw_kernel]. Writes benchmarks/results/NAME.{json,md} (`usw_bias_dtype` is a run of the first three).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from longbird.attention import usw_attention, usw_layout
from longbird.attention.littlebird import _biased_scores, _key_groups
from longbird.attention.usw_inference import MASKED_BIAS, usw_bias
from longbird.bench.sweep import alternating_times, cpu_model
from longbird.files import write_file_atomically
from longbird.positions.alibi import BiALiBi

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def variants(dtype, head_dim, length, heads=12, block=64, pack=64):
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, length, head_dim, generator=generator).to(dtype) for _ in range(3))
    pk, pv = (torch.randn(1, heads, pack, head_dim, generator=generator).to(dtype) for _ in range(2))
    slopes = BiALiBi(heads, learnable=False)
    layout = usw_layout(torch.ones(1, length, dtype=torch.bool), torch.arange(length)[None], block, slopes)
    n, keys_per_block = length // block, pack + 4 * block
    blocks = lambda x: x.view(1, heads, n, block, x.shape[-1])
    pack_bias = slopes.pack_distance(block)

    def chain():
        keys, values = _key_groups(blocks(k), blocks(v), pk, pv, n, None)
        scores = _biased_scores(blocks(q), keys, layout, slopes.alpha, slopes.beta, slopes.gamma, pack_bias, pack,
                                head_dim ** -0.5)
        return torch.matmul(torch.softmax(scores, -1).to(values.dtype), values).view(1, heads, length, head_dim)

    def sdpa_fp32_bias():
        keys, values = _key_groups(blocks(k), blocks(v), pk, pv, n, None)
        weights = torch.stack([slopes.alpha, slopes.beta, slopes.gamma, pack_bias,
                               torch.full((heads,), MASKED_BIAS)], -1).float()
        bias = torch.matmul(weights.neg(), layout.score_terms(pack)).to(dtype)
        return F.scaled_dot_product_attention(
            q.reshape(1, heads * n, block, head_dim), keys.view(1, heads * n, keys_per_block, head_dim),
            values.view(1, heads * n, keys_per_block, head_dim),
            attn_mask=bias.view(1, heads * n, block, keys_per_block)).view(1, heads, length, head_dim)

    workspace = {}  # the model passes one per call, reused by every layer (no fresh multi-MB buffers per layer)

    def sdpa():
        keys, values = _key_groups(blocks(k), blocks(v), pk, pv, n, workspace)
        bias = usw_bias(layout, slopes, pack_bias, pack, dtype)
        return F.scaled_dot_product_attention(
            q.reshape(1, heads * n, block, head_dim), keys.view(1, heads * n, keys_per_block, head_dim),
            values.view(1, heads * n, keys_per_block, head_dim),
            attn_mask=bias.view(1, heads * n, block, keys_per_block)).view(1, heads, length, head_dim)

    def split():
        return usw_attention(q, k, v, layout, slopes, pk, pv, workspace)

    return {"chain": chain, "sdpa-fp32-bias": sdpa_fp32_bias, "sdpa": sdpa, "split": split}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096])
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["bf16", "fp32"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--name", default="usw_kernel")
    args = parser.parse_args()
    rows = []
    with torch.inference_mode():
        for dtype in args.dtypes:
            for head_dim in args.head_dims:
                for length in args.lengths:
                    fns = variants(DTYPES[dtype], head_dim, length)
                    reference = fns["chain"]().float()
                    errors = {name: (fn().float() - reference).abs().max().item() for name, fn in fns.items()}
                    times = alternating_times(fns, args.repeats)
                    row = {"dtype": dtype, "head_dim": head_dim, "length": length,
                           **{f"{name}_ms": 1000 * statistics.median(t) for name, t in times.items()},
                           **{f"{name}_max_diff_to_chain": e for name, e in errors.items()}}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    command = "python benchmarks/usw_kernel.py " + " ".join(sys.argv[1:])
    report = {"command": command, "cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "rows": rows}
    lines = [f"Command: `{command}`  ", f"CPU: {report['cpu']}, {report['threads']} threads, torch {torch.__version__}; "
             "one USW layer at inference, batch 1, 12 heads, b = 64, 64 pack tokens; medians of alternating calls.", "",
             "| dtype | head dim | tokens | chain ms | SDPA, fp32 bias ms | SDPA, bias in dtype ms | split ms "
             "| max diff to chain: SDPA, split |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['dtype']} | {row['head_dim']} | {row['length']} | {row['chain_ms']:.1f} | "
                     f"{row['sdpa-fp32-bias_ms']:.1f} | {row['sdpa_ms']:.1f} | **{row['split_ms']:.1f}** | "
                     f"{row['sdpa_max_diff_to_chain']:.2g}, {row['split_max_diff_to_chain']:.2g} |")
    out = ROOT / "benchmarks" / "results"
    write_file_atomically(out / f"{args.name}.json", json.dumps(report, indent=2) + "\n")
    write_file_atomically(out / f"{args.name}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
