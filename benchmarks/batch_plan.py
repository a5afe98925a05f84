"""What padding and batching cost on this CPU: the evidence for `data.batching.plan_batches`' fill bound.

1. The long reader on a Korean document of `--document-tokens` tokens: its windows (a full one and a shorter last one)
   read in one padded batch against one window at a time (`qa.run_windows`, as `Reader.answer` and the server do).
2. A short reader: `n` windows of `l` random tokens in one batch against one by one (`--shapes n:l ...`).
Alternating calls, medians, bf16 autocast with the encoder's Linear weights stored in bf16 (`--bf16`, where the CPU
multiplies bf16) or fp32.
Usage: python benchmarks/batch_plan.py --long-model DIR --short-model DIR [--bf16] [--name NAME]
Writes benchmarks/results/NAME.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from longbird.bench.models import cpu_matmul_rates, describe_matmul_rates
from longbird.bench.sweep import alternating_times, cpu_model
from longbird.files import write_file_atomically
from longbird.qa import run_windows
from longbird.reader import Reader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import documents  # the serving benchmark's Korean documents

ROOT = Path(__file__).resolve().parents[1]


def alternate(calls: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each call, the calls run in turn (`bench.sweep.alternating_times`)."""
    return {name: statistics.median(times) for name, times in alternating_times(calls, repeats).items()}


def long_document(model_dir: str, tokens: int, bf16: bool, repeats: int) -> dict:
    reader = Reader(model_dir, bf16=bf16, window_length=None)
    question, text = documents(reader, (tokens,))[tokens][0]
    window = reader.model.config.max_position_embeddings
    features = reader.prepare(question, text, window_length=window).features
    top_k = reader.model.config.qa_top_k

    def together():
        with reader._precision():
            run_windows(reader.model, features, top_k)

    def apart():
        with reader._precision():
            for feature in features:
                run_windows(reader.model, [feature], top_k)

    return {"document_tokens": tokens, "window": window, "windows": [len(f.input_ids) for f in features],
            **{f"{name}_s": seconds for name, seconds in alternate({"together": together, "apart": apart},
                                                                   repeats).items()}}


def short_windows(model_dir: str, shapes: list[tuple[int, int]], bf16: bool, repeats: int) -> list[dict]:
    reader = Reader(model_dir, bf16=bf16)
    rows = []
    def forward(batch):
        with torch.no_grad(), reader._precision():
            reader.model(input_ids=batch, attention_mask=torch.ones_like(batch))

    for count, length in shapes:
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(5, reader.model.config.vocab_size, (count, length), generator=generator)
        rows_of = [ids[i:i + 1] for i in range(count)]
        seconds = alternate({"batched": lambda ids=ids: forward(ids),
                             "one_by_one": lambda rows_of=rows_of: [forward(row) for row in rows_of]}, repeats)
        rows.append({"windows": count, "tokens": length, **{f"{k}_s": v for k, v in seconds.items()}})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long-model", required=True)
    parser.add_argument("--short-model", required=True)
    parser.add_argument("--document-tokens", type=int, default=4096)
    parser.add_argument("--shapes", nargs="+", default=["16:128", "16:256", "4:512"], help="windows:tokens")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--name", default="batch_plan")
    args = parser.parse_args(argv)
    shapes = [tuple(int(x) for x in shape.split(":")) for shape in args.shapes]
    long_row = long_document(args.long_model, args.document_tokens, args.bf16, args.repeats)
    short_rows = short_windows(args.short_model, shapes, args.bf16, args.repeats)
    command = "python benchmarks/batch_plan.py " + " ".join(sys.argv[1:] if argv is None else argv)
    precision = "bf16 autocast, encoder Linear weights stored in bf16" if args.bf16 else "fp32"
    lines = [f"Command: `{command}`  ", f"CPU: {cpu_model()}, {torch.get_num_threads()} threads, torch "
             f"{torch.__version__}; {describe_matmul_rates(cpu_matmul_rates())}. {precision}; medians of "
             f"{args.repeats} alternating calls.", "",
             f"Long reader ({args.long_model}), a {long_row['document_tokens']:,}-token document in windows of "
             f"{long_row['window']:,}: window lengths {long_row['windows']}; one padded batch "
             f"**{long_row['together_s']:.3f} s**, one window at a time **{long_row['apart_s']:.3f} s**.", "",
             f"| windows x tokens ({args.short_model}) | one batch | one by one | one by one / batch |",
             "|---|---:|---:|---:|"]
    for row in short_rows:
        lines.append(f"| {row['windows']} x {row['tokens']} | {row['batched_s']:.3f} s | {row['one_by_one_s']:.3f} s "
                     f"| {row['one_by_one_s'] / row['batched_s']:.2f} |")
    out = ROOT / "benchmarks" / "results" / args.name
    write_file_atomically(out.with_suffix(".md"), "\n".join(lines) + "\n")
    write_file_atomically(out.with_suffix(".json"), json.dumps({"command": command, "cpu": cpu_model(),
                                                                "long": long_row, "short": short_rows}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
