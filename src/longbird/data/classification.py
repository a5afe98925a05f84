"""Long-document classification data: JSONL or CSV records with a text and a label.

Documents longer than the window are split into overlapping windows. Training labels every window with its
document's label; prediction averages the windows' logits (mean pooling), so a document gets one score per
class whatever its length. With a window as long as the model (4096 tokens for the default conversion)
most documents are a single window, which is the point of a long model.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path

from datasets import Dataset

from ..data.korquad import MalformedRecordError
from ..quiet import silenced
from .reading import read_text_file
from .window_limit import check_window_limit


def read_classification(path: str | Path, text_field: str = "text", label_field: str = "label") -> Dataset:
    """Read a .jsonl/.json or .csv file with one document per record; every record needs both fields."""
    path = Path(path)
    if path.suffix not in (".jsonl", ".json", ".csv", ".tsv"):
        raise ValueError(f"unsupported classification file {path.name}: use .jsonl, .json, .csv or .tsv")
    read_text_file(path, "classification data file")  # missing, empty, binary or non-UTF-8: named here
    if path.read_bytes()[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):  # the loaders below read UTF-8 only
        raise ValueError(f"classification data file {path} is UTF-16 text; re-save it as UTF-8")
    try:
        with silenced(("datasets",)):  # its loader logs the parse error before raising: said once, below
            if path.suffix in (".jsonl", ".json"):
                dataset = Dataset.from_json(str(path))
            else:
                dataset = Dataset.from_csv(str(path), sep="\t" if path.suffix == ".tsv" else ",")
    except Exception as error:  # pyarrow/pandas parse errors carry no file name
        kind = ("JSON Lines (one JSON object per line)" if path.suffix in (".jsonl", ".json")
                else path.suffix[1:].upper())
        while error.__cause__ is not None:  # the parser's words, not "An error occurred while generating the dataset"
            error = error.__cause__
        said = str(error).splitlines()[0] if str(error) else type(error).__name__
        if path.suffix in (".jsonl", ".json"):  # pyarrow counts rows from 0: say the line, counted from 1
            said = re.sub(r"in row (\d+)", lambda row: f"on line {int(row.group(1)) + 1}", said)
        raise ValueError(f"classification data file {path} is not valid {kind}: {said}") from None
    return checked_records(dataset, text_field, label_field, path.name)


def checked_records(dataset: Dataset, text_field: str, label_field: str, name: str) -> Dataset:
    """The records as a Dataset of two string columns, `text` and `label` (what the classification tasks read, and
    what several files of different formats concatenate as); one-line errors, counting records from 1, for a missing
    field, an empty text and a label that is not one class: a list (multi-label), or a number that is not whole.
    Labels are text: 1 and 1.0 are the class "1"."""
    for field in (text_field, label_field):
        if field not in dataset.column_names:
            option = "--text-field" if field == text_field else "--label-field"
            raise MalformedRecordError(f"{name} has no {field!r} field; its fields are {dataset.column_names}: "
                                       f"name the {'text' if field == text_field else 'label'} field with {option}")
    labels = []
    for number, (text, label) in enumerate(zip(dataset[text_field], dataset[label_field]), start=1):
        if not isinstance(text, str) or not text.strip():
            raise MalformedRecordError(f"record {number} of {name}: {text_field!r} must be non-empty text")
        if label is None:
            raise MalformedRecordError(f"record {number} of {name}: {label_field!r} is missing")
        if isinstance(label, float) and label.is_integer():
            label = int(label)
        if isinstance(label, bool) or not isinstance(label, (str, int)):
            raise MalformedRecordError(
                f"record {number} of {name}: {label_field!r} is {label!r}; a label is one class, text or a whole "
                "number (several labels per document, multi-label, are trained with transformers' Trainer and "
                "problem_type='multi_label_classification': docs/classification.md)")
        labels.append(str(label))
    return Dataset.from_dict({"text": list(dataset[text_field]), "label": labels})


def label_vocabulary(labels) -> list[str]:
    """The labels as strings, in order: integer labels by their value (class id i is label i where the labels are
    0..n-1; sorted as strings "10" came before "2"), any others alphabetically."""
    names = {str(label) for label in labels}
    if all(name.lstrip("-").isdigit() for name in names):
        return sorted(names, key=int)
    return sorted(names)


def document_windows(tokenizer, text: str, max_length: int, stride: int = 128,
                     window_limit: int | None = None) -> list[dict]:
    """Model inputs for the windows of one document (`stride` tokens shared by neighbours); `window_limit`:
    window_limit.TooManyWindows, before any is built, for a document that makes more."""
    special = tokenizer.num_special_tokens_to_add(pair=False)
    room = max_length - special
    if room < 1:
        raise ValueError(f"windows of {max_length} tokens hold no text after their {special} special tokens; use "
                         f"windows of at least {special + 1} tokens")
    if not 0 <= stride < room:
        raise ValueError(f"the stride ({stride}) must lie in 0..{room - 1}: a window of {max_length} tokens holds "
                         f"{room} of the text; give a smaller stride")
    if window_limit is not None:
        check_window_limit(tokenizer, text, max_length, room, stride, window_limit)
    encoded = tokenizer(text, truncation=True, max_length=max_length, stride=stride, return_overflowing_tokens=True)
    windows = []
    for index in range(len(encoded["input_ids"])):
        window = {"input_ids": encoded["input_ids"][index], "attention_mask": encoded["attention_mask"][index]}
        if "token_type_ids" in encoded:
            window["token_type_ids"] = encoded["token_type_ids"][index]
        windows.append(window)
    return windows
