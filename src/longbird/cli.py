"""Thin typer app: each command calls a library function and prints its result (rich)."""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path
from typing import Optional

import click
import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

console = Console()
error_console = Console(stderr=True)


class _OneLineErrors(TyperGroup):
    """Every command's errors as one line on stderr and exit 1; `longbird --debug ...` re-raises (full traceback)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        # typer 0.29 vendors click (typer._click): its usage errors are TyperExceptions, not click's own classes.
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort, typer.Exit, typer.Abort,
                typer.exceptions.TyperException):
            raise
        except Exception as error:
            if ctx.params.get("debug"):
                raise
            error_console.print(f"[red]error:[/] {one_line(error)}", highlight=False, markup=True, soft_wrap=True)
            raise typer.Exit(1) from None


# The library's messages name Python arguments (`max_length=1024`); someone who typed a command reads the options
# they type instead. Only spellings whose option is unambiguous are rewritten.
CLI_SPELLINGS = (
    (re.compile(r"\b(random_blocks|taper_schedule|position_extension|attention)='(\w+)'"), r"--set \1=\2"),
    (re.compile(r"\bmax_length=(\d+)"), r"--max-length \1"),
    (re.compile(r"\bmax_length \((\d+)\)"), r"--max-length (\1)"),
    (re.compile(r"\bdoc_stride \((\d+)\)"), r"--doc-stride (\1)"),
)


def cli_spelling(text: str) -> str:
    """`text` with Python argument spellings replaced by the CLI options a user types (`CLI_SPELLINGS`)."""
    for pattern, replacement in CLI_SPELLINGS:
        text = pattern.sub(replacement, text)
    return text


def one_line(error: BaseException) -> str:
    """The error as one line: our messages as they are (in CLI spelling); anything else prefixed by its type, with
    where to look."""
    text = cli_spelling(" ".join(str(error).split())) or type(error).__name__
    if isinstance(error, (ValueError, OSError, ImportError, KeyError)):
        return text.strip("'\"") if isinstance(error, KeyError) else text
    return f"{type(error).__name__}: {text} (longbird --debug ... shows the traceback)"


app = typer.Typer(cls=_OneLineErrors, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,  # plain click help: option names are never cut at 80 columns
                  help="longbird: long-context encoders from short ones.")


PRESET_HELP = ("kobigbird (BigBird ITC + TAPER), littlebird (BiALiBi + USW + pack), tape (full attention + TAPE "
               "position states), full (dense, for comparison)")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"longbird {version('longbird')}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show the full traceback of an error"),
    verbose: bool = typer.Option(False, "--verbose", help="Show library progress bars, load reports and raw logs"),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version"),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads for torch (default: torch's choice)"),
):
    """longbird: long-context encoders from short ones."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be >= 1; got {threads}")
        import torch

        torch.set_num_threads(threads)
    if verbose:
        import os

        os.environ["LONGBIRD_VERBOSE"] = "1"  # read by training's progress callback
    else:
        from .quiet import quiet_libraries

        quiet_libraries()


def _parse_options(options: list[str]) -> dict:
    parsed = {}
    for option in options:
        if "=" not in option:
            raise ValueError(f"--set expects KEY=VALUE; got {option!r}")
        key, value = option.split("=", 1)
        try:
            parsed[key] = json.loads(value)
        except json.JSONDecodeError:
            parsed[key] = value  # plain strings such as taper_schedule=power
    return parsed


@app.command()
def convert(
    source: Optional[str] = typer.Argument(None, help="Local HF model directory, or a named embedded source: "
                                                      "minilm (default) or multilingual-e5-small"),
    preset: str = typer.Option("kobigbird", help=PRESET_HELP),
    max_length: int = typer.Option(4096, help="Target maximum length in tokens"),
    out: Path = typer.Option(..., help="Output directory"),
    set_: list[str] = typer.Option([], "--set", help="Config override KEY=VALUE, e.g. taper_schedule=power"),
    overwrite: bool = typer.Option(False, help="Replace OUT if longbird wrote it"),
):
    """Convert a BERT/RoBERTa/XLM-R/CamemBERT/ELECTRA encoder into a longbird model."""
    from .checkpoints import convert_to_directory

    source_name = source or "minilm"
    with console.status(f"converting {source_name} ({preset}, {max_length} tokens) and saving to {out}"):
        model, has_tokenizer = convert_to_directory(source_name, out, preset=preset, max_length=max_length,
                                                    overwrite=overwrite, **_parse_options(set_))
    if not has_tokenizer:
        console.print("[yellow]no tokenizer found beside the source; saved the model only[/]")
    config = model.config
    console.print(f"[green]saved[/] {type(model).__name__} to {out}: attention={config.attention}, "
                  f"position={config.position}/{config.position_extension}, max_length={config.max_position_embeddings}, "
                  f"source L={config.source_max_positions}")


