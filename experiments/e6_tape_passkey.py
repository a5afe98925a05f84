"""E6 part 2: TAPE as parameter-efficient fine-tuning of a pretrained source, on the E3 passkey task.

The embedded multilingual-e5-small (Korean-capable, 12 layers, 384 hidden) is converted with `preset="tape"` (full
attention, absolute positions extended by TAPER copy, TAPE states with identity init: the converted model equals its
source before training) and fine-tuned with `--peft tape` (only the TAPE maps and the QA head train) on E3's
512-token passkey samples, then scored by exact match at 512..8K tokens on E3's evaluation samples (same seeds).

Rows, all from the same source, data and step budget:
- tape-peft         TAPE maps + QA head trained (TAPE §4's PEFT), learning rate --peft-learning-rate
- tape-gain-only    tape-peft without the phase (tape_phase=False; issue 26): the real-only states, a learned
                    attention gain per token and head; the difference to tape-peft is what the phase adds
- head-only         the same model and learning rate with the TAPE maps frozen at their init (W1 and W_post zero, so
                    they add nothing): only the QA head trains, so the difference to tape-peft is what TAPE adds
- lora              the same source without TAPE (`preset="full"`: full attention, the same extended position table)
                    with LoRA (the `peft` library) on the query and value maps at the rank whose parameter count is
                    closest to tape-peft's TAPE maps (rank 16), + the QA head, at --peft-learning-rate: the TAPE
                    paper's own PEFT baseline, and a control for "TAPE helps only because it adds trainable parameters"
- lora-gain-only    the same at the rank closest to tape-gain-only's maps (rank 13; the row `lora` was before issue 26)
- kobigbird-copy    every weight fine-tuned (except the word embeddings, as in every e5 run), E3's best conversion
                    (kobigbird, TAPER copy), learning rate --learning-rate as in E3
The plot also draws E3's rows (all-MiniLM-L6-v2 source) for reference.

Usage: python experiments/e6_tape_passkey.py [--steps 250] [--eval-samples 40] [--runs tape-peft ...] [--resume]
Writes experiments/results/e6_tape_passkey.{json,md,png}; fine-tuned models go to experiments/runs/e6_passkey/.
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

from e3_extrapolation import MAX_LENGTH, TRAIN_LENGTH, exact_match, passkey_rows, start_results  # noqa: E402
from longbird.files import save_figure_atomically, write_file_atomically  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.data.features import features_for_rows  # noqa: E402
from longbird.data.html import add_tag_tokens  # noqa: E402
from longbird.training import peft as longbird_peft  # noqa: E402
from longbird.training.finetune import FinetuneSettings, qa_training_items, train  # noqa: E402
from longbird.tasks.qa import finetune_qa  # noqa: E402
from longbird.checkpoints import load_task_model  # noqa: E402

SOURCE = "multilingual-e5-small"
RUNS = {  # run -> (preset, PEFT or full fine-tuning)
    "tape-peft": ("tape", True),
    "tape-gain-only": ("tape", True),
    "head-only": ("tape", True),
    "lora": ("full", True),
    "lora-gain-only": ("full", True),
    "kobigbird-copy": ("kobigbird", False),
}

# tape-gain-only: TAPE without its phase (config.tape_phase=False), the form before issue 26: from identity states it
# can only learn a per-token attention gain, so the difference to tape-peft is what the phase (position) adds
CONVERSION = {"tape-gain-only": {"tape_phase": False}}
# each LoRA row's rank matches the TAPE maps of this row (same conversion)
LORA_MATCH = {"lora": "tape-peft", "lora-gain-only": "tape-gain-only"}


def head_only(model, layer_norms: bool = False) -> list[str]:
    """`tape_peft` with the TAPE maps frozen too: the control row trains the QA head alone."""
    trainable = _tape_peft(model, layer_norms)
    for name, parameter in model.named_parameters():
        if "tape_" in name:
            parameter.requires_grad_(False)
    return [name for name in trainable if "tape_" not in name]


_tape_peft = longbird_peft.tape_peft


def lora_rank(tape_parameters: int, model) -> int:
    """The LoRA rank on query and value whose parameter count is closest to the TAPE maps' (r x (in + out) each)."""
    per_rank = sum(m.in_features + m.out_features for n, m in model.named_modules()
                   if n.endswith(("attention.self.query", "attention.self.value")))
    return max(1, round(tape_parameters / per_rank))


def train_lora(train_rows, rank: int, settings: FinetuneSettings, work: Path):
    """finetune_qa's steps for a model that carries LoRA adapters (longbird's PEFT checkpoints hold TAPE maps only,
    so this run is trained and scored in one process)."""
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import set_seed

    set_seed(settings.seed)
    model, tokenizer = load_task_model(SOURCE, LongBirdForQuestionAnswering, "full", MAX_LENGTH)
    add_tag_tokens(tokenizer, model)
    features = features_for_rows(tokenizer, train_rows, TRAIN_LENGTH, None, 1,
                                 token_types=model.config.type_vocab_size >= 2)
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                       target_modules=["query", "value"]), model)
    for name, parameter in model.named_parameters():  # LoRA + the QA head (everything outside the base model)
        parameter.requires_grad_("lora_" in name or not name.startswith("longbird."))
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    metrics = train(model, tokenizer, qa_training_items(features, 1.0, settings.seed), work / ".lora.work", settings)
    return model.eval(), tokenizer, metrics, trained


