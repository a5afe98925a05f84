"""A model exported by `longbird export --format onnx` run by ONNX Runtime, against the same model in PyTorch (eager,
inference mode), fp32, on the same inputs: one document of each length, and a padded batch of three rows (the
length, half of it, and 300 tokens or fewer: for kobigbird e5-small a sparse, a sparse and a full row). Calls
alternate between the two and the medians are reported; ONNX Runtime gets as many intra-op threads as torch. Random
token ids: speed does not depend on which tokens.
Usage: python benchmarks/onnx_runtime.py --model DIR --onnx OUT [--length 1024 2048 4096] [--repeats 5] [--name onnx]
Writes benchmarks/results/NAME.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import onnxruntime
import torch

from longbird.bench.models import matmul_throughput
from longbird.bench.report import write_table
from longbird.bench.sweep import alternating_times, cpu_model
from longbird.checkpoints import saved_model_class
from longbird.export import ONNX_RECORD

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floor import code_version  # the same commit line as the floor benchmark


def batches(length: int, shortest: int, vocab: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(length)
    single = torch.randint(5, vocab, (1, length), generator=generator)
    rows = [length, length // 2, min(300, shortest - 1)]
    padded = torch.randint(5, vocab, (3, length), generator=generator)
    mask = torch.zeros_like(padded)
    for row, real in enumerate(rows):
        mask[row, :real] = 1
    return {"1 document": (single, torch.ones_like(single)),
            f"3 rows ({', '.join(map(str, rows))} tokens)": (padded * mask, mask)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the saved longbird model")
    parser.add_argument("--onnx", type=Path, required=True, help="its `longbird export --format onnx` directory")
    parser.add_argument("--length", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--name", default="onnx_runtime")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()

    config = json.loads((args.model / "config.json").read_text(encoding="utf-8"))
    model = saved_model_class(config).from_pretrained(args.model).float().eval()
    record = json.loads((args.onnx / ONNX_RECORD).read_text(encoding="utf-8"))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = onnxruntime.InferenceSession(str(args.onnx / "model.onnx"), options)
    first_output = record["outputs"][0]
    rows = []
    for length in args.length:
        inputs = batches(length, record["lengths"]["shortest"], model.config.vocab_size)
        for label, (input_ids, mask) in inputs.items():
            feed = {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()}

            def pytorch(input_ids=input_ids, mask=mask):
                with torch.inference_mode():
                    return model(input_ids=input_ids, attention_mask=mask)[first_output]

            def ort(feed=feed):
                return session.run([first_output], feed)[0]

            real = mask.bool()
            difference = float(abs(ort()[real.numpy()] - pytorch()[real].numpy()).max())  # also the warm-up
            times = alternating_times({"pytorch": pytorch, "onnxruntime": ort}, args.repeats)
            medians = {name: statistics.median(values) for name, values in times.items()}
            rows.append({"length": length, "batch": label, **{f"{name}_seconds": value for name, value in
                                                               medians.items()},
                         "samples": times, "max_abs_difference": difference})
            print(rows[-1]["length"], label, medians, difference, flush=True)
    report = {"command": "python " + " ".join(sys.argv), "code": code_version(), "cpu": cpu_model(),
              "threads": torch.get_num_threads(), "torch": torch.__version__,
              "onnxruntime": onnxruntime.__version__, "architecture": record["architecture"],
              "model_settings": {key: config.get(key) for key in ("attention", "hidden_size", "num_hidden_layers",
                                                                  "max_position_embeddings", "block_size")},
              "matmul_tflops_fp32": matmul_throughput(torch.float32) / 1e12, "rows": rows}
    lines = [f"Command: `{report['command']}`  ",
             f"Code: {report['code']}; torch {report['torch']}, onnxruntime {report['onnxruntime']}  ",
             f"CPU: {report['cpu']}, {report['threads']} threads; 4096x768x3072 matmul fp32 "
             f"{report['matmul_tflops_fp32']:.3f} TFLOP/s. Model: {record['architecture']} "
             f"{report['model_settings']}, fp32; medians of {args.repeats} alternating calls.", "",
             "| tokens | batch | PyTorch eager | ONNX Runtime | ORT / PyTorch | max abs difference |",
             "|---:|---|---:|---:|---:|---:|"]
    for row in rows:
        ours, theirs = row["pytorch_seconds"], row["onnxruntime_seconds"]
        lines.append(f"| {row['length']} | {row['batch']} | {ours:.3f} s | {theirs:.3f} s | {theirs / ours:.2f} | "
                     f"{row['max_abs_difference']:.1e} |")
    write_table(report, lines, args.out, args.name)


if __name__ == "__main__":
    main()
