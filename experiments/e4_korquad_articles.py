"""E4 whole-article KorQuAD 1.0: truncation at 512 vs sliding windows at 512 vs long models at 4096.

The 140 KorQuAD 1.0 dev articles are joined into whole-article contexts and split by article (seed 0,
20 % dev). Every method starts from the same source (`--source`: the embedded all-MiniLM-L6-v2 or
multilingual-e5-small) and fine-tunes on the same training questions; only how a document is cut into windows and
the model differ. The budget depends on the mode: with `--max-steps N` every method makes exactly N optimiser updates
of `--batch-size` windows (equal updates; a 4096-token window costs more than a 512-token one, so not equal time);
with `--epochs E` (no `--max-steps`) every method passes E times over its own training windows, so methods that cut
more windows (sliding-512) make more updates (equal questions, unequal updates); `--max-steps 0` trains nothing and
reads with the starting model. Each method's updates, windows and minutes are in the results JSON and table.
- truncate-512: the source length (full attention), first window only; an answer past it labels [CLS].
- sliding-512: windows of 512 with doc_stride 128 (shared tokens), predictions merged over windows.
- kobigbird-4096-exp / kobigbird-4096-copy: BigBird ITC at 4096 with TAPER `exp` (tau = 2, KoBigBird-large's
  attenuated repetitions) or plain `copy` repetitions beyond the source's 512 positions.
- littlebird-4096: BiALiBi + sliding window + pack & unpack at 4096 (converted; no distillation or continued
  pretraining, which issue 12 adds).
With `--reader DIR` every method starts from one shared short reader instead of the bare source: a longbird QA
model fine-tuned on paragraphs at <= 512 tokens (`make qa-model`). Its encoder at <= 512 tokens is a BERT; that
BERT (rows 0..511 of its position table) is converted to each method's preset and the reader's QA head is kept,
so the methods differ exactly as above and share everything learnt from paragraphs.
Windows without the answer are kept with probability `--negative-fraction` in training (all are used at
evaluation). Scores are the official KorQuAD 1.0 EM/F1, overall and by where the answer starts: inside
the first 512 tokens of [CLS] question [SEP] document, or beyond.

Usage: python experiments/e4_korquad_articles.py [--source minilm] [--reader DIR] [--train-questions 200]
       [--dev-questions 150] [--epochs 1 | --max-steps N] [--bf16] [--methods ...] [--name NAME] [--resume]
Writes experiments/results/NAME.{json,md,png} (NAME: e4_korquad_articles); models go to experiments/runs/NAME/.
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

from longbird.conversion import convert  # noqa: E402
from longbird.data.corpus import held_out_record  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.files import save_figure_atomically, write_directory_atomically, write_file_atomically  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.sources import resolve_source  # noqa: E402
from longbird.qa import predict_rows  # noqa: E402
from longbird.training.finetune import FinetuneSettings  # noqa: E402
from longbird.checkpoints import convert_to_directory, load_task_model  # noqa: E402
from longbird.tasks.qa import finetune_qa, require_trained_apart, sample_questions, score_predictions  # noqa: E402
from longbird.window_selector import SELECTOR  # noqa: E402

# name: (preset, model length, window, doc_stride, max_windows, conversion overrides)
METHODS = {
    "truncate-512": ("full", 512, 512, 128, 1, {}),
    "sliding-512": ("full", 512, 512, 128, None, {}),
    "kobigbird-4096-exp": ("kobigbird", 4096, 4096, None, None, {"taper_schedule": "exp", "taper_tau": 2.0}),
    "kobigbird-4096-copy": ("kobigbird", 4096, 4096, None, None, {"taper_schedule": "copy"}),
    "littlebird-4096": ("littlebird", 4096, 4096, None, None, {}),
}
SOURCE_WINDOW = 512
BUCKETS = ("first 512", "beyond 512")


def answer_positions(rows, tokenizer) -> dict[str, int]:
    """Where each row's first gold answer starts in [CLS] question [SEP] document, in tokens."""
    positions = {}
    for row in rows:
        before = row["context"][:row["answers"]["answer_start"][0]]
        positions[row["id"]] = (len(tokenizer(row["question"], add_special_tokens=False, verbose=False)["input_ids"])
                                + 2 + len(tokenizer(before, add_special_tokens=False, verbose=False)["input_ids"]))
    return positions


