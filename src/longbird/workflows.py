"""End-to-end workflows called by the CLI and by tests: fine-tune and evaluate QA and classification.

A model argument is either a saved longbird directory (a task head is added if it has none) or a plain
Hugging Face encoder directory, which is converted first with `preset` and `max_length`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoTokenizer, set_seed

from .config import LongBirdConfig
from .convert import convert
from .sources import resolve_model_directory, resolve_source
from .data.batching import PaddedBatches
from .data.classification import document_windows, label_vocabulary, read_classification
from .data.features import features_for_rows
from .data.html import add_tag_tokens
from .data.korquad import read_korquad_v1_articles, read_korquad_v2, read_squad_paragraphs, split_by_title
from .files import write_directory_atomically
from .heads import LongBirdForQuestionAnswering, LongBirdForSequenceClassification
from .modeling import enable_checkpointing
from .metrics.classification import accuracy, macro_f1
from .metrics.korquad import korquad_v1, korquad_v2, squad_v1
from .qa import DEFAULT_SCORING, predict_rows
from .training.finetune import FinetuneSettings, is_main_process, qa_training_items, train, world_size
from .training.peft import base_record, is_tape_peft, load_tape_peft, save_tape_peft

# korquad1 and squad are the published paragraphs; korquad1-articles joins each article into one context
logger = logging.getLogger(__name__)
DATA_FORMATS = ("korquad2", "korquad1-articles", "korquad1", "squad")


def convert_to_directory(source, out: str | Path, preset: str = "kobigbird", max_length: int = 4096,
                         overwrite: bool = False, **overrides: Any) -> tuple[Any, bool]:
    """Convert `source` (default: the embedded MiniLM) and save model + source tokenizer to `out` atomically.
    Returns (model, whether a tokenizer was found beside the source)."""
    source = resolve_source(source)
    model = convert(source, preset=preset, max_length=max_length, **overrides)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError):
        tokenizer = None

    if tokenizer is not None:
        tokenizer.model_max_length = max_length  # else `truncation=True` would cut to the source's 512

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)

    if is_main_process():  # under torchrun every process trains, the first one writes
        write_directory_atomically(out, write, overwrite=overwrite)
    return model, tokenizer is not None


TASK_COMMANDS = {"LongBirdForQuestionAnswering": ("question-answering", "finetune-qa"),
                 "LongBirdForSequenceClassification": ("classification", "finetune-cls")}


def require_trained_head(model_path, task_class) -> None:
    """Inference needs a head that was trained and saved: loading a base model (or another task's model) into a task
    class would give a randomly initialised head that answers without a word."""
    path = resolve_model_directory(model_path)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    task, command = TASK_COMMANDS[task_class.__name__]
    saved = config.get("architectures") or ["(none)"]
    if config.get("model_type") != "longbird" or task_class.__name__ not in saved:
        raise ValueError(f"{path} has no trained {task} head (saved architecture: {', '.join(saved)}); fine-tune it "
                         f"with `longbird {command}` first, or give a directory that `{command}` wrote")


def load_on_device(model_path, task_class, device: str | None = None):
    """(model, tokenizer) for inference with a trained head, the model moved to `device` (None: the CPU)."""
    require_trained_head(model_path, task_class)
    model, tokenizer = load_task_model(model_path, task_class)
    return (model.to(device) if device else model), tokenizer


def trained_windows(model_path) -> tuple[int | None, int | None]:
    """(window_length, doc_stride) a QA model was fine-tuned with, from its `longbird_finetune.json`; (None, None)
    for a model without that record (converted or saved by hand), which then reads windows of its full length.
    Reading with the trained window is the default of `answer` and `evaluate`: a model fine-tuned on 512-token
    windows has never been trained to read 4096 (design: the trained window, not the model length)."""
    record = resolve_model_directory(model_path) / "longbird_finetune.json"
    if not record.exists():
        return None, None
    data = json.loads(record.read_text(encoding="utf-8"))
    return (data.get("window_length"), data.get("doc_stride")) if data.get("task") == "qa" else (None, None)


def reading_windows(model, model_path, window_length: int | None,
                    doc_stride: int | None) -> tuple[int, int | None, str]:
    """(window_length, doc_stride, where the window came from: "given", "trained" or "model length")."""
    if window_length is not None:
        source = "given"
    else:
        window_length, trained_stride = trained_windows(model_path) if model_path is not None else (None, None)
        source = "trained" if window_length is not None else "model length"
        doc_stride = doc_stride if doc_stride is not None else trained_stride
    limit = model.config.max_position_embeddings
    window_length = window_length or limit
    if not 1 <= window_length <= limit:
        raise ValueError(f"window_length {window_length} must lie in 1..{limit} (the model's maximum length)")
    return window_length, doc_stride, source


def load_task_model(model_path: str | Path | None, task_class, preset: str = "kobigbird", max_length: int = 4096,
                    **overrides: Any):
    """(model, tokenizer) for a task: a longbird directory is loaded, anything else is converted."""
    path = resolve_model_directory(model_path)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if is_tape_peft(path):  # a PEFT directory holds what was trained and where its base is
        model = load_tape_peft(path, task_class)
        return model, _fit_tokenizer(tokenizer, model)
    if AutoConfig.from_pretrained(path, local_files_only=True).model_type == "longbird":
        model = task_class.from_pretrained(path, **overrides)
        return model, _fit_tokenizer(tokenizer, model)
    # LongBirdConfig fields go into the conversion (some shape weights, e.g. pack_size); the rest (num_labels, ...)
    # are head settings of the generic config.
    fields = {field.name for field in dataclasses.fields(LongBirdConfig)}
    base = convert(path, preset=preset, max_length=max_length,
                   **{key: value for key, value in overrides.items() if key in fields})
    config = base.config
    for key, value in overrides.items():
        if key not in fields:
            setattr(config, key, value)
    model = task_class(config)
    source = base.longbird if hasattr(base, "longbird") else base
    model.longbird.load_state_dict(source.state_dict())
    return model, _fit_tokenizer(tokenizer, model)


def _fit_tokenizer(tokenizer, model):
    tokenizer.model_max_length = model.config.max_position_embeddings  # windows are cut by our features
    return tokenizer


def check_tokenizer(model, tokenizer) -> None:
    """A tokenizer that emits ids the model has no embedding for is the wrong tokenizer."""
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise ValueError(f"tokenizer/model mismatch: the tokenizer has {len(tokenizer)} tokens but the model's "
                         f"embedding table has {rows} rows; use the tokenizer saved with the model")


SPLIT_FORMATS = ("korquad1", "korquad1-articles", "squad")  # whose files are scored on the by-article dev side


def read_qa_data(path, data_format: str, split: str | None = None) -> tuple[Dataset, int]:
    """(questions, number of skipped records) of a dataset in one of DATA_FORMATS; `split` ("train"/"dev")
    takes one side of the fixed by-article split (`split_by_title`, seed 0, 20 % dev)."""
    if data_format == "korquad2":
        rows, skipped = read_korquad_v2(path)
    elif data_format in ("korquad1-articles", "korquad1", "squad"):
        if isinstance(path, (list, tuple)):
            raise ValueError(f"{data_format} data is one JSON file; got {len(path)} paths")
        reader = read_korquad_v1_articles if data_format.endswith("-articles") else read_squad_paragraphs
        rows, skipped = reader(path)
    else:
        raise ValueError(f"unknown data format {data_format!r}; use one of {DATA_FORMATS}")
    if split is None:
        return rows, len(skipped)
    if split not in ("train", "dev"):
        raise ValueError(f"split must be train or dev; got {split!r}")
    return split_by_title(rows)[split], len(skipped)


def require_trained_apart(model_dir, held_titles, root: Path | None = None) -> set[str]:
    """The article titles a fine-tuned QA model was trained on, read from its own `longbird_finetune.json` (data,
    format, split); raises ValueError unless it was trained only on the train side of the by-article split and none
    of those titles is in `held_titles`. Relative data paths are tried as given, then under `root`."""
    record_path = Path(model_dir) / "longbird_finetune.json"
    if not record_path.exists():
        raise ValueError(f"{model_dir} has no longbird_finetune.json: what it was trained on cannot be checked")
    record = json.loads(record_path.read_text(encoding="utf-8"))
    if record.get("task") != "qa" or record.get("split") != "train":
        raise ValueError(f"{model_dir} was fine-tuned with split {record.get('split')!r} on {record.get('data')}: "
                         "only a reader trained on the train side (--split train) can be scored on the dev side")
    data = record["data"]
    paths = [Path(p) for p in (data if isinstance(data, list) else [data])]
    found = [p if p.exists() or root is None else Path(root) / p for p in paths]
    missing = [str(p) for p in found if not p.exists()]
    if missing:
        raise ValueError(f"the data {model_dir} was trained on is not here ({', '.join(missing)}): cannot check it")
    titles = set(read_qa_data(found if len(found) > 1 else found[0], record["format"], "train")[0]["title"])
    leaked = titles & set(held_titles)
    if leaked:
        raise ValueError(f"{model_dir} was trained on {len(leaked)} held-out articles, e.g. {sorted(leaked)[:3]}")
    return titles


def sample_questions(rows: Dataset, n: int | None, seed: int = 0) -> Dataset:
    """`n` questions drawn with `seed` (all when n is None): a first-N cut would take a few articles only."""
    if n is None or n >= len(rows):
        return rows
    return rows.shuffle(seed=seed).select(range(n))


def finetune_qa(model_path, train_data, out: str | Path, data_format: str = "korquad2", preset: str = "kobigbird",
                max_length: int = 4096, window_length: int | None = None, doc_stride: int | None = None,
                max_windows: int | None = None, negative_fraction: float = 1.0, max_examples: int | None = None,
                settings: FinetuneSettings | None = None, overwrite: bool = False, qa_head: str | None = None,
                split: str | None = None, max_answer_tokens: int | None = None) -> dict:
    """Fine-tune a QA model and save it (with its tokenizer, which gains the HTML tag tokens) to `out`. `window_length` (default: the model's
    maximum) is the feature window; `max_windows=1` trains on the first window only (truncation)."""
    settings = settings or FinetuneSettings()
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"output directory {out} already exists; pass --overwrite to replace it")
    rows = train_data if isinstance(train_data, Dataset) else read_qa_data(train_data, data_format, split)[0]
    # The by-article split is the protocol of the KorQuAD 1.0 / SQuAD files (`evaluate --split dev`); a handful of
    # KorQuAD 2.x pages is not scored that way, so the warning would only be noise there.
    if split is None and not isinstance(train_data, Dataset) and len(rows) and data_format in SPLIT_FORMATS:
        dev_titles = set(split_by_title(rows)["dev"]["title"])
        if dev_titles:  # the same file scored with `evaluate --split dev` would then score trained-on questions
            logger.warning("training on all of %s: %d of its articles are the dev side of the by-article split that "
                           "`evaluate --split dev` scores; pass --split train to hold them out", train_data,
                           len(dev_titles))
    rows = sample_questions(rows, max_examples, settings.seed)
    # a saved head (and its answer-length limit) is kept unless another is asked for
    overrides = {key: value for key, value in (("qa_head", qa_head), ("qa_max_answer_tokens", max_answer_tokens))
                 if value is not None}
    set_seed(settings.seed)  # a new head's initialisation is part of the run
    model, tokenizer = load_task_model(model_path, LongBirdForQuestionAnswering, preset, max_length, **overrides)
    add_tag_tokens(tokenizer, model)  # always, so the model can read HTML pages later (`longbird answer`)
    check_tokenizer(model, tokenizer)
    window_length = window_length or model.config.max_position_embeddings
    features = features_for_rows(tokenizer, rows, window_length, doc_stride, max_windows,
                                 token_types=model.config.type_vocab_size >= 2)
    items = qa_training_items(features, negative_fraction, settings.seed)
    metrics = train(model, tokenizer, items, out.parent / f".{out.name}.work", settings,
                    checkpoint_dir=out.parent / f"{out.name}.checkpoints")

    def write(directory: Path) -> None:
        _save_trained(model, directory, settings, model_path, preset, max_length)
        tokenizer.save_pretrained(directory)
        summary = {"task": "qa", "data": _data_record(train_data), "format": data_format, "split": split,
                   "source_model": _model_record(model_path, preset, max_length),
                   "train_examples": len(rows), "windows": len(features), "training_windows": len(items),
                   "window_length": window_length, "doc_stride": doc_stride, "settings": vars(settings),
                   "processes": world_size(), **_training_record(metrics)}
        (directory / "longbird_finetune.json").write_text(json.dumps(summary, indent=2, default=str))

    if is_main_process():  # under torchrun every process trains, the first one writes
        write_directory_atomically(out, write, overwrite=overwrite)
    return {**metrics, "windows": len(features), "training_windows": len(items)}


def evaluate_qa(model_path, data, data_format: str = "korquad2", window_length: int | None = None,
                doc_stride: int | None = None, max_windows: int | None = None, batch_size: int = 4,
                max_examples: int | None = None, out: str | Path | None = None, progress: bool = False,
                split: str | None = None, device: str | None = None, overwrite: bool = False,
                max_answer_tokens: int | None = None, scoring: str = DEFAULT_SCORING) -> dict:
    """Predict every question and score with the official metric of the format. With `out`, writes
    predictions.json ({id: text}) and metrics.json (scores, number of questions, model, data) there atomically.
    `max_answer_tokens` defaults to the model's `qa_max_answer_tokens`; `scoring` ranks spans across windows
    (`qa.SCORING_RULES`)."""
    _check_output(out, overwrite)
    rows, skipped = (data, 0) if isinstance(data, Dataset) else read_qa_data(data, data_format, split)
    rows = sample_questions(rows, max_examples)
    model, tokenizer = load_on_device(model_path, LongBirdForQuestionAnswering, device)
    check_tokenizer(model, tokenizer)
    window_length, doc_stride, window_source = reading_windows(model, model_path, window_length, doc_stride)
    answers = predict_rows(model, tokenizer, rows, window_length, doc_stride, max_windows, batch_size,
                           max_answer_tokens=max_answer_tokens, scoring=scoring, progress=progress)
    predictions = {row["id"]: answers[row["id"]].text if row["id"] in answers else "" for row in rows}
    metrics = score_predictions(predictions, rows, data_format)
    if skipped:  # as the official scripts do, a question we could not read scores 0
        kept = len(rows) / (len(rows) + skipped)
        metrics = {"exact_match": metrics["exact_match"] * kept, "f1": metrics["f1"] * kept,
                   "skipped_questions": skipped}
    if out is not None:
        record = {**metrics, "questions": len(rows), "model": str(model_path), "data": _describe_data(data),
                  "format": data_format, "split": split, "window_length": window_length,
                  "window_source": window_source, "doc_stride": doc_stride, "max_windows": max_windows,
                  "scoring": scoring,
                  "max_answer_tokens": max_answer_tokens or model.config.qa_max_answer_tokens}
        _write_outputs(out, overwrite, predictions, record)
    return {"metrics": metrics, "predictions": predictions, "answers": answers}


def _describe_data(data) -> str | list[str]:
    if isinstance(data, Dataset):
        return f"in-memory dataset of {len(data)} rows"
    return [str(item) for item in data] if isinstance(data, (list, tuple)) else str(data)


def _check_output(out, overwrite: bool) -> None:
    """Fail before the work, not after it, when the output directory may not be written."""
    if out is not None and Path(out).exists() and not overwrite:
        raise FileExistsError(f"output directory {out} already exists; pass --overwrite to replace it")


def _write_outputs(out, overwrite: bool, predictions, metrics: dict) -> None:
    def write(directory: Path) -> None:
        (directory / "predictions.json").write_text(json.dumps(predictions, ensure_ascii=False, indent=1),
                                                    encoding="utf-8")
        (directory / "metrics.json").write_text(json.dumps(metrics, indent=2, ensure_ascii=False), encoding="utf-8")

    if is_main_process():  # under torchrun every process trains, the first one writes
        write_directory_atomically(out, write, overwrite=overwrite)


def score_predictions(predictions: dict[str, str], rows, data_format: str) -> dict[str, float]:
    """Official metric for the format, computed on the same questions the predictions cover."""
    if data_format == "korquad2":
        dataset = [{"qas": [{"id": row["id"], "answer": {"text": row["answers"]["text"][0]}}]} for row in rows]
        return korquad_v2(predictions, dataset)
    dataset = [{"paragraphs": [{"qas": [{"id": row["id"], "answers": [{"text": t} for t in row["answers"]["text"]]}]}]}
               for row in rows]
    return (squad_v1 if data_format == "squad" else korquad_v1)(predictions, dataset)


def per_question_scores(predictions: dict[str, str], rows, data_format: str) -> dict[str, dict[str, float]]:
    """{id: {"exact_match", "f1"}} (0-100) with the official metric of the format, one question at a time: what
    bootstrap intervals resample. Their mean over `rows` equals `score_predictions`."""
    return {row["id"]: score_predictions({row["id"]: predictions.get(row["id"], "")}, [row], data_format)
            for row in rows}


def _classification_rows(data, text_field: str, label_field: str):
    return data if isinstance(data, Dataset) else read_classification(data, text_field, label_field)


def finetune_cls(model_path, train_data, out: str | Path, preset: str = "kobigbird", max_length: int = 4096,
                 window_length: int | None = None, stride: int = 128, text_field: str = "text",
                 label_field: str = "label", settings: FinetuneSettings | None = None, overwrite: bool = False) -> dict:
    """Fine-tune a document classifier; every window of a document is a training item with its label."""
    settings = settings or FinetuneSettings()
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"output directory {out} already exists; pass --overwrite to replace it")
    rows = _classification_rows(train_data, text_field, label_field)
    labels = label_vocabulary(rows["label"])
    if len(labels) < 2:
        raise ValueError(f"classification needs at least two labels; the training data has {labels}")
    set_seed(settings.seed)
    model, tokenizer = load_task_model(model_path, LongBirdForSequenceClassification, preset, max_length,
                                       num_labels=len(labels), id2label=dict(enumerate(labels)),
                                       label2id={label: i for i, label in enumerate(labels)})
    check_tokenizer(model, tokenizer)
    window_length = window_length or model.config.max_position_embeddings
    items = [{**window, "labels": labels.index(str(row["label"]))}
             for row in rows for window in document_windows(tokenizer, row["text"], window_length, stride)]
    metrics = train(model, tokenizer, items, out.parent / f".{out.name}.work", settings,
                    checkpoint_dir=out.parent / f"{out.name}.checkpoints")

    def write(directory: Path) -> None:
        _save_trained(model, directory, settings, model_path, preset, max_length)
        tokenizer.save_pretrained(directory)
        summary = {"task": "classification", "data": _data_record(train_data), "text_field": text_field,
                   "label_field": label_field, "labels": labels,
                   "source_model": _model_record(model_path, preset, max_length), "documents": len(rows),
                   "windows": len(items), "window_length": window_length, "stride": stride,
                   "settings": vars(settings), "processes": world_size(), **_training_record(metrics)}
        (directory / "longbird_finetune.json").write_text(json.dumps(summary, indent=2, default=str))

    if is_main_process():  # under torchrun every process trains, the first one writes
        write_directory_atomically(out, write, overwrite=overwrite)
    return {**metrics, "documents": len(rows), "windows": len(items)}


def _save_trained(model, directory: Path, settings: FinetuneSettings, model_path, preset: str, max_length: int):
    """The whole model, or with --peft tape only what was trained and a reference to the base (training/peft.py)."""
    if settings.peft == "tape":
        save_tape_peft(model, directory, base_record(model_path, preset, max_length))
    else:
        model.save_pretrained(directory)


def _training_record(metrics: dict) -> dict:
    """The training part of a run's summary: Trainer's metrics, the log history and "resume" (null, or from which
    checkpoint and step the run resumed, what it skipped, and that its metrics cover only the steps it trained)."""
    return {"metrics": {k: v for k, v in metrics.items() if k not in ("log_history", "resume")},
            "log_history": metrics["log_history"], "resume": metrics["resume"]}


def _data_record(data) -> list[str] | str:
    """What a run read, for its summary file: the path(s) given, or "in-memory dataset"."""
    if isinstance(data, (str, Path)):
        return str(data)
    if isinstance(data, (list, tuple)):
        return [str(item) for item in data]
    return "in-memory dataset"


def _model_record(model_path, preset: str, max_length: int) -> dict:
    """The model a run started from: a directory or named source, and the conversion used if it was converted."""
    return {"model": str(model_path) if model_path is not None else "minilm (default)", "preset_if_converted": preset,
            "max_length_if_converted": max_length}


@torch.no_grad()
def predict_documents(model, tokenizer, texts, window_length: int | None = None, stride: int = 128) -> list[torch.Tensor]:
    """Per document, the mean of its windows' logits (num_labels,)."""
    model.eval()
    window_length = window_length or model.config.max_position_embeddings
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    collate = PaddedBatches(pad)
    def logits(text):
        batch = collate(document_windows(tokenizer, text, window_length, stride))
        return model(**{name: tensor.to(model.device) for name, tensor in batch.items()}).logits.float().mean(dim=0)

    return [logits(text).cpu() for text in texts]


def evaluate_cls(model_path, data, window_length: int | None = None, stride: int = 128, text_field: str = "text",
                 label_field: str = "label", out: str | Path | None = None, device: str | None = None,
                 overwrite: bool = False) -> dict:
    """Accuracy and macro-F1 of a saved classifier; with `out`, writes predictions.json (per document: index, gold
    label, predicted label, class probabilities) and metrics.json."""
    _check_output(out, overwrite)
    rows = _classification_rows(data, text_field, label_field)
    model, tokenizer = load_on_device(model_path, LongBirdForSequenceClassification, device)
    check_tokenizer(model, tokenizer)
    logits = predict_documents(model, tokenizer, rows["text"], window_length, stride)
    predictions = [model.config.id2label[int(score.argmax())] for score in logits]
    golds = [str(label) for label in rows["label"]]
    metrics = {"accuracy": accuracy(predictions, golds), "macro_f1": macro_f1(predictions, golds)}
    unseen = sorted(set(golds) - set(model.config.id2label.values()))
    if unseen:  # such documents can never be right: the accuracy is bounded below 1 by them
        logger.warning("test labels never seen in training (the model cannot predict them): %s", ", ".join(unseen))
        metrics["unseen_labels"] = unseen
    if out is not None:
        labels = [model.config.id2label[i] for i in range(len(model.config.id2label))]
        records = [{"index": index, "gold": gold, "prediction": prediction,
                    "scores": dict(zip(labels, torch.softmax(score.float(), -1).tolist()))}
                   for index, (gold, prediction, score) in enumerate(zip(golds, predictions, logits))]
        record = {**metrics, "documents": len(golds), "model": str(model_path), "data": _describe_data(data)}
        _write_outputs(out, overwrite, records, record)
    return {"metrics": metrics, "predictions": predictions}


def check_min_probability(min_probability: float) -> None:
    """`answer`'s threshold is a probability; the CLI asks before the model loads, the library on every call."""
    if not 0.0 <= min_probability <= 1.0:
        raise ValueError(f"--min-probability must lie in [0, 1]; got {min_probability}")


def answer(model, document: str, question: str, tokenizer=None, is_html: bool | None = None,
           window_length: int | None = None, device: str | None = None, max_answer_tokens: int | None = None,
           scoring: str = DEFAULT_SCORING, doc_stride: int | None = None, model_dir=None,
           min_probability: float = 0.0, max_question_tokens: int | None = None) -> dict:
    """Answer `question` about `document` (a long text or HTML page, as a string) with a fine-tuned longbird QA model:
    a directory path, or a loaded model with its `tokenizer` (and `model_dir`, where its record lives). Returns
    `qa.answer_record`: the readable answer, the raw span, character offsets into `document`, score and probability
    (all None when no span qualifies), plus `window_length` and `window_source`: unless given, windows are the length
    the model was fine-tuned at (`trained_windows`), else its full length. With `min_probability` > 0 a best span
    whose probability is below it is no answer (all fields None; `best_probability` says how close it came), so a
    caller can tell "not in this document" from a guess. transformers 5 has no question-answering pipeline; this is
    longbird's."""
    from .qa import answer_question, answer_record

    if not question or not question.strip():
        raise ValueError("the question is empty; ask a question about the document")
    check_min_probability(min_probability)
    if isinstance(model, (str, Path)):
        model_dir = model
        model, tokenizer = load_on_device(model, LongBirdForQuestionAnswering, device)
    elif tokenizer is None:
        raise ValueError("a loaded model needs its tokenizer: answer(model, document, question, tokenizer=...)")
    check_tokenizer(model, tokenizer)
    window_length, doc_stride, window_source = reading_windows(model, model_dir, window_length, doc_stride)
    if is_html is None:
        is_html = document.lstrip()[:1] == "<"
    from .data.features import MAX_QUESTION_TOKENS, question_token_count

    max_question_tokens = max_question_tokens or MAX_QUESTION_TOKENS  # a question too long for the window is named
    found = answer_question(model, tokenizer, document, question, is_html, window_length, doc_stride,
                            max_answer_tokens=max_answer_tokens, scoring=scoring,
                            max_question_tokens=max_question_tokens)
    windows = {"window_length": window_length, "window_source": window_source}
    question_tokens = question_token_count(tokenizer, question)
    if question_tokens > max_question_tokens:  # windows read only its start: say so rather than answer in silence
        windows["question_cut"] = {"tokens": question_tokens, "read": max_question_tokens}
    if min_probability > 0 and found is not None:
        if found.probability is None:
            raise ValueError("--min-probability needs the conditional-end head's probability; this model has the "
                             "linear head (qa_head='linear'): leave --min-probability out")
        if found.probability < min_probability:
            return answer_record(None, is_html) | windows | {"best_probability": found.probability}
    return answer_record(found, is_html) | windows


def distill(teacher_source, output_dir: str | Path, student_path=None, preset: str = "littlebird",
            max_length: int = 4096, corpus=None, length: int | None = None, settings: FinetuneSettings | None = None,
            alpha: float = 1.0, beta: float = 1.0, temperature: float = 1.0, save_steps: int = 50,
            resume: bool = False, gradient_checkpointing: bool = False, overwrite: bool = False, rss: bool = False,
            **overrides: Any) -> dict:
    """Distil the short `teacher_source` into a long student (LittleBird §3.4, step 2) on short corpus windows.

    The student is `student_path` (a longbird directory) or the teacher converted with `preset`, `max_length` and
    config `overrides` (e.g. pack_size=0). With `rss` the student learns Recurring Span Selection at the same time
    (the paper's pretraining objective; loss = RSS + β·attention KL) and is saved as a span-selection model that
    `longbird pretrain` continues. Writes `output_dir`/model (student + tokenizer, atomically) and
    `output_dir`/model/longbird_distill.json; Trainer checkpoints go to `output_dir`/checkpoints, from which `resume`
    continues."""
    from .data.corpus import corpus_split, corpus_windows, text_hash
    from .heads import LongBirdForSpanSelection
    from .training.distill import load_teacher, run_distillation
    from .training.rss import QUESTION_TOKEN, RSSCollator, add_question_token, rss_examples

    settings = settings or FinetuneSettings()
    output_dir = Path(output_dir)
    model_dir = output_dir / "model"
    if model_dir.exists() and not overwrite:
        raise FileExistsError(f"{model_dir} already exists; pass --overwrite to replace it")
    teacher_dir = resolve_model_directory(teacher_source)
    teacher = load_teacher(teacher_dir)
    set_seed(settings.seed)
    if rss:
        student, tokenizer = load_task_model(student_path or teacher_dir, LongBirdForSpanSelection, preset,
                                             max_length, **overrides)
    else:
        tokenizer = AutoTokenizer.from_pretrained(student_path or teacher_dir, local_files_only=True)
        student = (AutoModelForMaskedLM.from_pretrained(student_path) if student_path and _has_lm_head(student_path)
                   else AutoModel.from_pretrained(student_path) if student_path
                   else convert(teacher, preset=preset, max_length=max_length, **overrides))
    source_length = student.config.source_max_positions
    length = length or source_length
    if length > source_length:
        raise ValueError(f"--length {length} is above the teacher's {source_length} tokens: distillation reads short "
                         f"inputs the teacher sees whole; use at most {source_length}")
    documents = corpus_split(corpus)[0]
    collator, teacher_ids = None, None
    if rss:
        new = QUESTION_TOKEN not in tokenizer.get_vocab()
        question_id = add_question_token(tokenizer, student)
        stand_in = tokenizer.mask_token_id if tokenizer.mask_token_id is not None else tokenizer.unk_token_id
        if new:  # [QUESTION] starts as what the teacher reads in its place (a trained row is kept)
            with torch.no_grad():
                student.get_input_embeddings().weight[question_id] = student.get_input_embeddings().weight[stand_in]
        windows = rss_examples(documents, tokenizer, length, settings.seed)
        collator, teacher_ids = RSSCollator(tokenizer.pad_token_id or 0), {question_id: stand_in}
    else:
        windows = corpus_windows(documents, tokenizer, length)
    tokenizer.model_max_length = student.config.max_position_embeddings
    metrics = run_distillation(student.train(), teacher, tokenizer, windows, output_dir, settings, alpha, beta,
                               temperature, save_steps, resume, gradient_checkpointing, collator, teacher_ids)
    summary = {"teacher": str(teacher_dir), "student": str(student_path) if student_path else f"{preset}-{max_length}",
               "overrides": overrides, "objective": "rss + attention" if rss else "attention (+ soft targets)",
               "corpus": _corpus_record(corpus), "training_document_sha256": [text_hash(d) for d in documents],
               "windows": len(windows), "length": length, "alpha": alpha,
               "beta": beta, "temperature": temperature, "settings": vars(settings), "processes": world_size(),
               **_training_record(metrics)}

    _write_trained_model(model_dir, student, tokenizer, "longbird_distill.json", summary, overwrite, settings,
                         (student_path or teacher_source, preset, max_length))
    return {**metrics, "windows": len(windows), "model_dir": str(model_dir)}


def _corpus_record(corpus) -> list[str] | str:
    if corpus is None:
        return "default Korean corpus (longbird.data.corpus.default_corpus)"
    return [str(p) for p in (corpus if isinstance(corpus, (list, tuple)) else [corpus])]


def _write_trained_model(directory: Path, model, tokenizer, summary_name: str, summary: dict, overwrite: bool,
                         settings: FinetuneSettings, base: tuple) -> None:
    """Model (or with --peft tape what was trained, `base` = (model_path, preset, max_length) naming the rest),
    tokenizer and the run's summary, atomically; under torchrun every process trains, the first writes."""
    def write(target: Path) -> None:
        _save_trained(model, target, settings, *base)
        tokenizer.save_pretrained(target)
        (target / summary_name).write_text(json.dumps(summary, indent=2, default=str))

    if is_main_process():
        write_directory_atomically(directory, write, overwrite=overwrite)


def _has_lm_head(path) -> bool:
    config = json.loads((resolve_model_directory(path) / "config.json").read_text(encoding="utf-8"))
    return config.get("lm_head_act") is not None


def rss_accuracy(model, items: list[dict], batch_size: int = 4) -> float:
    """Exact match (%) of the selected span (start, then end given it) over every `[QUESTION]` of `items`."""
    from .training.rss import IGNORE_INDEX, RSSCollator

    collate = RSSCollator(model.config.pad_token_id or 0)
    model.eval()
    hits = total = 0
    with torch.no_grad():
        for first in range(0, len(items), batch_size):
            batch = collate(items[first:first + batch_size])
            out = model(input_ids=batch["input_ids"].to(model.device),
                        attention_mask=batch["attention_mask"].to(model.device),
                        question_positions=batch["question_positions"].to(model.device))
            real = batch["start_positions"] != IGNORE_INDEX
            hit = (out.predicted_start.cpu() == batch["start_positions"]) & (out.predicted_end.cpu() == batch["end_positions"])
            hits += int((hit & real).sum())
            total += int(real.sum())
    return 100.0 * hits / max(total, 1)


def pretrain(model_path, output_dir: str | Path, corpus=None, length: int = 512, preset: str = "littlebird",
             max_length: int = 4096, settings: FinetuneSettings | None = None, held_out: float = 0.1,
             overwrite: bool = False, gradient_checkpointing: bool = False, **overrides: Any) -> dict:
    """Continued training on long inputs with Recurring Span Selection (LittleBird §3.4 step 3, §4.1).

    `model_path`: a longbird directory (e.g. `longbird distill`'s model) or a source converted with `preset`. Corpus
    documents are split into training and held-out ones (`held_out`; the default corpus has its own held-out articles);
    RSS accuracy on the held-out windows is reported before and after. `overrides` are config fields used when
    `model_path` is converted. Writes `output_dir`/model atomically; checkpoints go to `output_dir`/checkpoints."""
    from .data.corpus import corpus_split, text_hash
    from .heads import LongBirdForSpanSelection
    from .training.rss import RSSCollator, add_question_token, rss_examples

    settings = settings or FinetuneSettings()
    output_dir = Path(output_dir)
    model_dir = output_dir / "model"
    if model_dir.exists() and not overwrite:
        raise FileExistsError(f"{model_dir} already exists; pass --overwrite to replace it")
    set_seed(settings.seed)
    model, tokenizer = load_task_model(model_path, LongBirdForSpanSelection, preset, max_length, **overrides)
    if gradient_checkpointing:
        enable_checkpointing(model)
    if length > model.config.max_position_embeddings:
        raise ValueError(f"--length {length} is above the model's {model.config.max_position_embeddings} tokens")
    add_question_token(tokenizer, model)
    training, held = corpus_split(corpus, held_out)
    train_items = rss_examples(training, tokenizer, length, settings.seed)
    held_items = rss_examples(held, tokenizer, length, settings.seed) if held else []
    before = rss_accuracy(model, held_items) if held_items else None
    metrics = train(model.train(), tokenizer, train_items, output_dir / ".work", settings,
                    checkpoint_dir=output_dir / "checkpoints",
                    collator=RSSCollator(tokenizer.pad_token_id or 0))
    after = rss_accuracy(model, held_items) if held_items else None
    summary = {"model": str(model_path), "corpus": _corpus_record(corpus), "length": length,
               "training_document_sha256": [text_hash(d) for d in training],
               "held_out_document_sha256": [text_hash(d) for d in held],
               "train_windows": len(train_items), "held_out_windows": len(held_items),
               "held_out_rss_accuracy_before": before, "held_out_rss_accuracy_after": after,
               "settings": vars(settings), "processes": world_size(), **_training_record(metrics)}
    tokenizer.model_max_length = model.config.max_position_embeddings

    _write_trained_model(model_dir, model, tokenizer, "longbird_pretrain.json", summary, overwrite, settings,
                         (model_path, preset, max_length))
    return {**{k: v for k, v in metrics.items() if k != "log_history"}, "train_windows": len(train_items),
            "held_out_windows": len(held_items), "rss_accuracy_before": before, "rss_accuracy_after": after,
            "model_dir": str(model_dir)}
