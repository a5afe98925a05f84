"""Question answering: `finetune-qa`, `evaluate` (QA or classification) and `answer` (longbird.tasks.qa)."""

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from .common import (
    autocast,
    console,
    error_console,
    print_metrics,
    resolve_device,
    training_settings,
    warn_if_bf16_is_slow,
)
from .options import (
    FORMAT_HELP,
    LEXICAL_RADIUS,
    LEXICAL_WEIGHT,
    READ_WINDOW_HELP,
    SCORING,
    AutocastBf16,
    BatchSize,
    Compile,
    ConvertLength,
    ConvertPreset,
    Device,
    Epochs,
    FinetuneLoggingSteps,
    Fp16,
    GroupByLength,
    LabelField,
    LearningRate,
    LexicalRadius,
    LexicalWeight,
    MaxAnswerTokens,
    MaxStepsOverEpochs,
    MaxWindows,
    MixedBf16,
    Model,
    Overwrite,
    PaddingInsertion,
    ReadBatchSize,
    Resume,
    SaveSteps,
    SaveTotalLimit,
    Seed,
    Split,
    TapeLearningRate,
    TaskPeft,
    TextField,
    TrainDevice,
    TrainWordEmbeddings,
)

TrainData = Annotated[list[Path], typer.Option("--train", help="Training data: a JSON file or directory (repeatable)")]
TrainedOut = Annotated[Path, typer.Option(help="Output directory for the fine-tuned model and tokenizer")]
Format = Annotated[str, typer.Option("--format", help=FORMAT_HELP)]
FeatureWindow = Annotated[int | None, typer.Option(help="Feature window in tokens (default: the model length)")]
FeatureStride = Annotated[int | None, typer.Option(help="Tokens shared by neighbouring windows (default: half a "
                                                        "window, at most half the room the question leaves)")]
NegativeFraction = Annotated[float, typer.Option(help="Keep this fraction of windows without the answer (default: "
                                                      "all; E4 keeps 0.1)")]
SeededExamples = Annotated[int | None, typer.Option(min=1, help="Use N questions drawn with --seed")]
QAHead = Annotated[str | None, typer.Option(help="conditional (start, then end given start; the default for new "
                                                 "heads) or linear; a saved head is kept unless given")]
SavedAnswerTokens = Annotated[int | None, typer.Option(
    min=1, help="Longest answer span `answer` and `evaluate` decode with this model (saved in its config; default 64)")]
Teacher = Annotated[Path | None, typer.Option(help="Distil from this short QA model (e.g. `make qa-model`) read in "
                                                 "sliding windows of its trained length (with --cut-windows: each "
                                                 "cut read in one window of its own): its span distributions are "
                                                 "soft targets beside the gold labels")]
TeacherWeight = Annotated[float, typer.Option(min=0.0, max=1.0, help="Weight of the teacher's soft targets in the "
                                                                     "loss (the gold labels get the rest)")]
CPUMinutes = Annotated[float | None, typer.Option(min=0.001, help="Stop after this many minutes of CPU time (all "
                                                                   "threads) in training: equal budgets for methods "
                                                                   "whose steps cost differently")]
WallMinutes = Annotated[float | None, typer.Option(min=0.001, help="Stop after this many minutes of wall-clock time "
                                                                    "in training: a recipe that fits an hour on any "
                                                                    "machine")]
LRScheduler = Annotated[str, typer.Option(help="linear (decay to 0 at --max-steps, or where --cpu-minutes or "
                                               "--wall-minutes will run out if sooner) or constant (after warmup)")]
WarmupRatio = Annotated[float, typer.Option(help="Fraction of --max-steps (or of the epochs' steps) spent warming the "
                                                 "learning rate up from 0; give 0 with --cpu-minutes, which stops a "
                                                 "run long before --max-steps")]
TeacherTemperature = Annotated[float, typer.Option(min=0.01, help="Temperature of the teacher's distributions")]
TeacherTargets = Annotated[str, typer.Option(help="With --cut-windows: null-relative (every region's null and tokens "
                                                  "scored as the teacher scores them against its [CLS]), "
                                                  "within-region (each region's tokens only, its null left to the "
                                                  "gold labels) or marginal (the teacher's window distribution "
                                                  "per region, the null the rest)")]
CutWindows = Annotated[int | None, typer.Option(min=2, help="Train on windows of this many tokens cut from the long "
                                                            "windows: the model's first block, then a span of "
                                                            "tokens, each with its long-window position and null "
                                                            "(a sliding window's cost, the long reading's layout)")]
