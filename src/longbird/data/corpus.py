"""Plain-text corpora for distillation and continued training: files, directories or JSON Lines ({"text": ...}),
cut into training windows of whole token sequences ([CLS] tokens [SEP], or the tokenizer's own specials).

The default corpus is the Korean text shipped with the package (resources/konlpy-corpus: the constitution and ten
National Assembly bills), so `longbird distill` runs on a fresh clone without data.
"""

from __future__ import annotations

import json
from pathlib import Path

from .reading import read_text_file

DEFAULT_CORPUS = Path(__file__).resolve().parents[1] / "resources" / "konlpy-corpus"
TEXT_SUFFIXES = (".txt", ".md")


def corpus_files(paths) -> list[Path]:
    """The text and JSONL files under `paths` (files or directories, sorted), with a clear error for none."""
    files: list[Path] = []
    for path in [Path(p) for p in (paths if isinstance(paths, (list, tuple)) else [paths])]:
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES + (".jsonl",))
            if not found:
                raise FileNotFoundError(f"corpus directory {path} holds no .txt, .md or .jsonl files")
            files += found
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"corpus file {path} does not exist")
    return files


def corpus_documents(paths) -> list[str]:
    """One string per document: a text file is one document, a JSONL file one per line (its "text" field)."""
    documents = []
    for file in corpus_files(paths):
        text = read_text_file(file, "corpus file")
        if file.suffix != ".jsonl":
            documents.append(text)
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"corpus file {file}, line {number}: not a JSON object") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"corpus file {file}, line {number}: expected an object with a \"text\" string")
            documents.append(record["text"])
    return documents


def window_ends(tokenizer) -> tuple[int | None, int | None]:
    """The ids that open and close a window: [CLS]/[SEP] (BERT) or <s>/</s> (RoBERTa-family), None where absent."""
    first = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    last = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    return first, last


def corpus_windows(documents: list[str], tokenizer, length: int) -> list[dict]:
    """Every document cut into consecutive windows of at most `length` tokens including the special tokens."""
    first, last = window_ends(tokenizer)
    room = length - sum(token is not None for token in (first, last))
    if room < 1:
        raise ValueError(f"windows of {length} tokens leave no room for text")
    windows = []
    for document in documents:
        ids = tokenizer(document, add_special_tokens=False, verbose=False)["input_ids"]
        for start in range(0, len(ids), room):
            piece = ([first] if first is not None else []) + ids[start:start + room] + ([last] if last is not None else [])
            windows.append({"input_ids": piece, "attention_mask": [1] * len(piece)})
    if not windows:
        raise ValueError("the corpus holds no text")
    return windows