def trainable_counts(model, run: str, trained: int | None = None) -> dict:
    """Parameters trained by the run's rule, all parameters, and the non-embedding ones (the 250K-piece vocabulary
    is 96M of e5-small's 118M)."""
    total = sum(p.numel() for p in model.parameters())
    embeddings = model.get_input_embeddings().weight.numel()
    if trained is not None:  # LoRA: counted on the adapted model
        total += trained - sum(p.numel() for n, p in model.named_parameters() if not n.startswith("longbird."))
    elif RUNS[run][1]:
        names = set(head_only(model) if run == "head-only" else longbird_peft.tape_peft(model))
        trained = sum(p.numel() for n, p in model.named_parameters() if n in names)
    else:
        trained = total - embeddings
    return {"trainable": trained, "total": total, "non_embedding": total - embeddings,
            "fraction_of_total": trained / total, "fraction_of_non_embedding": trained / (total - embeddings)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="full fine-tuning (as in E3)")
    parser.add_argument("--peft-learning-rate", type=float, default=1e-3, help="tape-peft, head-only and lora")
    parser.add_argument("--eval-samples", type=int, default=40)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--seed", type=int, default=0,
                        help="Training seed (head init, data order); runs with another seed than 0 are named RUN-seedN")
    parser.add_argument("--resume", action="store_true", help="Merge with the rows of earlier runs in --out")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    parser.add_argument("--work", type=Path, default=ROOT / "experiments" / "runs" / "e6_passkey")
    args = parser.parse_args()
    torch.manual_seed(0)
    started = time.time()
    _, tokenizer = load_task_model(SOURCE, LongBirdForQuestionAnswering, "tape", 1024)
    train_rows, eval_rows = passkey_rows(tokenizer, args)  # E3's seeds: the same draws, e5's tokenizer
    names = {run: run if args.seed == 0 else f"{run}-seed{args.seed}" for run in args.runs}
    results, started = start_results(args, args.out / "e6_tape_passkey.json", started, redo=names.values())
    previous = args.out / "e6_tape_passkey.json"
    if args.resume and previous.exists():  # the record of rows renamed after issue 26 stays with them
        results.update({k: v for k, v in json.loads(previous.read_text()).items() if k == "relabelled"})
    for run in args.runs:
        preset, is_peft = RUNS[run]
        name = names[run]
        run_dir = args.work / name
        record = results["runs"].setdefault(name, {"seed": args.seed})
        record["tape_phase_code"] = True  # measured with issue 26's code (TAPE with its phase where not turned off)
        record["measured_on"] = time.strftime("%Y-%m-%d")
        lora_trained = None
        if run in LORA_MATCH:
            tape_model = load_task_model(SOURCE, LongBirdForQuestionAnswering, "tape", MAX_LENGTH,
                                         **CONVERSION.get(LORA_MATCH[run], {}))[0]
            tape_parameters = sum(p.numel() for n, p in tape_model.named_parameters() if "tape_" in n)
            rank = lora_rank(tape_parameters, tape_model)
            settings = FinetuneSettings(learning_rate=args.peft_learning_rate, max_steps=args.steps,
                                        batch_size=args.batch_size, progress=False, logging_steps=50, seed=args.seed)
            run_started = time.time()
            model, tokenizer, metrics, lora_trained = train_lora(train_rows, rank, settings, args.work)
            record.update(train_seconds=time.time() - run_started, train_loss=metrics["train_loss"],
                          learning_rate=settings.learning_rate, torch_threads=torch.get_num_threads(),
                          lora_rank=rank, tape_parameters=tape_parameters)
        elif run_dir.exists():  # a finished run is scored again, not retrained (delete it to retrain)
            print(f"{name}: reusing the model in {run_dir} (delete it to train again)", flush=True)
        else:
            settings = FinetuneSettings(learning_rate=args.peft_learning_rate if is_peft else args.learning_rate,
                                        max_steps=args.steps, batch_size=args.batch_size, progress=False,
                                        logging_steps=50, peft="tape" if is_peft else None, seed=args.seed)
            run_started = time.time()
            longbird_peft.tape_peft = head_only if run == "head-only" else _tape_peft  # imported at call time
            try:
                metrics = finetune_qa(SOURCE, train_rows, run_dir, preset=preset, max_length=MAX_LENGTH,
                                      window_length=TRAIN_LENGTH, max_windows=1, settings=settings,
                                      conversion=CONVERSION.get(run))
            finally:
                longbird_peft.tape_peft = _tape_peft
            record.update(train_seconds=time.time() - run_started, train_loss=metrics["train_loss"],
                          learning_rate=settings.learning_rate, torch_threads=torch.get_num_threads())
        if run not in LORA_MATCH:
            model, tokenizer = load_task_model(run_dir, LongBirdForQuestionAnswering)
        record["parameters"] = trainable_counts(load_task_model(SOURCE, LongBirdForQuestionAnswering, preset,
                                                                MAX_LENGTH, **CONVERSION.get(run, {}))[0], run,
                                                lora_trained)
        model.eval()
        evaluation_started = time.time()
        for length in args.lengths:
            score = exact_match(model, tokenizer, eval_rows[length], length)
            results["rows"].append({"variant": name, "run": name, "length": length, **score})
            print(f"{name:22s} {length:5d}  EM {score['exact_match']:5.1f}", flush=True)
        record["eval_seconds"] = time.time() - evaluation_started
        _write(results, args.out, started)


