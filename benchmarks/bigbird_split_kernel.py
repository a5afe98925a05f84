"""A candidate BigBird kernel for CPU inference, measured before it is built: the middle query blocks without gathering
their window and global keys (issue 27, "remove the data movement around the blocked kernels").

The model's kernel (`attention.bigbird._middle_attention`) copies, for every (head, middle block) row, its k key blocks
(first global, window of three, last global, r random) into one contiguous group with `index_select` and runs one SDPA
call over the groups. The candidate computes the same softmax as up to three flash-attention calls whose partial
results merge exactly by their log-sum-exps (o = Σ e^{L_i} o_i / Σ e^{L_i}, as LittleBird's split USW kernel does,
`usw_inference.usw_split_attention`):

- the window part reads each block's [left | own | right] keys in place, as overlapping strided views of the keys
  in token-major layout, block 1's left and block n-2's right block (the global blocks) masked: nothing counts twice;
- the global part: every middle query against the 2b keys of blocks 0 and n-1, one call per batch;
- the random part gathers only the r random blocks per row.

ITC pattern only (first and last block global, a window of three blocks, no padding): a measurement of what the full
kernel would save, not the kernel. Both are timed alternately in one process, one layer, batch 1, and the candidate's
largest difference from the model's kernel is reported beside it (fp32 rounding, or bf16 rounding of the outputs).

Usage: python benchmarks/bigbird_split_kernel.py [--length 4096] [--repeats 7] [--name bigbird_split_kernel]
Writes benchmarks/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from longbird.attention.bigbird import _middle_attention
from longbird.attention.patterns import bigbird_pattern
from longbird.bench.models import cpu_matmul_rates, describe_matmul_rates
from longbird.bench.sweep import DTYPES, alternating_times, cpu_model
from longbird.files import write_file_atomically

ROOT = Path(__file__).resolve().parents[1]
CASES = ((32, 3), (64, 3), (32, 0))  # (head size, random blocks): e5-small heads, base heads, no random blocks


def split_middle(query, key_tokens, value_tokens, key, value, pattern):
    """The candidate for batch 1: `key_tokens`/`value_tokens` (l, H, d) are the projection's token-major layout
    (of which `key`/`value` (1, H, l, d) are the head-major views the model's kernel takes)."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    heads, dim = query.shape[1], query.shape[-1]
    b, n = pattern.block_size, pattern.num_blocks
    m = n - 2
    middle = query[:, :, b:(n - 1) * b]  # (1, H, m·b, d)
    blocks = middle.reshape(heads, m, b, dim).transpose(0, 1)  # (m, H, b, d)
    window_keys = key_tokens.as_strided((m, heads, 3 * b, dim), (b * heads * dim, dim, heads * dim, 1))
    window_values = value_tokens.as_strided((m, heads, 3 * b, dim), (b * heads * dim, dim, heads * dim, 1))
    bias = torch.zeros(m, 1, 1, 3 * b, dtype=query.dtype)
    bias[0, ..., :b] = -1e4  # block 1's left block is global block 0
    bias[-1, ..., 2 * b:] = -1e4  # block n-2's right block is global block n-1
    window, window_lse = flash(blocks, window_keys, window_values, attn_mask=bias.expand(m, heads, b, 3 * b))
    parts = [window.transpose(0, 1).reshape(1, heads, m * b, dim)]
    lses = [window_lse.transpose(0, 1).reshape(1, heads, m * b)]
    global_keys = torch.cat([key[:, :, :b], key[:, :, -b:]], 2)
    global_values = torch.cat([value[:, :, :b], value[:, :, -b:]], 2)
    shared, shared_lse = flash(middle, global_keys, global_values)
    parts.append(shared)
    lses.append(shared_lse)
    r = pattern.random_blocks.shape[-1]
    if r:
        flat = (torch.arange(heads)[:, None, None] * n + pattern.random_blocks.clamp(min=0)).reshape(-1)
        random_keys = key.reshape(1, heads * n, b, dim).index_select(1, flat).view(1, heads * m, r * b, dim)
        random_values = value.reshape(1, heads * n, b, dim).index_select(1, flat).view(1, heads * m, r * b, dim)
        out, lse = flash(middle.reshape(1, heads * m, b, dim), random_keys, random_values)
        parts.append(out.reshape(1, heads, m * b, dim))
        lses.append(lse.reshape(1, heads, m * b))
    weights = torch.softmax(torch.stack(lses), dim=0)  # e^{L_i} / Σ e^{L_j}, fp32
    merged = sum(weight[..., None] * part.float() for weight, part in zip(weights, parts))
    return merged.to(query.dtype)


def measure(dtype_name, head_dim, random_blocks, length, repeats, heads=12, block=64):
    dtype = DTYPES[dtype_name]
    n = length // block
    pattern = bigbird_pattern(n, block, heads, random_blocks, 0, 0, "seeded", 0, True, 0)
    generator = torch.Generator().manual_seed(0)
    # token-major projections (l, H, d), as the model's Q/K/V projections lay them out; head-major views of them
    tokens = [torch.randn(length, heads, head_dim, generator=generator).to(dtype) for _ in range(3)]
    q, k, v = (t.transpose(0, 1)[None] for t in tokens)
    key_mask = torch.ones(1, length, dtype=torch.bool)
    workspace = {}
    model = lambda: _middle_attention(q, k, v, key_mask, pattern, workspace, 0.0)
    candidate = lambda: split_middle(q, tokens[1], tokens[2], k, v, pattern)
    with torch.inference_mode():
        difference = (candidate().float() - model().float()).abs().max().item()
        times = alternating_times({"model": model, "split": candidate}, repeats)
    model_s, split_s = statistics.median(times["model"]), statistics.median(times["split"])
    return {"dtype": dtype_name, "head_dim": head_dim,
            "random_blocks": random_blocks, "length": length, "model_ms": model_s * 1e3, "split_ms": split_s * 1e3,
            "ratio": split_s / model_s, "max_abs_difference": difference}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--name", default="bigbird_split_kernel")
    args = parser.parse_args()
    rates = cpu_matmul_rates()
    rows = []
    for dtype_name in ("fp32", "bf16"):
        for head_dim, random_blocks in CASES:
            rows.append(measure(dtype_name, head_dim, random_blocks, args.length, args.repeats))
            print(json.dumps(rows[-1]), flush=True)
    command = "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])
    result = {"command": command, "machine": f"{cpu_model()}, {torch.get_num_threads()} threads, torch "
                                             f"{torch.__version__}", "matmul_tflops": rates, "rows": rows}
    out = ROOT / "benchmarks" / "results" / args.name
    write_file_atomically(out.with_suffix(".json"), json.dumps(result, indent=1))
    lines = [f"Command: `{command}`  ",
             f"CPU: {result['machine']}; matmul {describe_matmul_rates(rates)}. One layer's middle query blocks "
             "(ITC, block 64, window 3, 12 heads, batch 1), medians of alternating calls.", "",
             "| dtype | head size | random blocks | model's kernel (gather + SDPA) | split (candidate) "
             "| split / model | max abs difference |", "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {row['dtype']} | {row['head_dim']} | {row['random_blocks']} | {row['model_ms']:.1f} ms | "
              f"{row['split_ms']:.1f} ms | {row['ratio']:.2f} | {row['max_abs_difference']:.1e} |" for row in rows]
    write_file_atomically(out.with_suffix(".md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