@app.command()
def export(
    model_dir: Path = typer.Argument(..., help="A saved longbird model directory"),
    format: str = typer.Option("hf-bigbird", "--format", help="Export format"),
    out: Path = typer.Option(..., help="Output directory"),
    overwrite: bool = typer.Option(False, help="Replace OUT if longbird wrote it"),
):
    """Export a BigBird+TAPER model to a plain transformers checkpoint."""
    from .export import export as export_model

    with console.status(f"exporting {model_dir} as {format}"):
        export_model(model_dir, out, format=format, overwrite=overwrite)
    console.print(f"[green]wrote[/] {format} checkpoint to {out}")


@app.command()
def env():
    """Versions, presets and kernels."""
    import tokenizers
    import torch
    import transformers

    from . import METHODS, PRESETS, __version__
    from .bench.sweep import cpu_model
    from .conversion import SUPPORTED_FAMILIES

    table = Table(title="longbird environment", show_header=False)
    rows = {
        "longbird": __version__, "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "threads": str(torch.get_num_threads()), "cpu": cpu_model(),
        "cpu capability": str(torch.backends.cpu.get_cpu_capability()),
        "source families": ", ".join(SUPPORTED_FAMILIES),
        "presets": ", ".join(f"{name} ({', '.join(f'{k}={v}' for k, v in values.items())})" for name, values in PRESETS.items()),
        "kernels": "full (SDPA), bigbird (blocked ITC), littlebird (blocked USW + pack), reference (dense oracle)",
        "methods": "; ".join(f"{name}: {text}" for name, text in METHODS.items()),
    }
    for key, value in rows.items():
        table.add_row(key, value)
    console.print(table)


@app.command()
def demo(
    out: Path = typer.Option(Path("demo-output/kobigbird-e5-small-4096"), help="Where the converted model is saved"),
    source: str = typer.Option("multilingual-e5-small", help="Source: a named embedded source or a directory"),
    document: Optional[Path] = typer.Option(None, help="Long document to encode (default: the Korean constitution)"),
    max_length: int = typer.Option(4096, help="Target length"),
):
    """Convert multilingual-e5-small to kobigbird-4096, verify, encode a long Korean document, save and reload."""
    from .demo import DEFAULT_DOCUMENT, run_demo

    with console.status("starting") as status:
        results = run_demo(out, source=source, document=document or DEFAULT_DOCUMENT, max_length=max_length,
                           step=lambda message: (status.update(message), console.log(message)))
    table = Table(title=f"longbird demo: {results['source']} -> kobigbird", show_header=False)
    table.add_row("equivalence at <= 512 tokens (lengths)", str(results["equivalence_lengths"]))
    table.add_row("max |converted - source| (fp32)", f"{results['max_abs_diff_vs_source']:.2e}")
    table.add_row("document tokens (encoded)", f"{results['document_tokens']} ({results['encoded_tokens']})")
    table.add_row("fp32 encode time / peak memory", f"{results['fp32_seconds']:.2f} s / {results['fp32_peak_mib']:.0f} MiB")
    if results["bf16_skipped"]:
        table.add_row("bf16 autocast", f"skipped: {results['bf16_skipped']}")
    else:
        table.add_row("bf16 autocast time / peak memory",
                      f"{results['bf16_seconds']:.2f} s / {results['bf16_peak_mib']:.0f} MiB")
        table.add_row("bf16 vs fp32 min cosine", f"{results['bf16_min_cosine_vs_fp32']:.5f}")
    table.add_row("saved to / reload identical", f"{results['saved_to']} / {results['reload_identical']}")
    console.print(table)
    if results["max_abs_diff_vs_source"] > 1e-4 or not results["reload_identical"]:
        console.print("[red]demo checks failed[/]")
        raise typer.Exit(1)


def resolve_device(device: str | None) -> str:
    """--device: "auto" (default) is CUDA when present, else CPU; anything else must be available here."""
    import torch

    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"--device {device!r} is not a device name ({error}); use cpu, cuda or cuda:N") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available on this machine (torch "
                         f"{torch.__version__}); use --device cpu")
    return str(parsed)


DEVICE_HELP = "cpu, cuda or cuda:N (default auto: CUDA when present)"