def buckets_of(positions: dict[str, int]) -> dict[str, str]:
    """'first 512' for an answer starting inside the first 512 tokens of [CLS] question [SEP] document (`positions`:
    `answer_positions`), else 'beyond 512'."""
    return {key: "first 512" if position < SOURCE_WINDOW - 1 else "beyond 512" for key, position in positions.items()}


def answer_buckets(rows, tokenizer) -> dict[str, str]:
    """`buckets_of` the rows' answer positions."""
    return buckets_of(answer_positions(rows, tokenizer))


def dev_articles(n: int):
    """`n` questions of the by-article dev split, whole-article contexts (shared by E4 and E4b)."""
    rows, _ = read_korquad_v1_articles(DATA / "korquad" / "KorQuAD_v1.0_dev.json")
    return sample_questions(split_by_title(rows)["dev"], n)


def read_and_score(model, tokenizer, dev, buckets: dict[str, str], window: int, stride, max_windows):
    """(predictions {id: text}, official KorQuAD 1.0 scores overall and per answer-position bucket)."""
    answers = predict_rows(model, tokenizer, dev, window, stride, max_windows, batch_size=2,
                           lexical_weight=0.0)  # E4's protocol: the reader's own scores
    predictions = {row["id"]: answers[row["id"]].text if row["id"] in answers else "" for row in dev}
    scores = {"all": score_predictions(predictions, dev, "korquad1-articles")}
    for bucket in BUCKETS:
        subset = dev.filter(lambda row: buckets[row["id"]] == bucket)
        if len(subset):
            scores[bucket] = score_predictions(predictions, subset, "korquad1-articles")
    return predictions, scores


def score_cells(scores: dict) -> list[str]:
    """EM and F1 table cells for all, first 512 and beyond 512 (empty where a bucket has no question)."""
    cells = []
    for bucket in ("all",) + BUCKETS:
        score = scores.get(bucket)
        cells += [f"{score['exact_match']:.1f}", f"{score['f1']:.1f}"] if score else ["", ""]
    return cells


