"""Learning curve of the Korean QA recipe (`make qa-model`): dev F1 against training windows seen.

Reads the checkpoints `finetune-qa --save-steps N` kept in MODEL.checkpoints/ (and the final MODEL), scores each on
the same held-out dev questions of the by-article split (KorQuAD 1.0 paragraphs, official metric, F1 with a 95 %
bootstrap interval over questions), and writes experiments/results/NAME.{json,md,png} (`--name`, default
qa_model_e5_curve). It refuses a model whose own record shows it read a dev article, and asserts that the scored
questions share no title and no paragraph text with the training side (both lists are in the JSON).

Usage: python experiments/qa_learning_curve.py [--model qa-model/kobigbird-e5-korquad] [--dev-questions 300]
       [--name qa_model_e5_curve]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from e7_long_reading import held_out_record  # noqa: E402

from longbird.files import save_figure_atomically, write_file_atomically  # noqa: E402
from longbird.metrics.intervals import bootstrap_interval  # noqa: E402
from longbird.precision import native_bf16  # noqa: E402
from longbird.tasks.qa import (evaluate_qa, per_question_scores, read_qa_data, require_trained_apart,  # noqa: E402
                               sample_questions)

DATA = ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json"


def checkpoints(model: Path) -> list[tuple[int, Path]]:
    """(optimiser step, directory) of every kept checkpoint, then the final model, by step."""
    found = []
    for directory in (model.parent / f"{model.name}.checkpoints").glob("checkpoint-*"):
        found.append((int(re.search(r"(\d+)$", directory.name).group(1)), directory))
    final = json.loads((model / "longbird_finetune.json").read_text())
    # a run stopped by a time budget ended at the step its budget records, before --max-steps
    budget = final["metrics"].get("wall_budget") or final["metrics"].get("cpu_budget")
    steps = budget["steps"] if budget else final["settings"]["max_steps"]
    if all(step != steps for step, _ in found):
        found.append((steps, model))
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "qa-model" / "kobigbird-e5-korquad")
    parser.add_argument("--dev-questions", type=int, default=300)
    parser.add_argument("--window-length", type=int, default=512)
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    parser.add_argument("--name", default="qa_model_e5_curve", help="file name of the results, without suffix")
    args = parser.parse_args()
    started = time.time()
    dev = sample_questions(read_qa_data(DATA, "korquad1", "dev")[0], args.dev_questions)
    require_trained_apart(args.model, set(dev["title"]), root=ROOT)  # the model never read a scored article
    held_out = held_out_record(read_qa_data(DATA, "korquad1", "train")[0], dev)  # raises if titles or texts meet
    summary = json.loads((args.model / "longbird_finetune.json").read_text())
    batch = summary["settings"]["batch_size"]
    points = []
    for step, directory in checkpoints(args.model):
        # bf16 only where the CPU multiplies it; emulated bf16 (AVX2-only CPUs) is far slower than fp32
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16("cpu")):
            scored = evaluate_qa(directory, dev, data_format="korquad1", window_length=args.window_length,
                                 batch_size=16)
        metrics = scored["metrics"]
        f1s = [score["f1"] for score in per_question_scores(scored["predictions"], dev, "korquad1").values()]
        points.append({"step": step, "training_windows": step * batch, "exact_match": metrics["exact_match"],
                       "f1": metrics["f1"], "f1_interval": bootstrap_interval(f1s)})
        print(points[-1], flush=True)
    result = {"command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
              "model": str(args.model), "dev_questions": len(dev), "training_windows_total": summary["windows"],
              "training_questions": summary["train_examples"], "held_out": held_out, "points": points,
              "wall_seconds": time.time() - started, "torch_threads": torch.get_num_threads()}
    args.out.mkdir(parents=True, exist_ok=True)
    write_file_atomically(args.out / f"{args.name}.json", json.dumps(result, indent=2) + "\n")
    lines = [f"Command: `{result['command']}`  ",
             f"{len(dev)} held-out dev questions (by-article split, KorQuAD 1.0 paragraphs, official metric), "
             f"{args.window_length}-token windows, {'bf16 autocast' if native_bf16('cpu') else 'fp32'}; training set {summary['windows']:,} windows of "
             f"{summary['train_examples']:,} questions; {result['wall_seconds'] / 60:.0f} min wall.", "",
             "| step | training windows seen | epochs | EM | F1 (95 % CI) |", "|---:|---:|---:|---:|---:|"]
    for point in points:
        lines.append(f"| {point['step']} | {point['training_windows']:,} | "
                     f"{point['training_windows'] / summary['windows']:.2f} | {point['exact_match']:.1f} | "
                     f"{point['f1']:.1f} ({point['f1_interval'][0]:.1f}–{point['f1_interval'][1]:.1f}) |")
    write_file_atomically(args.out / f"{args.name}.md", "\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4))
    seen = [point["training_windows"] for point in points]
    axis.plot(seen, [point["f1"] for point in points], marker="o", label="F1")
    axis.plot(seen, [point["exact_match"] for point in points], marker="s", label="EM")
    axis.axhline(75, color="grey", linestyle="--", linewidth=1, label="target F1 75")
    axis.set_xlabel("training windows seen (512 tokens)")
    axis.set_ylabel("KorQuAD 1.0 dev score (%)")
    axis.set_title("multilingual-e5-small -> kobigbird-4096, KorQuAD 1.0")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    save_figure_atomically(figure, args.out / f"{args.name}.png")
    plt.close(figure)


if __name__ == "__main__":
    main()
