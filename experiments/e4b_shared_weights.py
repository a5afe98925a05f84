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
SHARED = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e4_korquad_articles import answer_buckets  # noqa: E402

from longbird.convert import default_source  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, read_squad_paragraphs, split_by_title  # noqa: E402
from longbird.files import save_figure_atomically, write_file_atomically  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.qa import predict_rows  # noqa: E402
from longbird.training.finetune import FinetuneSettings  # noqa: E402
from longbird.workflows import convert_to_directory, finetune_qa, load_task_model, score_predictions  # noqa: E402

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
    paragraphs, _ = read_squad_paragraphs(SHARED / "korquad" / "KorQuAD_v1.0_dev.json")
    train = split_by_title(paragraphs)["train"].shuffle(seed=0)
    train = train.select(range(min(args.train_questions, len(train))))
    articles, _ = read_korquad_v1_articles(SHARED / "korquad" / "KorQuAD_v1.0_dev.json")
    dev = split_by_title(articles)["dev"].shuffle(seed=0)  # the same dev questions as E4
    dev = dev.select(range(min(args.dev_questions, len(dev))))
    if set(train["title"]) & set(dev["title"]):
        raise SystemExit("train and dev share an article")

    model_dir = args.work / "kobigbird-4096-paragraphs"
    results = {"command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
               "settings": vars(args) | {"out": str(args.out), "work": str(args.work)},
               "train_questions": len(train), "train_articles": len(set(train["title"])),
               "dev_questions": len(dev), "dev_articles": len(set(dev["title"])), "readers": {}}
    if not (model_dir / "config.json").exists():
        converted = args.work / "converted" / "kobigbird-4096"
        if not converted.exists():
            convert_to_directory(None, converted, "kobigbird", 4096)
        settings = FinetuneSettings(learning_rate=args.learning_rate, epochs=args.epochs, batch_size=args.batch_size,
                                    progress=False, logging_steps=50)
        train_started = time.time()
        metrics = finetune_qa(converted, train, model_dir, data_format="korquad1", window_length=TRAIN_WINDOW,
                              doc_stride=128, negative_fraction=args.negative_fraction, settings=settings,
                              overwrite=True)
        results["training"] = {"seconds": time.time() - train_started, "windows": metrics["training_windows"],
                               "loss": metrics["train_loss"]}
        write_file_atomically(args.work / "training.json", json.dumps(results["training"], indent=2))
    else:  # reuse the fine-tuned model (e.g. to add a reader)
        results["training"] = json.loads((args.work / "training.json").read_text())
    model, tokenizer = load_task_model(model_dir, LongBirdForQuestionAnswering)
    buckets = answer_buckets(dev, tokenizer)
    results["dev_bucket_sizes"] = {b: list(buckets.values()).count(b) for b in ("first 512", "beyond 512")}
    for name in args.readers:
        window, stride, max_windows = READERS[name]
        eval_started = time.time()
        answers = predict_rows(model, tokenizer, dev, window, stride, max_windows, batch_size=2)
        predictions = {row["id"]: answers[row["id"]].text if row["id"] in answers else "" for row in dev}
        scores = {"all": score_predictions(predictions, dev, "korquad1-articles")}
        for bucket in ("first 512", "beyond 512"):
            subset = dev.filter(lambda row: buckets[row["id"]] == bucket)
            if len(subset):
                scores[bucket] = score_predictions(predictions, subset, "korquad1-articles")
        results["readers"][name] = {"scores": scores, "eval_seconds": time.time() - eval_started,
                                    "window": window, "doc_stride": stride, "max_windows": max_windows}
        print(name, json.dumps(scores), flush=True)
        write_file_atomically(args.out / "e4b_predictions" / f"{name}.json",
                              json.dumps(predictions, ensure_ascii=False, indent=1) + "\n")
        _write(results, args.out, started)


def _write(results: dict, out: Path, started: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
        cells = []
        for bucket in ("all", "first 512", "beyond 512"):
            score = reader["scores"].get(bucket)
            cells += [f"{score['exact_match']:.1f}", f"{score['f1']:.1f}"] if score else ["", ""]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {reader['eval_seconds'] / 60:.1f} |")
    write_file_atomically(out / "e4b_shared_weights.md", "\n".join(lines) + "\n")
    write_file_atomically(out / "e4b_shared_weights.json", json.dumps(results, indent=2) + "\n")
    names = list(results["readers"])
    figure, axis = plt.subplots(figsize=(8, 4.5))
    width = 0.27
    for offset, bucket in enumerate(("all", "first 512", "beyond 512")):
        values = [results["readers"][n]["scores"].get(bucket, {}).get("f1", 0.0) for n in names]
        axis.bar([i + (offset - 1) * width for i in range(len(names))], values, width, label=f"F1 {bucket}")
    axis.set_xticks(range(len(names)), names)
    axis.set_ylabel("KorQuAD 1.0 F1 (%)")
    axis.set_title("E4b: one paragraph-trained model reading whole articles three ways")
    axis.legend()
    axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    save_figure_atomically(figure, out / "e4b_shared_weights.png")
    plt.close(figure)


if __name__ == "__main__":
    main()
