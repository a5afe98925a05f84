"""Document classification as a task: fine-tune on every window of each document, evaluate by the mean of a
document's window logits (accuracy, macro-F1)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from datasets import Dataset, concatenate_datasets
from transformers import set_seed

from ..checkpoints import check_tokenizer, load_on_device, load_task_model, training_window
from ..data.classification import checked_records, document_windows, label_vocabulary, read_classification
from ..heads import LongBirdForSequenceClassification
from ..metrics.classification import accuracy, macro_f1
from ..precision import bf16_autocast
from ..reader import classification_windows, default_stride, predict_documents
from ..runs import (
    check_output,
    data_record,
    describe_data,
    model_record,
    training_record,
    write_outputs,
    write_trained_model,
)
from ..sources import resolve_model_directory, saved_config
from ..training.finetune import FinetuneSettings, train
from ..training.processes import world_size

logger = logging.getLogger(__name__)


def _classification_rows(data, text_field: str, label_field: str):
    """`text` and `label` (as text) of a Dataset, a file, or several files read as one dataset in their order."""
    if isinstance(data, Dataset):
        return checked_records(data, text_field, label_field, "the dataset")
    if isinstance(data, (list, tuple)):
        return concatenate_datasets([read_classification(path, text_field, label_field) for path in data])
    return read_classification(data, text_field, label_field)


def model_labels(id2label: dict, data_labels=()) -> list[str]:
    """A classifier's labels by class id (`id2label`: class id -> name). transformers' default names (LABEL_0,
    LABEL_1, ...) are its class ids "0", "1", ... (what integer labels in data are read as), unless the data's labels
    are those very names."""
    names = [str(id2label[i]) for i in range(len(id2label))]
    defaults = names == [f"LABEL_{i}" for i in range(len(names))]
    return [str(i) for i in range(len(names))] if defaults and not set(data_labels) <= set(names) else names


def _training_labels(model_path, data_labels: list[str]) -> list[str]:
    """The labels by class id a run trains: a saved classifier's own order when the data's labels are among them (a
    fresh sorted order swapped its classes' meanings), else the data's labels sorted (`label_vocabulary`); a saved
    classifier whose labels the data does not fit is refused."""
    path = resolve_model_directory(model_path) if model_path is not None else None
    config = saved_config(path) if path is not None else {}
    if config.get("model_type") != "longbird" or "LongBirdForSequenceClassification" not in (
            config.get("architectures") or []):
        return data_labels
    # transformers leaves the default names (two of them unless num_labels says) out of config.json
    id2label = config.get("id2label") or {i: f"LABEL_{i}" for i in range(config.get("num_labels", 2))}
    labels = model_labels({int(i): name for i, name in id2label.items()}, data_labels)
    unknown = sorted(set(data_labels) - set(labels))
    if unknown:
        raise ValueError(f"{model_path} is a classifier of {labels}; the training data has labels it does not know: "
                         f"{unknown}. Train from the model it was converted from for a new set of labels, or "
                         "relabel the data")
    return labels


def finetune_cls(model_path, train_data, out: str | Path, *, preset: str = "kobigbird", max_length: int = 4096,
                 window_length: int | None = None, stride: int | None = None, text_field: str = "text",
                 label_field: str = "label", settings: FinetuneSettings | None = None, overwrite: bool = False) -> dict:
    """Fine-tune a document classifier; every window of a document is a training item with its label. `stride`:
    tokens shared by neighbouring windows (default `reader.default_stride`: 128, a quarter of a short window)."""
    settings = settings or FinetuneSettings()
    out = Path(out)
    check_output(out, overwrite, reads=(model_path,))
    rows = _classification_rows(train_data, text_field, label_field)
    labels = _training_labels(model_path, label_vocabulary(rows["label"]))
    if len(labels) < 2:
        raise ValueError(f"classification needs at least two labels; the training data has {labels}")
    set_seed(settings.seed)
    model, tokenizer = load_task_model(model_path, LongBirdForSequenceClassification, preset, max_length,
                                       num_labels=len(labels), id2label=dict(enumerate(labels)),
                                       label2id={label: i for i, label in enumerate(labels)})
    check_tokenizer(model, tokenizer)
    window_length = training_window(model, window_length)
    stride = default_stride(window_length) if stride is None else stride
    index = {label: i for i, label in enumerate(labels)}
    items = [{**window, "labels": index[row["label"]]}
             for row in rows for window in document_windows(tokenizer, row["text"], window_length, stride)]
    # the checkpoints carry the window too: evaluate and serve read one at the window it was trained at
    metrics = train(model, tokenizer, items, out.parent / f".{out.name}.work", settings,
                    checkpoint_dir=out.parent / f"{out.name}.checkpoints",
                    checkpoint_record={"task": "classification", "window_length": window_length, "stride": stride},
                    run_settings={"window_length": window_length, "stride": stride})

    summary = {"task": "classification", "data": data_record(train_data), "text_field": text_field,
               "label_field": label_field, "labels": labels,
               "source_model": model_record(model_path, preset, max_length), "documents": len(rows),
               "windows": len(items), "window_length": window_length, "stride": stride,
               "settings": vars(settings), "processes": world_size(), **training_record(metrics)}
    write_trained_model(out, model, tokenizer, "longbird_finetune.json", summary, overwrite, settings,
                        (model_path, preset, max_length))
    return {**metrics, "documents": len(rows), "windows": len(items)}

def evaluate_cls(model_path, data, *, window_length: int | None = None, stride: int | None = None,
                 text_field: str = "text", label_field: str = "label", out: str | Path | None = None,
                 device: str | None = None, overwrite: bool = False, bf16: bool = False) -> dict:
    """Accuracy and macro-F1 of a saved classifier on `data` (a file, several files or a Dataset); with `out`, writes
    predictions.json (per document: index, gold label, predicted label, class probabilities) and metrics.json.
    Windows: the trained window and stride unless given (`reader.classification_windows`), as the server's
    /classify reads. `bf16`: read under bf16 autocast with the encoder's Linear weights stored in bf16
    (`precision.store_encoder_linears_in`)."""
    check_output(out, overwrite, reads=(model_path,))
    rows = _classification_rows(data, text_field, label_field)
    model, tokenizer = load_on_device(model_path, LongBirdForSequenceClassification, device, bf16=bf16)
    check_tokenizer(model, tokenizer)
    window_length, stride, window_source = classification_windows(model, model_path, window_length, stride)
    with bf16_autocast(model.device.type, bf16):
        logits = predict_documents(model, tokenizer, rows["text"], window_length, stride)
    golds = list(rows["label"])
    labels = model_labels(model.config.id2label, golds)
    predictions = [labels[int(score.argmax())] for score in logits]
    metrics = {"accuracy": accuracy(predictions, golds), "macro_f1": macro_f1(predictions, golds)}
    unseen = sorted(set(golds) - set(labels))
    if unseen:  # such documents can never be right: the accuracy is bounded below 1 by them
        logger.warning("test labels never seen in training (the model cannot predict them): %s", ", ".join(unseen))
        metrics["unseen_labels"] = unseen
    if out is not None:
        records = [{"index": index, "gold": gold, "prediction": prediction,
                    "scores": dict(zip(labels, torch.softmax(score.float(), -1).tolist()))}
                   for index, (gold, prediction, score) in enumerate(zip(golds, predictions, logits))]
        record = {**metrics, "documents": len(golds), "model": str(model_path), "data": describe_data(data),
                  "window_length": window_length, "stride": stride, "window_source": window_source}
        write_outputs(out, overwrite, records, record)
    return {"metrics": metrics, "predictions": predictions}