@app.command()
def bench(
    ctx: typer.Context,
    models: list[str] = typer.Option(["littlebird", "kobigbird", "full", "hf-bigbird", "hf-longformer", "sdpa-roberta"],
                                     "--model", help="Presets and baselines to compare (repeat the option)"),
    lengths: list[int] = typer.Option([1024, 2048, 4096, 8192, 16384], "--length", help="Sequence lengths"),
    modes: list[str] = typer.Option(["forward", "forward+backward"], "--mode", help="forward and/or forward+backward"),
    dtypes: list[str] = typer.Option(["fp32"], "--dtype", help="fp32, bf16 and/or fp16"),
    sizes: list[str] = typer.Option(["base"], "--size", help="small (12 x 384, e5-small), base (12 x 768) and/or large (24 x 1024)"),
    batches: list[str] = typer.Option(["1"], "--batch", help="Batch size, or max: the largest power of two that fits"),
    max_batch: int = typer.Option(64, help="Upper bound of the search for --batch max"),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    gradient_checkpointing: bool = typer.Option(False, help="Recompute layers in backward (forward+backward runs)"),
    repeats: int = typer.Option(3, help="Timed calls per point (median), after one warm-up"),
    max_seconds: float = typer.Option(60.0, help="Skip a model at longer lengths once a call takes longer"),
    max_memory_gib: float = typer.Option(16.0, help="Skip a model when its projected peak memory passes this"),
    out: Path = typer.Option(Path("benchmarks/results"), help="Directory for JSON, markdown and PNG plots"),
    smoke: bool = typer.Option(False, help="Quick check, under a minute: tiny model (2 layers, 128 hidden), lengths "
                                           "512 and 1024, one timed call (unless --length/--repeats are given)"),
    name: str = typer.Option("", help="File stem of the results (default: bench, or bench_smoke with --smoke)"),
    overwrite: bool = typer.Option(False, help="Replace earlier results of the same name in OUT"),
):
    """Latency and peak memory vs length for longbird presets and transformers baselines, with plots."""
    import json
    import sys

    from rich.progress import Progress

    from .bench.report import markdown, write_report
    from .bench.sweep import SweepSettings, run_sweep
    from .files import write_file_atomically

    if smoke:  # a quick check: shorter lengths and one timed call, unless the user chose them
        if ctx.get_parameter_source("lengths").name == "DEFAULT":
            lengths = [512, 1024]
        if ctx.get_parameter_source("repeats").name == "DEFAULT":
            repeats = 1
    settings = SweepSettings(models=list(models), lengths=list(lengths), modes=list(modes), dtypes=list(dtypes),
                             repeats=repeats, max_seconds=max_seconds, max_memory_gib=max_memory_gib,
                             device=resolve_device(device), sizes=["smoke"] if smoke else list(sizes),
                             batches=list(batches), max_batch=max_batch,
                             gradient_checkpointing=gradient_checkpointing)
    stem = name or ("bench_smoke" if smoke else "bench")
    if (out / f"{stem}.json").exists() and not overwrite:  # committed results are evidence: never replaced silently
        raise FileExistsError(f"{out / f'{stem}.json'} already exists; pass --overwrite to replace it or --name to "
                              "write beside it")
    partial = out / f"{stem}.partial.json"
    steps = len(settings.sizes) * len(dtypes) * len(modes) * len(batches) * len(lengths)
    with Progress(console=console) as progress:
        task = progress.add_task("bench", total=steps)
        report = run_sweep(settings, progress=lambda message: progress.update(task, advance=1, description=message),
                           checkpoint=lambda report: write_file_atomically(partial, json.dumps(report, indent=2) + "\n"))
    partial.unlink(missing_ok=True)
    command = "longbird " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else "longbird bench"
    paths = write_report(report, out, command, stem=stem)
    console.print(markdown(report | {"command": command}, command))
    console.print("wrote " + ", ".join(str(path) for path in paths))


def _settings(learning_rate, epochs, max_steps, batch_size, seed, padding_insertion, bf16, fp16=False, device="auto",
              train_word_embeddings=False, save_steps=0, resume=False, logging_steps=20, peft=None,
              slope_learning_rate=None, gradient_accumulation_steps=1, save_total_limit=None):
    from .training.finetune import FinetuneSettings, check_training_device

    # Checked before any data is read or model converted; a ValueError is one line and exit 1, like every error.
    settings = FinetuneSettings(learning_rate=learning_rate, epochs=epochs, max_steps=max_steps,
                                batch_size=batch_size, seed=seed, padding_insertion=padding_insertion, bf16=bf16,
                                fp16=fp16, device=device, train_word_embeddings=train_word_embeddings,
                                save_steps=save_steps, resume=resume, logging_steps=logging_steps, peft=peft,
                                slope_learning_rate=slope_learning_rate,
                                gradient_accumulation_steps=gradient_accumulation_steps,
                                save_total_limit=save_total_limit)
    check_training_device(settings)
    return settings