CutOverlap = Annotated[int, typer.Option(min=0, help="Tokens shared by neighbouring cuts (about; with --cut-windows)")]
LinkedWindows = Annotated[int | None, typer.Option(min=1, help="For a model with linked windows (convert with --set "
                                                             "linked_windows=true): train on groups of at most N "
                                                             "windows of one question, every window with the answer "
                                                             "and others of its document, linked in their batch; "
                                                             "--batch-size counts groups")]
LinkedNegatives = Annotated[str, typer.Option(help="With --linked-windows: the windows without the answer in a group, "
                                                   "'random' or 'lexical' (those whose text matches the question best "
                                                   "by BM25: the distractors)")]
LinkLearningRate = Annotated[float | None, typer.Option(help="Learning rate of the link gates (and the window "
                                                             "selector, where there is one) of a model with linked "
                                                             "windows (default: --learning-rate)")]

EvaluatedModel = Annotated[Path, typer.Option(help="Fine-tuned longbird QA or classification directory")]
EvaluationData = Annotated[list[Path], typer.Option("--data", help="Evaluation data (repeatable: KorQuAD 2 files, "
                                                                   "or classification files read as one test set)")]
EvaluationOut = Annotated[Path, typer.Option(help="Directory for predictions.json and metrics.json")]
Task = Annotated[str, typer.Option(help="qa or classification")]
QAFormat = Annotated[str, typer.Option("--format", help=FORMAT_HELP + " (qa only)")]
QAReadWindow = Annotated[int | None, typer.Option(help=READ_WINDOW_HELP)]
QAReadStride = Annotated[int | None, typer.Option("--doc-stride", "--stride", min=0, help=(
    "Tokens shared by neighbouring windows (default: the trained stride; classification without one: 128, a quarter "
    "of a shorter window); --stride as finetune-cls spells it"))]
FirstExamples = Annotated[int | None, typer.Option(min=1, help="Use N questions drawn with seed 0")]

QAModel = Annotated[Path, typer.Option(help="Fine-tuned longbird QA directory")]
Document = Annotated[Path, typer.Option(help="Document: .html/.htm (preprocessed) or plain text")]
Question = Annotated[str, typer.Option(help="The question")]
ReadWindow = Annotated[int | None, typer.Option(help=READ_WINDOW_HELP)]
ReadStride = Annotated[int | None, typer.Option(help="Tokens shared by neighbouring windows (default: the trained "
                                                     "stride, else half a window)")]
QuestionTokens = Annotated[int | None, typer.Option(min=1, help="Read at most this many tokens of the question in "
                                                                "every window (a longer one is cut, with a warning; "
                                                                "default 64, or what fits in the first block of a "
                                                                "sparse window)")]
MinProbability = Annotated[float, typer.Option(help="Say 'no answer' (exit 1) when the best span's probability is "
                                                    "below this (0-1; default 0: always answer)")]
Json = Annotated[bool, typer.Option("--json", help="Print the answer as JSON (also when none is found)")]

WINDOW_SOURCES = {"given": "--window-length", "trained": "the window it was fine-tuned at",
                  "model length": "the model length; no fine-tuning record"}


