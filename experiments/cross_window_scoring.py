"""How answers from different windows are ranked: the scoring rules of `longbird.qa`, measured with sliding windows.

The paragraph reader of `make qa-model` reads whole KorQuAD 1.0 articles in 512-token windows (stride 128, as E4's
sliding-512); the model runs once per side and every rule merges the same window candidates (`qa.score_windows`,
`qa.merge_windows`). The default rule is chosen on the *training* side of the by-article split (questions of articles
the reader's paragraphs came from; never the dev side), then every rule is reported on E4's dev questions (the same
draw as `experiments/e4_korquad_articles.py --dev-questions 100`) with 95 % bootstrap intervals and the paired
difference against the old rule (`logit`). The reader's own record is checked: trained on the train side only.

Usage: python experiments/cross_window_scoring.py [--reader qa-model/kobigbird-e5-korquad] [--train-questions 200]
       [--dev-questions 100] [--precision auto|fp32|bf16]
`--precision auto` (default) reads in bf16 autocast only where the CPU multiplies bf16 (`longbird.precision`), else fp32.
Writes experiments/results/cross_window_scoring.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e4_korquad_articles import BUCKETS, answer_buckets, dev_articles  # noqa: E402

from longbird.checkpoints import load_task_model  # noqa: E402
from longbird.data.corpus import text_hash  # noqa: E402
from longbird.data.corpus import held_out_record  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.files import write_file_atomically  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.metrics.intervals import bucket_summary, paired_difference  # noqa: E402
from longbird.precision import bf16_autocast, native_bf16  # noqa: E402
from longbird.qa import DEFAULT_SCORING, SCORING_RULES, merge_windows, row_features, score_windows  # noqa: E402
from longbird.tasks.qa import per_question_scores, require_trained_apart, sample_questions  # noqa: E402

WINDOW, STRIDE = 512, 128
BASELINE = "logit"


def measure(model, tokenizer, rows, buckets, bf16: bool) -> dict:
    """Every rule's per-question scores on `rows` from one model pass."""
    started = time.time()
    features, documents = row_features(model, tokenizer, rows, WINDOW, STRIDE)
    with bf16_autocast("cpu", bf16):
        windows = score_windows(model, features, batch_size=8, progress=True)
    result = {"questions": len(rows), "windows": len(features), "seconds": time.time() - started, "rules": {}}
    for rule in SCORING_RULES:
        answers = merge_windows(windows, documents, rule)
        predictions = {row["id"]: answers[row["id"]].text if row["id"] in answers else "" for row in rows}
        scores = per_question_scores(predictions, rows, "korquad1-articles")
        summary = bucket_summary(scores, buckets, BUCKETS)
        result["rules"][rule] = {"scores": summary, "per_question": scores, "predictions": predictions}
    for rule in SCORING_RULES:
        ids = list(result["rules"][rule]["per_question"])
        result["rules"][rule]["f1_vs_logit"] = paired_difference(
            [result["rules"][rule]["per_question"][i]["f1"] for i in ids],
            [result["rules"][BASELINE]["per_question"][i]["f1"] for i in ids])
    return result


def table(side: dict, title: str) -> list[str]:
    lines = [f"**{title}** ({side['questions']} questions, {side['windows']} windows; answers in the first 512 "
             f"tokens: {side['rules'][BASELINE]['scores'].get('first 512', {}).get('questions', 0)}, beyond: "
             f"{side['rules'][BASELINE]['scores'].get('beyond 512', {}).get('questions', 0)})", "",
             "| rule | EM | F1 (95 % CI) | F1 first 512 | F1 beyond 512 | F1 − logit (paired 95 % CI) |",
             "|---|---:|---:|---:|---:|---:|"]
    for rule, data in side["rules"].items():
        s = data["scores"]
        low, high = s["all"]["f1_interval"]
        diff = data["f1_vs_logit"]
        cells = [f"{s[b]['f1']:.1f}" if b in s else "" for b in BUCKETS]
        lines.append(f"| {rule} | {s['all']['exact_match']:.1f} | {s['all']['f1']:.1f} ({low:.1f}–{high:.1f}) | "
                     f"{cells[0]} | {cells[1]} | {diff['difference']:+.1f} ({diff['low']:+.1f} to "
                     f"{diff['high']:+.1f}) |")
    return lines


def _reader_training(reader: Path) -> dict:
    """The reader's own fine-tuning record, without its loss log."""
    record = json.loads((reader / "longbird_finetune.json").read_text(encoding="utf-8"))
    return {key: value for key, value in record.items() if key != "log_history"}


def _describe_training(record: dict) -> str:
    settings = {**record, **record.get("settings", {})}
    parts = [f"{key} {settings[key]}" for key in ("max_steps", "batch_size", "learning_rate", "window_length", "bf16")
             if key in settings]
    return "fine-tuned on the train side: " + ", ".join(parts) if parts else "fine-tuned on the train side"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", type=Path, default=ROOT / "qa-model" / "kobigbird-e5-korquad")
    parser.add_argument("--train-questions", type=int, default=200)
    parser.add_argument("--dev-questions", type=int, default=100)
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    args = parser.parse_args()
    bf16 = args.precision == "bf16" or (args.precision == "auto" and native_bf16("cpu"))
    started = time.time()
    rows, _ = read_korquad_v1_articles(ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json")
    split = split_by_title(rows)
    dev = dev_articles(args.dev_questions)
    require_trained_apart(args.reader, set(split["dev"]["title"]), root=ROOT)
    train = sample_questions(split["train"], args.train_questions, seed=1)
    held_out_record(train, dev)  # AssertionError where the sides share a title or an article's text
    model, tokenizer = load_task_model(args.reader, LongBirdForQuestionAnswering)
    results = {"command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
               "reader": str(args.reader), "reader_training": _reader_training(args.reader),
               "precision": "bf16 autocast" if bf16 else "fp32", "window": WINDOW, "doc_stride": STRIDE, "torch_threads":
               torch.get_num_threads(), "sides": {}}
    for name, side_rows in (("train", train), ("dev", dev)):
        measured = measure(model, tokenizer, side_rows, answer_buckets(side_rows, tokenizer), bf16)
        measured["titles"] = sorted(set(side_rows["title"]))
        measured["context_sha256"] = sorted({text_hash(c) for c in side_rows["context"]})
        results["sides"][name] = measured
        print(name, {rule: round(d["scores"]["all"]["f1"], 1) for rule, d in measured["rules"].items()}, flush=True)
    chosen = max(SCORING_RULES, key=lambda rule: results["sides"]["train"]["rules"][rule]["scores"]["all"]["f1"])
    results["chosen_on_train_side"] = chosen
    results["library_default"] = DEFAULT_SCORING
    results["wall_seconds"] = time.time() - started
    lines = [f"Command: `{results['command']}`  ",
             f"Reader {args.reader.name} ({_describe_training(results['reader_training'])}), sliding {WINDOW}-token "
             f"windows, stride {STRIDE}, {results['precision']}, {results['torch_threads']} CPU threads, {results['wall_seconds'] / 60:.0f} min wall. "
             f"Chosen on the training side: **{chosen}** (library default: {DEFAULT_SCORING}).", ""]
    lines += table(results["sides"]["train"], "Training side of the by-article split (chooses the default)") + [""]
    lines += table(results["sides"]["dev"], "E4 dev questions (unseen articles; reported, never used to choose)")
    write_file_atomically(args.out / "cross_window_scoring.json", json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    write_file_atomically(args.out / "cross_window_scoring.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
