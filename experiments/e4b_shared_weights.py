"""E4b: one QA model, three ways to read a whole article (truncation, sliding windows, kobigbird at 4096).

E4 fine-tunes every method separately on whole articles, which on a CPU budget leaves each model with too
few updates to learn QA at all. E4b removes training from the comparison: a single kobigbird-4096 model
(converted from the embedded all-MiniLM-L6-v2) is fine-tuned on the published KorQuAD 1.0 *paragraphs* of
the training articles at 512 tokens, where kobigbird is exactly the source model (full attention). The same
weights then read the unseen dev articles whole:
- truncate-512: first 512-token window only;
- sliding-512: 512-token windows sharing 128 tokens, predictions merged over windows;
- kobigbird-4096: 4096-token windows (block-sparse attention, copied position rows beyond 512).
Scores are the official KorQuAD 1.0 EM/F1, overall and by where the answer starts (first 512 tokens or
beyond), on the same dev questions as E4.

Usage: python experiments/e4b_shared_weights.py [--train-questions 2000] [--dev-questions 150]
Writes experiments/results/e4b_shared_weights.{json,md,png}; the model goes to experiments/runs/e4b/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"  # the repository's data/ (data/korquad/SOURCE.md)
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e4_korquad_articles import (BUCKETS, answer_buckets, converted, dev_articles, plot_bucket_f1,  # noqa: E402
                                 read_and_score, score_cells)

from longbird.data.korquad import read_squad_paragraphs, split_by_title  # noqa: E402
from longbird.files import write_file_atomically  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.training.finetune import FinetuneSettings  # noqa: E402
from longbird.tasks.qa import finetune_qa, sample_questions  # noqa: E402
from longbird.checkpoints import load_task_model  # noqa: E402

# name: (window, doc_stride, max_windows) used to read the dev articles
READERS = {
    "truncate-512": (512, 128, 1),
    "sliding-512": (512, 128, None),
    "kobigbird-4096": (4096, None, None),
}
TRAIN_WINDOW = 512


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-questions", type=int, default=2000)
    parser.add_argument("--dev-questions", type=int, default=150)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--negative-fraction", type=float, default=0.1)
    parser.add_argument("--readers", nargs="+", default=list(READERS))
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    parser.add_argument("--work", type=Path, default=ROOT / "experiments" / "runs" / "e4b")
    args = parser.parse_args()
    torch.manual_seed(0)
    started = time.time()
    paragraphs, _ = read_squad_paragraphs(DATA / "korquad" / "KorQuAD_v1.0_dev.json")
    train = sample_questions(split_by_title(paragraphs)["train"], args.train_questions)
    dev = dev_articles(args.dev_questions)  # the same dev questions as E4
    if set(train["title"]) & set(dev["title"]):
        raise SystemExit("train and dev share an article")

    model_dir = args.work / "kobigbird-4096-paragraphs"
    results = {"command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
               "settings": vars(args) | {"out": str(args.out), "work": str(args.work)},
               "train_questions": len(train), "train_articles": len(set(train["title"])),
               "dev_questions": len(dev), "dev_articles": len(set(dev["title"])), "readers": {}}
    if not (model_dir / "config.json").exists():
        settings = FinetuneSettings(learning_rate=args.learning_rate, epochs=args.epochs, batch_size=args.batch_size,
                                    progress=False, logging_steps=50)
        train_started = time.time()
        metrics = finetune_qa(converted("minilm", "kobigbird", 4096, {}, args.work), train, model_dir, data_format="korquad1",
                              window_length=TRAIN_WINDOW, doc_stride=128, negative_fraction=args.negative_fraction,
                              settings=settings, overwrite=True)
        results["training"] = {"seconds": time.time() - train_started, "windows": metrics["training_windows"],
                               "loss": metrics["train_loss"]}
        write_file_atomically(args.work / "training.json", json.dumps(results["training"], indent=2))
    else:  # reuse the fine-tuned model (e.g. to add a reader)
        results["training"] = json.loads((args.work / "training.json").read_text())
    model, tokenizer = load_task_model(model_dir, LongBirdForQuestionAnswering)
    buckets = answer_buckets(dev, tokenizer)
    results["dev_bucket_sizes"] = {b: list(buckets.values()).count(b) for b in BUCKETS}
    for name in args.readers:
        window, stride, max_windows = READERS[name]
        eval_started = time.time()
        predictions, scores = read_and_score(model, tokenizer, dev, buckets, window, stride, max_windows)
        results["readers"][name] = {"scores": scores, "eval_seconds": time.time() - eval_started,
                                    "window": window, "doc_stride": stride, "max_windows": max_windows}
        print(name, json.dumps(scores), flush=True)
        write_file_atomically(args.out / "e4b_predictions" / f"{name}.json",
                              json.dumps(predictions, ensure_ascii=False, indent=1) + "\n")
        _write(results, args.out, started)


def _write(results: dict, out: Path, started: float) -> None:
    results["wall_seconds"] = time.time() - started
    results["torch_threads"] = torch.get_num_threads()
    s, training, sizes = results["settings"], results["training"], results["dev_bucket_sizes"]
    lines = [f"Command: `{results['command']}`  ",
             f"One model: kobigbird-4096 from all-MiniLM-L6-v2, fine-tuned at {TRAIN_WINDOW} tokens on "
             f"{results['train_questions']} KorQuAD 1.0 training paragraphs' questions ({results['train_articles']} "
             f"articles), {s['epochs']:g} epoch(s), batch {s['batch_size']}, lr {s['learning_rate']:g}, "
             f"{training['windows']} training windows, {training['seconds'] / 60:.0f} min; "
             f"{results['dev_questions']} dev questions on whole unseen articles ({results['dev_articles']} "
             f"articles: {sizes['first 512']} answers in the first 512 tokens, {sizes['beyond 512']} beyond); "
             f"{results['torch_threads']} CPU threads, {results['wall_seconds'] / 60:.0f} min wall.", "",
             "| reader | EM | F1 | EM first 512 | F1 first 512 | EM beyond 512 | F1 beyond 512 | eval min |",
             "|---|" + "---:|" * 7]
    for name, reader in results["readers"].items():
        lines.append(f"| {name} | " + " | ".join(score_cells(reader["scores"]))
                     + f" | {reader['eval_seconds'] / 60:.1f} |")
    write_file_atomically(out / "e4b_shared_weights.md", "\n".join(lines) + "\n")
    write_file_atomically(out / "e4b_shared_weights.json", json.dumps(results, indent=2) + "\n")
    plot_bucket_f1({name: reader["scores"] for name, reader in results["readers"].items()},
                   out / "e4b_shared_weights.png", "E4b: one paragraph-trained model reading whole articles three ways")

if __name__ == "__main__":
    main()