TRAIN_DEVICE_HELP = "auto (CUDA when present), cpu or cuda; pick a GPU with CUDA_VISIBLE_DEVICES"
CORPUS_HELP = ("Text/JSONL files or directories (repeatable; default: the repository's Korean text: KorQuAD, TyDi QA "
               "Korean, laws and bills, with the KorQuAD 1.0 dev-split articles held out)")
SLOPE_LR_HELP = ("Learning rate of the BiALiBi slopes (littlebird; default: --learning-rate, which barely moves them in "
                 "a short run)")
PEFT_HELP = "tape: train only the TAPE maps (+ the task head) of a TAPE model; saves only what was trained"
SAVE_STEPS_HELP = "Checkpoint every N steps into OUT.checkpoints/ (0: none; Ctrl-C then keeps the model too)"
RESUME_HELP = ("Continue from the last complete checkpoint in OUT.checkpoints/ (same options as the interrupted run; "
               "incomplete ones are skipped and reported)")
SAVE_TOTAL_LIMIT_HELP = "Keep only the newest N checkpoints (default: all of them)"
WORD_EMBEDDINGS_HELP = "Also train the word embeddings (frozen by default: with a 250K vocabulary they dominate a CPU step)"


def _print_metrics(title: str, metrics: dict) -> None:
    table = Table(title=title, show_header=False)
    for key, value in metrics.items():
        if isinstance(value, (int, float, str)):
            table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    resume = metrics.get("resume")
    if resume and resume["steps_trained_by_this_run"]:  # train_loss is then the loss of the resumed steps only
        first, last = resume["steps_trained_by_this_run"]
        table.add_row("resumed", f"from {resume['from_checkpoint']}: train_loss covers steps {first}-{last} only")
    console.print(table)


MODEL_HELP = ("longbird model directory, a HF encoder directory to convert, or a named embedded source to convert: "
              "minilm (default) or multilingual-e5-small")
READ_WINDOW_HELP = "Window in tokens (default: the window the model was fine-tuned at, else the model length)"
WINDOW_SOURCES = {"given": "--window-length", "trained": "the window it was fine-tuned at",
                  "model length": "the model length; no fine-tuning record"}
MAX_ANSWER_HELP = ("Longest answer span in tokens (default: the model's qa_max_answer_tokens: 64 unless fine-tuning "
                   "set it)")
SCORING_HELP = ("How spans of different windows are compared: null-relative (default: start logit minus the window's "
                "[CLS] start logit, plus log P(end | start)), log-probability (log P(start) + log P(end | start) within "
                "the window) or logit (raw start logit + log P(end | start))")
FORMAT_HELP = ("korquad2 (HTML pages), korquad1-articles (KorQuAD 1.0 joined per article), korquad1 (its paragraphs) "
               "or squad (SQuAD 1.1 paragraphs)")


