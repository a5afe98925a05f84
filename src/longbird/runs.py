"""What a run writes and where: the output-directory rule (refuse an existing one unless --overwrite, checked before
the work), the trained model with its tokenizer and the run's summary JSON written in one atomic directory, and the
records a summary holds (data, corpus, source model, training metrics). Under torchrun every process trains and the
first one writes.
"""

from __future__ import annotations

import json
from pathlib import Path

from datasets import Dataset

from .checkpoints import base_record, save_tape_peft
from .files import check_not_read, check_writable, write_directory_atomically
from .sources import saved_config
from .training.finetune import FinetuneSettings
from .training.processes import is_main_process


def check_output(out, overwrite: bool, reads=()) -> None:
    """Fail before the work, not after it, when the output directory may not be written: it exists (without
    --overwrite), or it is, holds or lies inside a directory the run reads (`reads`: the model, the teacher), which
    --overwrite would replace while the run reads it."""
    if out is None:
        return
    check_not_read(out, reads)  # first: --overwrite would not help there
    check_writable(out, overwrite)

def write_outputs(out, overwrite: bool, predictions, metrics: dict) -> None:
    def write(directory: Path) -> None:
        (directory / "predictions.json").write_text(json.dumps(predictions, ensure_ascii=False, indent=1),
                                                    encoding="utf-8")
        (directory / "metrics.json").write_text(json.dumps(metrics, indent=2, ensure_ascii=False), encoding="utf-8")

    if is_main_process():  # under torchrun every process trains, the first one writes
        write_directory_atomically(out, write, overwrite=overwrite)

def write_trained_model(directory: Path, model, tokenizer, summary_name: str, summary: dict, overwrite: bool,
                         settings: FinetuneSettings, base: tuple) -> None:
    """Model (or with --peft tape what was trained, `base` = (model_path, preset, max_length) naming the rest),
    tokenizer and the run's summary, atomically; under torchrun every process trains, the first writes."""
    def write(target: Path) -> None:
        save_trained(model, target, settings, *base)
        tokenizer.save_pretrained(target)
        (target / summary_name).write_text(json.dumps(summary, indent=2, default=str))

    if is_main_process():
        write_directory_atomically(directory, write, overwrite=overwrite)

def save_trained(model, directory: Path, settings: FinetuneSettings, model_path, preset: str, max_length: int):
    """The whole model, or with --peft tape only what was trained and a reference to the base (training/peft.py)."""
    if settings.peft == "tape":
        save_tape_peft(model, directory, base_record(model_path, preset, max_length))
    else:
        model.save_pretrained(directory)

def training_record(metrics: dict) -> dict:
    """The training part of a run's summary: Trainer's metrics, the log history and "resume" (null, or from which
    checkpoint and step the run resumed, what it skipped, and that its metrics cover only the steps it trained)."""
    return {"metrics": {k: v for k, v in metrics.items() if k not in ("log_history", "resume")},
            "log_history": metrics["log_history"], "resume": metrics["resume"]}

def data_record(data) -> list[str] | str:
    """What a run read, for its summary file: the path(s) given, or "in-memory dataset"."""
    if isinstance(data, (str, Path)):
        return str(data)
    if isinstance(data, (list, tuple)):
        return [str(item) for item in data]
    return "in-memory dataset"

def describe_data(data) -> str | list[str]:
    if isinstance(data, Dataset):
        return f"in-memory dataset of {len(data)} rows"
    return [str(item) for item in data] if isinstance(data, (list, tuple)) else str(data)

def corpus_record(corpus) -> list[str] | str:
    if corpus is None:
        return "default Korean corpus (longbird.data.corpus.default_corpus)"
    return [str(p) for p in (corpus if isinstance(corpus, (list, tuple)) else [corpus])]

def model_record(model_path, preset: str, max_length: int) -> dict:
    """The model a run started from: a directory or named source, and the conversion used if it was converted (None
    for a longbird model, which is loaded as it is: --preset and --max-length did not apply)."""
    longbird = (model_path is not None and (Path(model_path) / "config.json").is_file()  # not a named source
                and saved_config(model_path).get("model_type") == "longbird")
    return {"model": str(model_path) if model_path is not None else "minilm (default)",
            "preset_if_converted": None if longbird else preset, "max_length_if_converted": None if longbird else
            max_length}