def _reproduction(results: dict) -> str:
    """Whether the re-run of tape-gain-only (seed 0) gave the scores and training loss of the renamed row."""
    before = results["relabelled"]["before_rerun"]
    now = {f"{row['variant']}@{row['length']}": row["exact_match"] for row in results["rows"]
           if row["variant"] == "tape-gain-only"}
    rerun = results["runs"].get("tape-gain-only", {})
    loss = rerun.get("train_loss")
    if not rerun.get("tape_phase_code"):  # still the renamed row itself
        return "."
    if loss == before["train_loss"] and now == {k: v for k, v in before.items() if "@" in k}:
        return f"; the re-run gave the same scores and training loss ({loss:.4f}), so the renaming holds."
    return f"; the re-run DIFFERS: before {before}, now {now}, training loss {loss}."


def _write(results: dict, out: Path, started: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results["wall_seconds"] = time.time() - started
    lengths = sorted({row["length"] for row in results["rows"]})
    score = {(row["variant"], row["length"]): row["exact_match"] for row in results["rows"]}
    variants = list(dict.fromkeys(row["variant"] for row in results["rows"]))
    e3_path = out / "e3_extrapolation.json"
    e3 = json.loads(e3_path.read_text())["rows"] if e3_path.exists() else []
    e3_variants = ["kobigbird copy/scale", "kobigbird exp/scale", "littlebird"]
    e3_score = {(row["variant"], row["length"]): row["exact_match"] for row in e3 if row["variant"] in e3_variants}
    settings = results["settings"]
    lines = [f"Command: `{results['command']}`  ",
             f"Source multilingual-e5-small; {settings['steps']} steps x batch {settings['batch_size']} at "
             f"{TRAIN_LENGTH} tokens per run; {settings['eval_samples']} evaluation samples per length (E3's); "
             f"{results['wall_seconds'] / 60:.0f} min wall in total on this CPU (2 cores, fp32).", "",
             *([f"Renamed rows: {results['relabelled']['note']}{_reproduction(results)}", ""]
               if "relabelled" in results else []),
             "| run | measured | trained parameters | % of all | % of non-embedding | lr | train min | eval min | "
             + " | ".join(str(n) for n in lengths) + " |",
             "|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(lengths)]
    for variant in variants:
        run = results["runs"].get(variant, {})
        counts = run.get("parameters", {})
        measured = run.get("measured_on") or ("after issue 26" if run.get("tape_phase_code")
                                              else "2026-11-23, before the phase")
        lines.append(f"| e5 {variant} | {measured} | {counts.get('trainable', 0):,} | "
                     f"{100 * counts.get('fraction_of_total', 0):.2f} | "
                     f"{100 * counts.get('fraction_of_non_embedding', 0):.2f} | {run.get('learning_rate', '')} | "
                     f"{run.get('train_seconds', 0) / 60:.0f} | {run.get('eval_seconds', 0) / 60:.0f} | "
                     + " | ".join(f"{score[(variant, n)]:.1f}" if (variant, n) in score else "" for n in lengths)
                     + " |")
    for variant in e3_variants:
        if any((variant, n) in e3_score for n in lengths):
            lines.append(f"| E3 MiniLM {variant} (full fine-tuning) | E3 | | | | 1e-4 | | | "
                         + " | ".join(f"{e3_score[(variant, n)]:.1f}" if (variant, n) in e3_score else ""
                                      for n in lengths) + " |")
    out.mkdir(parents=True, exist_ok=True)
    write_file_atomically(out / "e6_tape_passkey.md", "\n".join(lines) + "\n")
    write_file_atomically(out / "e6_tape_passkey.json", json.dumps(results, indent=2) + "\n")
    figure, axis = plt.subplots(figsize=(8, 5))
    for variant in variants:
        points = [(n, score[(variant, n)]) for n in lengths if (variant, n) in score]
        axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"e5 {variant}")
    for variant in e3_variants:
        points = [(n, e3_score[(variant, n)]) for n in lengths if (variant, n) in e3_score]
        if points:
            axis.plot([p[0] for p in points], [p[1] for p in points], linestyle="--", alpha=0.6,
                      label=f"E3 MiniLM {variant}")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("evaluation length (tokens); trained at 512")
    axis.set_ylabel("passkey exact match (%)")
    axis.set_title("E6 part 2: TAPE PEFT on multilingual-e5-small vs full fine-tuning")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    save_figure_atomically(figure, out / "e6_tape_passkey.png")
    plt.close(figure)


if __name__ == "__main__":
    main()