@app.command("finetune-qa")
def finetune_qa(
    train: list[Path] = typer.Option(..., "--train", help="Training data: a JSON file or directory (repeatable)"),
    out: Path = typer.Option(..., help="Output directory for the fine-tuned model and tokenizer"),
    model: Optional[str] = typer.Option(None, help=MODEL_HELP),
    data_format: str = typer.Option("korquad2", "--format", help=FORMAT_HELP),
    preset: str = typer.Option("kobigbird", help="Preset when MODEL is converted: " + PRESET_HELP),
    max_length: int = typer.Option(4096, help="Model length when MODEL is converted"),
    window_length: Optional[int] = typer.Option(None, help="Feature window in tokens (default: the model length)"),
    doc_stride: Optional[int] = typer.Option(None, help="Tokens shared by neighbouring windows (default: half a "
                                                         "window, at most half the room the question leaves)"),
    max_windows: Optional[int] = typer.Option(None, help="Use only the first N windows (1 = truncation)"),
    negative_fraction: float = typer.Option(1.0, help="Keep this fraction of windows without the answer (default: "
                                                      "all; E4 keeps 0.1)"),
    max_examples: Optional[int] = typer.Option(None, help="Use N questions drawn with --seed"),
    split: Optional[str] = typer.Option(None, help="train or dev: one side of the fixed by-article split"),
    qa_head: Optional[str] = typer.Option(None, help="conditional (start, then end given start; the default for "
                                                      "new heads) or linear; a saved head is kept unless given"),
    max_answer_tokens: Optional[int] = typer.Option(None, min=1, help="Longest answer span `answer` and `evaluate` "
                                                    "decode with this model (saved in its config; default 64)"),
    learning_rate: float = typer.Option(5e-5), epochs: float = typer.Option(1.0),
    max_steps: int = typer.Option(-1, help="Stop after N optimiser steps (overrides --epochs)"),
    batch_size: int = typer.Option(4), seed: int = typer.Option(0),
    padding_insertion: bool = typer.Option(False, help="Padding Insertion on training batches (LittleBird 3.4)"),
    bf16: bool = typer.Option(False, help="bf16 mixed precision"),
    fp16: bool = typer.Option(False, help="fp16 mixed precision (CUDA only)"),
    device: str = typer.Option("auto", help=TRAIN_DEVICE_HELP),
    train_word_embeddings: bool = typer.Option(False, help=WORD_EMBEDDINGS_HELP),
    save_steps: int = typer.Option(0, help=SAVE_STEPS_HELP),
    save_total_limit: Optional[int] = typer.Option(None, help=SAVE_TOTAL_LIMIT_HELP),
    logging_steps: int = typer.Option(20, help="Log the training loss every N steps (kept in longbird_finetune.json)"),
    peft: Optional[str] = typer.Option(None, help="tape: train only the TAPE maps and the task head of a TAPE model "
                                                  "(--preset tape); OUT then holds only what was trained"),
    resume: bool = typer.Option(False, help=RESUME_HELP),
    overwrite: bool = typer.Option(False, help="Replace OUT if longbird wrote it"),
):
    """Fine-tune extractive QA on long documents (Trainer; `accelerate launch` for several GPUs)."""
    from .tasks.qa import finetune_qa as run

    metrics = run(model, [str(p) for p in train] if len(train) > 1 else train[0], out, data_format, preset,
                  max_length, window_length, doc_stride, max_windows, negative_fraction, max_examples,
                  _settings(learning_rate, epochs, max_steps, batch_size, seed, padding_insertion, bf16, fp16, device,
                            train_word_embeddings, save_steps, resume, logging_steps, peft,
                            save_total_limit=save_total_limit),
                  overwrite, qa_head, split, max_answer_tokens=max_answer_tokens)
    _print_metrics(f"fine-tuned QA model saved to {out}", metrics)


@app.command()
def evaluate(
    model: Path = typer.Option(..., help="Fine-tuned longbird QA or classification directory"),
    data: list[Path] = typer.Option(..., "--data", help="Evaluation data (repeatable for korquad2)"),
    out: Path = typer.Option(..., help="Directory for predictions.json and metrics.json"),
    task: str = typer.Option("qa", help="qa or classification"),
    data_format: str = typer.Option("korquad2", "--format", help=FORMAT_HELP + " (qa only)"),
    window_length: Optional[int] = typer.Option(None, help=READ_WINDOW_HELP + " (qa)"),
    doc_stride: Optional[int] = typer.Option(None, help="Tokens shared by neighbouring windows (qa default: the "
                                                         "trained stride)"),
    max_windows: Optional[int] = typer.Option(None, help="Use only the first N windows (1 = truncation)"),
    max_examples: Optional[int] = typer.Option(None, help="Use N questions drawn with seed 0"),
    split: Optional[str] = typer.Option(None, help="train or dev: one side of the fixed by-article split"),
    max_answer_tokens: Optional[int] = typer.Option(None, min=1, help=MAX_ANSWER_HELP),
    scoring: str = typer.Option("null-relative", help=SCORING_HELP),
    batch_size: int = typer.Option(4),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    overwrite: bool = typer.Option(False, help="Replace OUT if longbird wrote it"),
    bf16: bool = typer.Option(False, help="bf16 autocast (about 2x faster on CPUs with AVX-512 bf16)"),
):
    """Predict and score with the official metric; writes predictions.json and metrics.json."""
    device = resolve_device(device)
    with _autocast(device, bf16):
        result = _evaluate(model, data, out, task, data_format, window_length, doc_stride, max_windows, max_examples,
                           split, batch_size, device, overwrite, max_answer_tokens=max_answer_tokens, scoring=scoring)
    _print_metrics(f"{task} metrics (written to {out})", result["metrics"])


def _autocast(device: str, bf16: bool):
    import torch

    from .precision import slow_bf16_warning

    slow = slow_bf16_warning(device) if bf16 else None
    if slow:
        error_console.print(f"[yellow]warning:[/] {slow}", highlight=False)
    return torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16)