def finetune_qa(
    train: TrainData, out: TrainedOut, model: Model = None, data_format: Format = "korquad2",
    preset: ConvertPreset = "kobigbird", max_length: ConvertLength = 4096, window_length: FeatureWindow = None,
    doc_stride: FeatureStride = None, max_windows: MaxWindows = None, negative_fraction: NegativeFraction = 1.0,
    max_examples: SeededExamples = None, split: Split = None, qa_head: QAHead = None,
    max_answer_tokens: SavedAnswerTokens = None, learning_rate: LearningRate = 5e-5, epochs: Epochs = 1.0,
    max_steps: MaxStepsOverEpochs = -1, batch_size: BatchSize = 4, seed: Seed = 0,
    padding_insertion: PaddingInsertion = False, bf16: MixedBf16 = False, fp16: Fp16 = False,
    device: TrainDevice = "auto", train_word_embeddings: TrainWordEmbeddings = False, save_steps: SaveSteps = 0,
    save_total_limit: SaveTotalLimit = None, logging_steps: FinetuneLoggingSteps = 20, peft: TaskPeft = None,
    tape_learning_rate: TapeLearningRate = None,
    group_by_length: GroupByLength = False, compile: Compile = False, resume: Resume = False,
    overwrite: Overwrite = False,
    teacher: Teacher = None, teacher_weight: TeacherWeight = 0.5, teacher_temperature: TeacherTemperature = 1.0,
    teacher_targets: TeacherTargets = "null-relative",
    cpu_minutes: CPUMinutes = None, wall_minutes: WallMinutes = None, lr_scheduler: LRScheduler = "linear",
    warmup_ratio: WarmupRatio = 0.1, cut_windows: CutWindows = None, cut_overlap: CutOverlap = 128,
    linked_windows: LinkedWindows = None, link_learning_rate: LinkLearningRate = None,
    linked_negatives: LinkedNegatives = "random",
):
    """Fine-tune extractive QA on long documents (Trainer; `accelerate launch` for several GPUs)."""
    settings = training_settings(locals())
    from ..tasks.qa import finetune_qa as run

    metrics = run(model_path=model, train_data=_one_or_many(train), out=out, data_format=data_format, preset=preset,
                  max_length=max_length, window_length=window_length, doc_stride=doc_stride, max_windows=max_windows,
                  negative_fraction=negative_fraction, max_examples=max_examples, settings=settings,
                  overwrite=overwrite, qa_head=qa_head, split=split, max_answer_tokens=max_answer_tokens,
                  teacher=teacher, teacher_weight=teacher_weight, teacher_temperature=teacher_temperature,
                  teacher_targets=teacher_targets, cut_windows=cut_windows, cut_overlap=cut_overlap,
                  linked_groups=linked_windows, linked_negatives=linked_negatives)
    print_metrics(f"fine-tuned QA model saved to {out}", metrics)


def evaluate(
    ctx: typer.Context, model: EvaluatedModel, data: EvaluationData, out: EvaluationOut, task: Task = "qa",
    data_format: QAFormat = "korquad2", window_length: QAReadWindow = None, doc_stride: QAReadStride = None,
    max_windows: MaxWindows = None, max_examples: FirstExamples = None, split: Split = None,
    max_answer_tokens: MaxAnswerTokens = None, scoring: str = SCORING, batch_size: ReadBatchSize = 4,
    device: Device = "auto", overwrite: Overwrite = False, bf16: AutocastBf16 = False, compile: Compile = False,
    lexical_weight: LexicalWeight = LEXICAL_WEIGHT, lexical_radius: LexicalRadius = LEXICAL_RADIUS,
    text_field: TextField = "text", label_field: LabelField = "label",
):
    """Predict and score with the official metric; writes predictions.json and metrics.json."""
    _refuse_options_of_the_other_task(ctx, task)
    device = resolve_device(device)
    warn_if_bf16_is_slow(device, bf16)  # evaluate_qa / evaluate_cls read under bf16 autocast themselves
    if task == "qa":
        from ..tasks.qa import evaluate_qa

        result = evaluate_qa(model_path=model, data=_one_or_many(data), data_format=data_format,
                             window_length=window_length, doc_stride=doc_stride, max_windows=max_windows,
                             batch_size=batch_size, max_examples=max_examples, out=out, progress=True,
                             split=split, device=device, overwrite=overwrite,
                             max_answer_tokens=max_answer_tokens, scoring=scoring, compile=compile, bf16=bf16,
                             lexical_weight=lexical_weight, lexical_radius=lexical_radius)
    elif task == "classification":
        from ..tasks.classification import evaluate_cls

        result = evaluate_cls(model_path=model, data=_one_or_many(data), window_length=window_length,
                              stride=doc_stride, text_field=text_field, label_field=label_field, out=out,
                              device=device, overwrite=overwrite, bf16=bf16)
    else:
        raise ValueError(f"--task must be qa or classification; got {task!r}")
    print_metrics(f"{task} metrics (written to {out})", result["metrics"])