def plot_bucket_f1(scores_by_name: dict[str, dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(scores_by_name)
    figure, axis = plt.subplots(figsize=(8, 4.5))
    width = 0.27
    for offset, bucket in enumerate(("all",) + BUCKETS):
        values = [scores_by_name[n].get(bucket, {}).get("f1", 0.0) for n in names]
        axis.bar([i + (offset - 1) * width for i in range(len(names))], values, width, label=f"F1 {bucket}")
    axis.set_xticks(range(len(names)), names)
    axis.set_ylabel("KorQuAD 1.0 F1 (%)")
    axis.set_title(title)
    axis.legend()
    axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    save_figure_atomically(figure, path)
    plt.close(figure)


def converted(source: str, preset: str, max_length: int, overrides: dict, work: Path) -> Path:
    suffix = "".join(f"-{value}" for value in overrides.values())
    path = work / "converted" / f"{preset}-{max_length}{suffix}"
    if not path.exists():
        convert_to_directory(source, path, preset=preset, max_length=max_length, **overrides)
    return path


def short_bert(model):
    """The BERT a longbird QA model is at <= L tokens (kobigbird/full presets): its encoder with position rows 0..L-1."""
    from transformers import BertConfig, BertModel

    config = model.config
    if config.position != "absolute" or config.attention == "littlebird":
        raise ValueError("the reader must be a kobigbird or full model (absolute positions, full attention <= L)")
    bert = BertModel(BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads, intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act, hidden_dropout_prob=config.hidden_dropout_prob, attention_probs_dropout_prob=0.0,
        max_position_embeddings=config.source_max_positions, type_vocab_size=config.type_vocab_size,
        layer_norm_eps=config.layer_norm_eps, pad_token_id=config.pad_token_id), add_pooling_layer=config.add_pooling_layer)
    state = dict(model.longbird.state_dict())
    table = "embeddings.position_embeddings.weight"
    state[table] = state[table][:config.source_max_positions]
    missing, unexpected = bert.load_state_dict(state, strict=False)
    if [name for name in missing if not name.endswith(("position_ids", "token_type_ids"))] or unexpected:
        raise RuntimeError(f"reader -> BERT left missing={missing} unexpected={unexpected}")
    return bert.eval()


def from_reader(reader_dir: Path, preset: str, max_length: int, overrides: dict, work: Path) -> Path:
    """The shared paragraph reader converted to a method's preset, its QA head kept (see the module docstring)."""
    suffix = "".join(f"-{value}" for value in overrides.values())
    path = work / "from-reader" / f"{preset}-{max_length}{suffix}"
    if path.exists():
        return path
    reader, tokenizer = load_task_model(reader_dir, LongBirdForQuestionAnswering)
    encoder = convert(short_bert(reader), preset=preset, max_length=max_length, **overrides)
    config = encoder.config
    config.qa_head, config.qa_top_k = reader.config.qa_head, reader.config.qa_top_k
    config.architectures = ["LongBirdForQuestionAnswering"]
    model = LongBirdForQuestionAnswering(config)
    model.longbird.load_state_dict(encoder.state_dict())
    head = {name: tensor for name, tensor in reader.state_dict().items() if not name.startswith("longbird.")}
    missing, unexpected = model.load_state_dict(head, strict=False)
    # the encoder came from `encoder`; a window selector is new and starts at zero (window_selector.py)
    if unexpected or any(not name.startswith(("longbird.", SELECTOR + ".")) for name in missing):
        raise RuntimeError(f"QA head did not carry over: missing={missing} unexpected={unexpected}")
    tokenizer.model_max_length = max_length

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    write_directory_atomically(path, write)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="minilm", help="minilm | multilingual-e5-small | a local model directory")
    parser.add_argument("--reader", type=Path, help="A longbird QA model trained on paragraphs <= 512 tokens to start from")
    parser.add_argument("--max-steps", type=int, default=-1, help="Optimiser updates per method (overrides --epochs)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast in training and evaluation")
    parser.add_argument("--name", default="e4_korquad_articles", help="Results file stem and run folder name")
    parser.add_argument("--train-questions", type=int, default=200)
    parser.add_argument("--dev-questions", type=int, default=150)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--negative-fraction", type=float, default=0.1)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--resume", action="store_true", help="Keep the results of methods this run does not redo")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    parser.add_argument("--work", type=Path, default=None, help="Default: experiments/runs/NAME")
    args = parser.parse_args()
    args.work = args.work or ROOT / "experiments" / "runs" / args.name
    torch.manual_seed(0)
    started = time.time()
    rows, _ = read_korquad_v1_articles(DATA / "korquad" / "KorQuAD_v1.0_dev.json")
    train = sample_questions(split_by_title(rows)["train"], args.train_questions)
    dev = dev_articles(args.dev_questions)
    _, tokenizer = load_task_model(resolve_source(args.source), LongBirdForQuestionAnswering, "full", 512)
    buckets = answer_buckets(dev, tokenizer)
    if args.reader is not None:  # the reader's own record: trained on the train side only, no dev article
        try:
            require_trained_apart(args.reader, set(split_by_title(rows)["dev"]["title"]), root=ROOT)
        except ValueError as error:
            raise SystemExit(f"refusing the reader: {error}") from None
    results_path = args.out / f"{args.name}.json"
    results = {"command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
               "settings": vars(args) | {"out": str(args.out), "work": str(args.work),
                                         "reader": args.reader and str(args.reader)},
               "train_questions": len(train), "train_articles": len(set(train["title"])),
               "dev_questions": len(dev), "dev_articles": len(set(dev["title"])),
               "dev_bucket_sizes": {b: list(buckets.values()).count(b) for b in BUCKETS},
               "held_out": held_out_record(train, dev),  # asserts no title and no text is on both sides
               "methods": {}}
    if args.resume and results_path.exists():
        old = json.loads(results_path.read_text())
        ignored = {"methods": None, "resume": None}  # the only settings a resumed run may change
        if old["settings"] | ignored != results["settings"] | ignored:
            raise SystemExit(f"--resume needs the settings of {results_path}: {old['settings']}")
        results["methods"] = {k: v for k, v in old["methods"].items() if k not in args.methods}
        results["command"] = old["command"] + " && " + results["command"]
        started -= old.get("wall_seconds", 0.0)
    for name in args.methods:
        preset, max_length, window, stride, max_windows, overrides = METHODS[name]
        run_dir = args.work / name
        start = (from_reader(args.reader, preset, max_length, overrides, args.work) if args.reader is not None
                 else converted(args.source, preset, max_length, overrides, args.work))
        train_started = time.time()
        if args.max_steps == 0:  # no article updates: read with the starting model (the reader as it is)
            if args.reader is None:
                raise SystemExit("--max-steps 0 needs --reader (a bare source has no QA head)")
            run_dir, metrics = start, {"training_windows": 0, "train_loss": None, "log_history": []}
        if args.max_steps != 0:
            settings = FinetuneSettings(learning_rate=args.learning_rate, epochs=args.epochs,
                                        max_steps=args.max_steps, batch_size=args.batch_size, bf16=args.bf16,
                                        progress=False, logging_steps=10)
            metrics = finetune_qa(start, train, run_dir, data_format="korquad1-articles",
                                  window_length=window, doc_stride=stride, max_windows=max_windows,
                                  negative_fraction=args.negative_fraction, settings=settings, overwrite=True)
        train_seconds = time.time() - train_started
        model, tokenizer = load_task_model(run_dir, LongBirdForQuestionAnswering)
        eval_started = time.time()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            predictions, scores = read_and_score(model, tokenizer, dev, buckets, window, stride, max_windows)
        results["methods"][name] = {
            "scores": scores, "train_seconds": train_seconds, "eval_seconds": time.time() - eval_started,
            "training_windows": metrics["training_windows"], "train_loss": metrics["train_loss"],
            "optimizer_steps": max((entry.get("step", 0) for entry in metrics.get("log_history", [])), default=None),
            "loss_curve": [
                (entry["step"], entry["loss"]) for entry in metrics.get("log_history", []) if "loss" in entry],
            "window": window, "doc_stride": stride, "max_windows": max_windows,
        }
        print(name, json.dumps(results["methods"][name]["scores"]), flush=True)
        write_file_atomically(args.out / f"{args.name}_predictions" / f"{name}.json",
                              json.dumps(predictions, ensure_ascii=False, indent=1) + "\n")
        _write(results, args.out, args.name, started)