def _evaluate(model, data, out, task, data_format, window_length, doc_stride, max_windows, max_examples, split,
              batch_size, device, overwrite, max_answer_tokens=None, scoring="null-relative"):
    from .tasks.classification import evaluate_cls
    from .tasks.qa import evaluate_qa

    if task == "qa":
        result = evaluate_qa(model, [str(p) for p in data] if len(data) > 1 else data[0], data_format=data_format,
                             window_length=window_length, doc_stride=doc_stride, max_windows=max_windows,
                             batch_size=batch_size, max_examples=max_examples, out=out, progress=True, split=split,
                             device=device, overwrite=overwrite, max_answer_tokens=max_answer_tokens,
                             scoring=scoring)
    elif task == "classification":
        result = evaluate_cls(model, data[0], window_length=window_length, stride=doc_stride or 128, out=out, device=device,
                              overwrite=overwrite)
    else:
        raise ValueError(f"--task must be qa or classification; got {task!r}")
    return result


@app.command()
def answer(
    model: Path = typer.Option(..., help="Fine-tuned longbird QA directory"),
    document: Path = typer.Option(..., help="Document: .html/.htm (preprocessed) or plain text"),
    question: str = typer.Option(..., help="The question"),
    window_length: Optional[int] = typer.Option(None, help=READ_WINDOW_HELP),
    doc_stride: Optional[int] = typer.Option(None, help="Tokens shared by neighbouring windows (default: the trained "
                                                         "stride, else half a window)"),
    max_answer_tokens: Optional[int] = typer.Option(None, min=1, help=MAX_ANSWER_HELP),
    scoring: str = typer.Option("null-relative", help=SCORING_HELP),
    max_question_tokens: int = typer.Option(64, min=1, help="Read at most this many tokens of the question in every "
                                                         "window (a longer one is cut, with a warning)"),
    min_probability: float = typer.Option(0.0, help="Say 'no answer' (exit 1) when the best span's probability is "
                                                    "below this (0-1; default 0: always answer)"),
    as_json: bool = typer.Option(False, "--json", help="Print the answer as JSON (also when none is found)"),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    bf16: bool = typer.Option(False, help="bf16 autocast (about 2x faster on CPUs with AVX-512 bf16)"),
):
    """Answer a question about a long document: the answer, its character span in the file and its probability.

    Exit status 1 when no span qualifies or none reaches --min-probability (with --json the fields are null)."""
    from .data.reading import read_text_file
    from .sources import resolve_model_directory

    if not question.strip():
        raise ValueError("--question is empty; ask a question about the document")
    from .tasks.qa import check_min_probability

    check_min_probability(min_probability)  # before the model loads
    device = resolve_device(device)
    config = json.loads((resolve_model_directory(model) / "config.json").read_text(encoding="utf-8"))
    limit = config.get("max_position_embeddings")
    if window_length is not None and limit and not 1 <= window_length <= limit:  # before the model loads
        raise ValueError(f"--window-length {window_length} is above the model's maximum length {limit}; use at most "
                         f"{limit}")
    # Read as bytes and decoded as is: offsets count characters of the file, \r of CRLF line ends included.
    text = read_text_file(document, "document")
    is_html = document.suffix.lower() in (".html", ".htm")
    from .tasks.qa import answer as answer_document

    with console.status("loading the model"):
        from .heads import LongBirdForQuestionAnswering
        from .checkpoints import load_on_device

        qa_model, tokenizer = load_on_device(model, LongBirdForQuestionAnswering, device)
    with console.status(f"reading {document.name} ({len(text):,} characters)"), _autocast(device, bf16):
        record = answer_document(qa_model, document=text, question=question, tokenizer=tokenizer, is_html=is_html,
                                 window_length=window_length, max_answer_tokens=max_answer_tokens,
                                 scoring=scoring, doc_stride=doc_stride, model_dir=model,
                                 min_probability=min_probability, max_question_tokens=max_question_tokens)
    cut = record.get("question_cut")
    if cut:
        error_console.print(f"[yellow]warning:[/] the question has {cut['tokens']} tokens; only its first "
                            f"{cut['read']} were read", highlight=False)
    if as_json:
        print(json.dumps(record, ensure_ascii=False))
    elif record.get("best_probability") is not None:
        console.print(f"[yellow]no answer with probability ≥ {min_probability:g}[/] (the best span had "
                      f"{record['best_probability']:.2f})", highlight=False)
    elif record["answer"] is None:
        console.print("[yellow]no answer span found[/]")
    else:
        console.print(f"[bold]answer:[/] {record['answer']}", highlight=False)
        if is_html and record["source_text"] != record["answer"]:
            console.print(f"source span: {record['source_text']}", highlight=False, markup=False)
        probability = "" if record["probability"] is None else f", probability {record['probability']:.2f}"
        console.print(f"characters {record['start']}..{record['end']} of {document.name}{probability} "
                      f"(score {record['score']:.2f})", highlight=False)
    if not as_json:
        console.print(f"read in {record['window_length']}-token windows ({WINDOW_SOURCES[record['window_source']]})",
                      style="dim", highlight=False)
    if record["answer"] is None:
        raise typer.Exit(1)


