"""E3 extrapolation: fine-tune at 512 tokens, find a planted passkey in real Korean text at 512..8K tokens.

A sentence "<name>의 비밀 번호는 <5 digits>이다." is planted at a uniformly random sentence boundary of real
Korean Wikipedia text (KorQuAD 1.0 paragraphs); the question asks for the name's code. Each preset is
fine-tuned from the embedded all-MiniLM-L6-v2 on 512-token samples, with and without Padding Insertion,
and scored by exact match at every length on the same evaluation samples.

TAPER schedules: training at 512 tokens never touches position rows >= 512, so one kobigbird run without
Padding Insertion serves every schedule: after fine-tuning, rows >= 512 are rebuilt from the fine-tuned rows
0..511 with each schedule x mode. With Padding Insertion, rows past 512 are trained, so each schedule
tried is its own run. The `full` preset shares the kobigbird weights (identical at <= 512 tokens) and runs
full attention at every length.

Usage: python experiments/e3_extrapolation.py [--steps 250] [--eval-samples 40] [--lengths 512 1024 ...]
Writes experiments/results/e3_extrapolation.{json,md,png}; fine-tuned models go to experiments/runs/.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

import torch
from datasets import Dataset

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"  # the repository's data/ (data/korquad/SOURCE.md)
sys.path.insert(0, str(ROOT / "src"))

from longbird.conversion import default_source  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles  # noqa: E402
from longbird.files import save_figure_atomically, write_file_atomically  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.positions.taper import extend_position_table  # noqa: E402
from longbird.qa import predict_rows  # noqa: E402
from longbird.training.finetune import FinetuneSettings  # noqa: E402
from longbird.checkpoints import convert_to_directory, load_task_model  # noqa: E402
from longbird.tasks.qa import finetune_qa  # noqa: E402

NAMES = ["민준", "서연", "도윤", "하은", "시우", "지유", "주원", "서윤", "예준", "지아", "하준", "수아", "지호", "채원",
         "준서", "다은", "건우", "예린", "현우", "소율", "우진", "윤서", "선우", "민서"]
SENTENCE_END = re.compile(r"(?<=[.?!])\s+")
TRAIN_LENGTH = 512
MAX_LENGTH = 8192


def haystack_sentences() -> list[str]:
    """Sentences of real Korean Wikipedia text: the KorQuAD 1.0 dev paragraphs, in article order."""
    rows, _ = read_korquad_v1_articles(DATA / "korquad" / "KorQuAD_v1.0_dev.json")
    sentences = []
    for context in dict.fromkeys(rows["context"]):
        sentences.extend(s.strip() for s in SENTENCE_END.split(context) if s.strip())
    return sentences


class PasskeySamples:
    def __init__(self, tokenizer, sentences: list[str]):
        self.tokenizer = tokenizer
        self.sentences = sentences
        self.lengths = [len(ids) for ids in tokenizer(sentences, add_special_tokens=False)["input_ids"]]

    def sample(self, rng: random.Random, length: int, sample_id: str) -> dict:
        """One question whose [CLS] question [SEP] document [SEP] fits in `length` tokens."""
        name, code = rng.choice(NAMES), f"{rng.randrange(10000, 100000)}"
        question = f"{name}의 비밀 번호는 무엇인가?"
        needle = f"{name}의 비밀 번호는 {code}이다."
        budget = (length - 3 - len(self.tokenizer(question, add_special_tokens=False)["input_ids"])
                  - len(self.tokenizer(needle, add_special_tokens=False)["input_ids"]) - 8)
        start = rng.randrange(len(self.sentences))
        chosen, used = [], 0
        for offset in range(len(self.sentences)):
            index = (start + offset) % len(self.sentences)
            if used + self.lengths[index] > budget:
                break
            chosen.append(self.sentences[index])
            used += self.lengths[index]
        depth = rng.randint(0, len(chosen))
        before = " ".join(chosen[:depth])
        context = " ".join(part for part in (before, needle, " ".join(chosen[depth:])) if part)
        answer_start = (len(before) + 1 if before else 0) + needle.index(code)
        assert context[answer_start:answer_start + len(code)] == code
        return {"id": sample_id, "title": "passkey", "question": question, "context": context, "is_html": False,
                "answers": {"text": [code], "answer_start": [answer_start]},
                "depth": depth / max(len(chosen), 1)}


def passkey_rows(tokenizer, args) -> tuple[Dataset, dict[int, list[dict]]]:
    """Training rows at TRAIN_LENGTH (args.steps x args.batch_size) and args.eval_samples rows per evaluation
    length, drawn with fixed seeds (0 and 1), so every run and experiment reads the same samples."""
    samples = PasskeySamples(tokenizer, haystack_sentences())
    train_rng, eval_rng = random.Random(0), random.Random(1)
    train_rows = Dataset.from_list([samples.sample(train_rng, TRAIN_LENGTH, f"train-{i}")
                                    for i in range(args.steps * args.batch_size)])
    eval_rows = {length: [samples.sample(eval_rng, length, f"eval-{length}-{i}") for i in range(args.eval_samples)]
                 for length in args.lengths}
    return train_rows, eval_rows


def start_results(args, previous: Path, started: float, redo=None) -> tuple[dict, float]:
    """The results record of this invocation; with --resume, merged with the rows of the runs in `previous` that
    this invocation does not redo (`redo`, default args.runs; its wall time carried over)."""
    redo = set(args.runs if redo is None else redo)
    results = {"command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
               "settings": vars(args) | {"out": str(args.out), "work": str(args.work)}, "runs": {}, "rows": []}
    if args.resume and previous.exists():
        old = json.loads(previous.read_text())
        results["runs"] = {k: v for k, v in old["runs"].items() if k not in redo}
        results["rows"] = [row for row in old["rows"] if row["run"] not in redo]
        results["command"] = old["command"] + " && " + results["command"]
        started -= old.get("wall_seconds", 0.0)
    return results, started


def retaper(model, schedule: str, mode: str) -> None:
    """Rebuild position rows >= L from the (fine-tuned) rows 0..L-1 with another TAPER schedule and mode."""
    table = model.longbird.embeddings.position_embeddings.weight
    source_length = model.config.source_max_positions
    with torch.no_grad():
        table.copy_(extend_position_table(table[:source_length], table.shape[0], schedule, mode,
                                          model.config.taper_tau).to(table.dtype))


RUN_LABELS = {"kobigbird+pi": "kobigbird exp/scale+pi", "kobigbird-copy+pi": "kobigbird copy/scale+pi",
              "littlebird+pi": "littlebird+pi"}


def exact_match(model, tokenizer, rows, length: int) -> dict:
    answers = predict_rows(model, tokenizer, rows, max_length=length, max_windows=1, batch_size=1,
                           lexical_weight=0.0)  # E3's protocol: the reader's own scores
    hits = [answers.get(row["id"]) is not None and answers[row["id"]].text.strip() == row["answers"]["text"][0]
            for row in rows]
    return {"exact_match": 100.0 * sum(hits) / len(hits), "n": len(hits)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--eval-samples", type=int, default=40)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--runs", nargs="+", default=["kobigbird", "kobigbird+pi", "kobigbird-copy+pi",
                                                      "littlebird", "littlebird+pi"])
    parser.add_argument("--resume", action="store_true", help="Merge with the rows of earlier runs in --out")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    parser.add_argument("--work", type=Path, default=ROOT / "experiments" / "runs" / "e3")
    args = parser.parse_args()
    torch.manual_seed(0)
    started = time.time()
    _, tokenizer = load_task_model(default_source(), LongBirdForQuestionAnswering, "kobigbird", 1024)
    train_rows, eval_rows = passkey_rows(tokenizer, args)
    results, started = start_results(args, args.out / "e3_extrapolation.json", started)
    for run in args.runs:
        preset = run.split("+")[0].split("-")[0]
        # kobigbird runs pin their schedule: the library default changed to copy because of this experiment
        overrides = {"taper_schedule": "copy" if "-copy" in run else "exp"} if preset == "kobigbird" else {}
        run_dir = args.work / run
        run_started = time.time()
        if not run_dir.exists():
            settings = FinetuneSettings(learning_rate=args.learning_rate, max_steps=args.steps,
                                        batch_size=args.batch_size, padding_insertion=run.endswith("+pi"),
                                        progress=False, logging_steps=50)
            metrics = finetune_qa(_converted(preset, overrides, args.work), train_rows, run_dir,
                                  window_length=TRAIN_LENGTH, max_windows=1, settings=settings)
            results["runs"][run] = {"train_seconds": time.time() - run_started, "train_loss": metrics["train_loss"],
                                    "torch_threads": torch.get_num_threads()}
        model, tokenizer = load_task_model(run_dir, LongBirdForQuestionAnswering)
        variants = [(RUN_LABELS.get(run, run), None)]
        if run == "kobigbird":
            variants = [(f"kobigbird {s}/{m}", (s, m)) for s in ("exp", "power", "copy") for m in ("scale", "centered")]
            variants.append(("full exp/scale", ("exp", "scale")))
        for name, taper in variants:
            if taper:
                retaper(model, *taper)
            model.config.attention = "full" if name.startswith("full") else model.config.attention
            for length in args.lengths:
                score = exact_match(model, tokenizer, eval_rows[length], length)
                results["rows"].append({"variant": name, "run": run, "length": length, **score})
                print(f"{name:28s} {length:5d}  EM {score['exact_match']:5.1f}", flush=True)
            model.config.attention = "bigbird" if run.startswith("kobigbird") else model.config.attention
        _write(results, args.out, started)


def _converted(preset: str, overrides: dict, work: Path) -> Path:
    """Convert the embedded MiniLM once per preset/override set (saved so runs can reuse it)."""
    path = work / "converted" / (preset + "".join(f"-{k}={v}" for k, v in sorted(overrides.items())))
    if not path.exists():
        convert_to_directory(None, path, preset=preset, max_length=MAX_LENGTH, **overrides)
    return path


def _write(results: dict, out: Path, started: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results["wall_seconds"] = time.time() - started
    results["torch_threads"] = torch.get_num_threads()
    variants = list(dict.fromkeys(row["variant"] for row in results["rows"]))
    lengths = sorted({row["length"] for row in results["rows"]})
    score = {(row["variant"], row["length"]): row["exact_match"] for row in results["rows"]}
    lines = [f"Command: `{results['command']}`  ",
             f"Budget: {results['settings']['steps']} steps x batch {results['settings']['batch_size']} at "
             f"{TRAIN_LENGTH} tokens per run, {results['settings']['eval_samples']} evaluation samples per length, "
             f"{results['wall_seconds'] / 60:.0f} min wall in total. Training minutes (torch threads, shared with "
             "other jobs): " + ", ".join(f"{run} {r['train_seconds'] / 60:.0f} ({r.get('torch_threads', '?')})"
                                         for run, r in results["runs"].items()) + ".", "",
             "| variant | " + " | ".join(str(n) for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
    for variant in variants:
        lines.append(f"| {variant} | " + " | ".join(f"{score[(variant, n)]:.1f}" if (variant, n) in score else ""
                                                     for n in lengths) + " |")
    out.mkdir(parents=True, exist_ok=True)
    write_file_atomically(out / "e3_extrapolation.md", "\n".join(lines) + "\n")
    write_file_atomically(out / "e3_extrapolation.json", json.dumps(results, indent=2) + "\n")
    figure, axis = plt.subplots(figsize=(8, 5))
    for variant in variants:
        points = [(n, score[(variant, n)]) for n in lengths if (variant, n) in score]
        axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=variant)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("evaluation length (tokens); trained at 512")
    axis.set_ylabel("passkey exact match (%)")
    axis.set_title("E3: extrapolation from 512-token fine-tuning (all-MiniLM-L6-v2 source)")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    save_figure_atomically(figure, out / "e3_extrapolation.png")
    plt.close(figure)


if __name__ == "__main__":
    main()