SOURCE_LABELS = {"minilm": "all-MiniLM-L6-v2", "multilingual-e5-small": "multilingual-e5-small"}


def _write(results: dict, out: Path, stem: str, started: float) -> None:
    results["wall_seconds"] = time.time() - started
    results["torch_threads"] = torch.get_num_threads()
    s = results["settings"]
    sizes = results["dev_bucket_sizes"]
    source = SOURCE_LABELS.get(s.get("source", "minilm"), s.get("source"))
    steps = s.get("max_steps", -1)
    budget = (f"{steps} optimiser updates" if steps > 0 else "no article updates (the reader as it is)" if steps == 0
              else f"{s['epochs']:g} epoch(s)")
    start = f"the shared paragraph reader {s['reader']}" if s.get("reader") else "the bare source"
    lines = [f"Command: `{results['command']}`  ",
             f"Source {source}; every method starts from {start}; {results['train_questions']} training questions "
             f"({results['train_articles']} articles), {budget}, batch {s['batch_size']}, "
             f"{'bf16 autocast, ' if s.get('bf16') else ''}lr "
             f"{s['learning_rate']:g}, negative windows kept with p = {s['negative_fraction']:g}; "
             f"{results['dev_questions']} dev questions ({results['dev_articles']} unseen articles: "
             f"{sizes['first 512']} answers in the first 512 tokens, {sizes['beyond 512']} beyond); "
             f"{results['torch_threads']} CPU threads, {results['wall_seconds'] / 60:.0f} min wall.", "",
             "| method | EM | F1 | EM first 512 | F1 first 512 | EM beyond 512 | F1 beyond 512 | training windows "
             "| train min | eval min |", "|---|" + "---:|" * 9]
    for name, method in results["methods"].items():
        lines.append(f"| {name} | " + " | ".join(score_cells(method["scores"])) + f" | {method['training_windows']} | "
                     f"{method['train_seconds'] / 60:.1f} | {method['eval_seconds'] / 60:.1f} |")
    write_file_atomically(out / f"{stem}.md", "\n".join(lines) + "\n")
    write_file_atomically(out / f"{stem}.json", json.dumps(results, indent=2) + "\n")
    plot_bucket_f1({name: method["scores"] for name, method in results["methods"].items()},
                   out / f"{stem}.png", f"E4: whole-article KorQuAD 1.0 ({source} source)")

if __name__ == "__main__":
    main()