@app.command()
def distill(
    output_dir: Path = typer.Option(..., "--output-dir", help="Run directory: model/ (the student), checkpoints/"),
    teacher: str = typer.Option("multilingual-e5-small", help="The short source model: a directory or a named "
                                                              "embedded source"),
    student: Optional[Path] = typer.Option(None, help="A longbird directory (default: the teacher converted with "
                                                      "--preset and --max-length)"),
    preset: str = typer.Option("littlebird", help="Preset when the student is converted: littlebird, kobigbird, full"),
    max_length: int = typer.Option(4096, help="Student length when converted"),
    corpus: list[Path] = typer.Option([], "--corpus", help=CORPUS_HELP),
    length: Optional[int] = typer.Option(None, help="Training window in tokens (default and maximum: the teacher's)"),
    rss: bool = typer.Option(False, help="Learn Recurring Span Selection at the same time (loss = RSS + beta * "
                                         "attention KL; the student is saved as a span-selection model)"),
    padding_insertion: bool = typer.Option(False, help="Padding Insertion on the student's position ids (LittleBird "
                                                       "3.4); the teacher reads the same tokens at its own positions"),
    alpha: float = typer.Option(1.0, help="Weight of the soft-target KL (teachers with an MLM head)"),
    beta: float = typer.Option(1.0, help="Weight of the attention KL"),
    temperature: float = typer.Option(1.0, help="Soft-target temperature"),
    learning_rate: float = typer.Option(1e-4), max_steps: int = typer.Option(100),
    batch_size: int = typer.Option(4), seed: int = typer.Option(0),
    save_steps: int = typer.Option(50, help="Checkpoint every N steps"),
    save_total_limit: Optional[int] = typer.Option(None, help=SAVE_TOTAL_LIMIT_HELP),
    logging_steps: int = typer.Option(10, help="Log the losses every N steps"),
    resume: bool = typer.Option(False, help="Continue from the last complete checkpoint in OUTPUT_DIR/checkpoints "
                                            "(incomplete ones are skipped and reported)"),
    bf16: bool = typer.Option(False, help="bf16 mixed precision"),
    gradient_checkpointing: bool = typer.Option(False, help="Recompute layers in backward"),
    slope_learning_rate: Optional[float] = typer.Option(None, help=SLOPE_LR_HELP),
    gradient_accumulation_steps: int = typer.Option(1, help="Batches summed per optimiser update"),
    peft: Optional[str] = typer.Option(None, help=PEFT_HELP),
    device: str = typer.Option("auto", help=TRAIN_DEVICE_HELP),
    overwrite: bool = typer.Option(False, help="Replace OUTPUT_DIR/model if longbird wrote it"),
):
    """Distil the short source into a long student (LittleBird 3.4): attention KL per layer + soft targets."""
    from .tasks.pretraining import distill as run

    settings = _settings(learning_rate, 1.0, max_steps, batch_size, seed, padding_insertion, bf16, False, device,
                         False, logging_steps=logging_steps, peft=peft, slope_learning_rate=slope_learning_rate,
                         gradient_accumulation_steps=gradient_accumulation_steps, save_total_limit=save_total_limit)
    metrics = run(teacher, output_dir, student, preset, max_length, list(corpus) or None, length, settings,
                  alpha, beta, temperature, save_steps, resume, gradient_checkpointing, overwrite, rss)
    _print_metrics(f"distilled student saved to {metrics['model_dir']}", metrics)