def answer(
    model: QAModel, document: Document, question: Question, window_length: ReadWindow = None,
    doc_stride: ReadStride = None, max_answer_tokens: MaxAnswerTokens = None, scoring: str = SCORING,
    max_question_tokens: QuestionTokens = None, min_probability: MinProbability = 0.0, as_json: Json = False,
    device: Device = "auto", bf16: AutocastBf16 = False, compile: Compile = False,
    lexical_weight: LexicalWeight = LEXICAL_WEIGHT, lexical_radius: LexicalRadius = LEXICAL_RADIUS,
):
    """Answer a question about a long document: the answer, its character span in the file and its probability.

    Exit status 1 when no span qualifies or none reaches --min-probability (with --json the fields are null)."""
    from ..checkpoints import load_on_device
    from ..data.reading import read_text_file
    from ..heads import LongBirdForQuestionAnswering
    from ..tasks.qa import answer as answer_document
    from ..tasks.qa import check_min_probability

    check_min_probability(min_probability)  # before the model loads (seconds)
    device = resolve_device(device)
    _check_window_length(model, window_length)
    # Read as bytes and decoded as is: offsets count characters of the file, \r of CRLF line ends included.
    text = read_text_file(path=document, what="document")
    with console.status("loading the model"):
        qa_model, tokenizer = load_on_device(model_path=model, task_class=LongBirdForQuestionAnswering, device=device,
                                             compile=compile, bf16=bf16)
    with console.status(escape(f"reading {document.name} ({len(text):,} characters)")), autocast(device, bf16):
        record = answer_document(model=qa_model, document=text, question=question, tokenizer=tokenizer,
                                 is_html=_is_html(document), window_length=window_length, doc_stride=doc_stride,
                                 max_answer_tokens=max_answer_tokens, scoring=scoring, model_dir=model,
                                 min_probability=min_probability, max_question_tokens=max_question_tokens,
                                 lexical_weight=lexical_weight, lexical_radius=lexical_radius)
    _print_answer(record, document=document, min_probability=min_probability, as_json=as_json)
    if record["answer"] is None:
        raise typer.Exit(1)


# evaluate's options that only one task reads: given to the other task they were ignored
QA_ONLY = {"data_format": "--format", "max_windows": "--max-windows", "max_examples": "--max-examples",
           "split": "--split", "max_answer_tokens": "--max-answer-tokens", "scoring": "--scoring",
           "compile": "--compile", "lexical_weight": "--lexical-weight", "lexical_radius": "--lexical-radius",
           "batch_size": "--batch-size"}
CLASSIFICATION_ONLY = {"text_field": "--text-field", "label_field": "--label-field"}


def _refuse_options_of_the_other_task(ctx: typer.Context, task: str) -> None:
    others = {"qa": CLASSIFICATION_ONLY, "classification": QA_ONLY}.get(task, {})  # another task: evaluate says so
    ignored = [option for name, option in others.items() if ctx.get_parameter_source(name).name != "DEFAULT"]
    if ignored:
        raise typer.BadParameter(f"{', '.join(ignored)} {'applies' if len(ignored) == 1 else 'apply'} to --task "
                                 f"{'qa' if task == 'classification' else 'classification'} only; leave "
                                 f"{'it' if len(ignored) == 1 else 'them'} out with --task {task}")


def _one_or_many(paths: list[Path]):
    """A repeated data option as the library takes it: one path, or a list of them."""
    return [str(path) for path in paths] if len(paths) > 1 else paths[0]


def _is_html(document: Path) -> bool:
    return document.suffix.lower() in (".html", ".htm")


def _check_window_length(model: Path, window_length: int | None) -> None:
    """--window-length against the model's maximum length in its config.json: before the model loads or the document
    is read (the library checks it again once the model is loaded)."""
    if window_length is None:
        return
    from ..sources import resolve_model_directory, saved_config

    config = saved_config(resolve_model_directory(model))
    limit = config.get("max_position_embeddings")
    if window_length < 1:
        raise ValueError(f"--window-length {window_length} is not a length; use a number of tokens from 1 to "
                         f"{limit or 'the model maximum'}")
    if limit and window_length > limit:
        raise ValueError(f"--window-length {window_length} is above the model's maximum length {limit}; use at most "
                         f"{limit}")


def _print_answer(record: dict, document: Path, min_probability: float, as_json: bool) -> None:
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
        console.print(f"[bold]answer:[/] {escape(record['answer'])}", highlight=False)
        if _is_html(document) and record["source_text"] != record["answer"]:
            console.print(f"source span: {record['source_text']}", highlight=False, markup=False)
        probability = "" if record["probability"] is None else f", probability {record['probability']:.2f}"
        console.print(f"characters {record['start']}..{record['end']} of {escape(document.name)}{probability} "
                      f"(score {record['score']:.2f})", highlight=False)
    if not as_json:
        console.print(f"read in {record['window_length']}-token windows ({WINDOW_SOURCES[record['window_source']]})",
                      style="dim", highlight=False)