@app.command()
def pretrain(
    output_dir: Path = typer.Option(..., "--output-dir", help="Run directory: model/ and checkpoints/"),
    model: Optional[str] = typer.Option("multilingual-e5-small", help="A longbird directory (e.g. distill's model) or a "
                                                                      "source to convert with --preset"),
    preset: str = typer.Option("littlebird", help="Preset when MODEL is converted: " + PRESET_HELP),
    max_length: int = typer.Option(4096, help="Model length when MODEL is converted"),
    corpus: list[Path] = typer.Option([], "--corpus", help=CORPUS_HELP),
    length: int = typer.Option(2048, help="Training window in tokens (long inputs: 2048, 4096)"),
    learning_rate: float = typer.Option(1e-4), max_steps: int = typer.Option(100),
    batch_size: int = typer.Option(1), seed: int = typer.Option(0),
    padding_insertion: bool = typer.Option(False, help="Padding Insertion on training batches (LittleBird 3.4)"),
    save_steps: int = typer.Option(50, help=SAVE_STEPS_HELP),
    save_total_limit: Optional[int] = typer.Option(None, help=SAVE_TOTAL_LIMIT_HELP),
    logging_steps: int = typer.Option(10, help="Log the loss every N steps"),
    resume: bool = typer.Option(False, help=RESUME_HELP),
    bf16: bool = typer.Option(False, help="bf16 mixed precision"),
    gradient_checkpointing: bool = typer.Option(False, help="Recompute layers in backward"),
    slope_learning_rate: Optional[float] = typer.Option(None, help=SLOPE_LR_HELP),
    gradient_accumulation_steps: int = typer.Option(1, help="Batches summed per optimiser update"),
    peft: Optional[str] = typer.Option(None, help=PEFT_HELP),
    device: str = typer.Option("auto", help=TRAIN_DEVICE_HELP),
    overwrite: bool = typer.Option(False, help="Replace OUTPUT_DIR/model if longbird wrote it"),
):
    """Continued long training with Recurring Span Selection (LittleBird 3.4 step 3); reports held-out RSS accuracy."""
    from .tasks.pretraining import pretrain as run

    settings = _settings(learning_rate, 1.0, max_steps, batch_size, seed, padding_insertion, bf16, False, device,
                         False, save_steps, resume, logging_steps, peft, slope_learning_rate,
                         gradient_accumulation_steps, save_total_limit)
    metrics = run(model, output_dir, list(corpus) or None, length, preset, max_length, settings, overwrite=overwrite,
                  gradient_checkpointing=gradient_checkpointing)
    _print_metrics(f"pretrained model saved to {metrics['model_dir']}", metrics)


@app.command("finetune-cls")
def finetune_cls(
    train: Path = typer.Option(..., "--train", help="JSONL/CSV with a text and a label per document"),
    out: Path = typer.Option(..., help="Output directory"),
    model: Optional[str] = typer.Option(None, help=MODEL_HELP),
    preset: str = typer.Option("kobigbird", help="Preset when MODEL is converted: " + PRESET_HELP),
    max_length: int = typer.Option(4096, help="Model length when MODEL is converted"),
    window_length: Optional[int] = typer.Option(None, help="Window in tokens (default: the model length)"),
    stride: int = typer.Option(128, help="Tokens shared by neighbouring windows"),
    text_field: str = typer.Option("text"), label_field: str = typer.Option("label"),
    learning_rate: float = typer.Option(5e-5), epochs: float = typer.Option(1.0),
    max_steps: int = typer.Option(-1), batch_size: int = typer.Option(4), seed: int = typer.Option(0),
    padding_insertion: bool = typer.Option(False), bf16: bool = typer.Option(False),
    fp16: bool = typer.Option(False, help="fp16 mixed precision (CUDA only)"),
    device: str = typer.Option("auto", help=TRAIN_DEVICE_HELP),
    train_word_embeddings: bool = typer.Option(False, help=WORD_EMBEDDINGS_HELP),
    save_steps: int = typer.Option(0, help=SAVE_STEPS_HELP),
    save_total_limit: Optional[int] = typer.Option(None, help=SAVE_TOTAL_LIMIT_HELP),
    logging_steps: int = typer.Option(20, help="Log the training loss every N steps (kept in longbird_finetune.json)"),
    peft: Optional[str] = typer.Option(None, help="tape: train only the TAPE maps and the task head of a TAPE model "
                                                  "(--preset tape); OUT then holds only what was trained"),
    resume: bool = typer.Option(False, help=RESUME_HELP),
    overwrite: bool = typer.Option(False, help="Replace OUT if longbird wrote it"),
):
    """Fine-tune long-document classification (windows of a long document share its label)."""
    from .tasks.classification import finetune_cls as run

    metrics = run(model, train, out, preset, max_length, window_length, stride, text_field, label_field,
                  _settings(learning_rate, epochs, max_steps, batch_size, seed, padding_insertion, bf16, fp16, device,
                            train_word_embeddings, save_steps, resume, logging_steps, peft,
                            save_total_limit=save_total_limit),
                  overwrite)
    _print_metrics(f"fine-tuned classifier saved to {out}", metrics)


if __name__ == "__main__":
    app()
