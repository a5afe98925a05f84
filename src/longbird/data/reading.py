"""Reading a user's input file with errors that name the file and the fix (missing, empty, binary, not JSON,
the wrong one of the QA formats), instead of UnicodeDecodeError / StopIteration / JSONDecodeError; and what makes a
text given directly (a question, a document sent to the server) unreadable."""

from __future__ import annotations

import codecs
import json
import unicodedata
from pathlib import Path

QA_FORMAT_HINT = "use --format korquad2 (KorQuAD 2.x pages), korquad1 / squad (paragraphs) or korquad1-articles"


def read_text_file(path: str | Path, what: str = "file") -> str:
    """The file's text: UTF-8, or UTF-16 with its byte-order mark (a UTF-8 mark is dropped, as editors do not show
    it); one-line errors for a missing, empty or binary file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    if path.is_dir():
        raise IsADirectoryError(f"{what} {path} is a directory; give a file")
    data = path.read_bytes()
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # Windows editors' "Unicode" text
        try:
            data = data.decode("utf-16").encode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{what} {path} starts as UTF-16 text but is not (invalid byte at offset "
                             f"{error.start}); re-save it as UTF-8") from None
    data = data.removeprefix(codecs.BOM_UTF8)
    if not data.strip():
        raise ValueError(f"{what} {path} is empty")
    if b"\x00" in data[:8192]:
        raise ValueError(f"{what} {path} is a binary file, not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{what} {path} is not UTF-8 text (invalid byte at offset {error.start}); "
                         "re-save it as UTF-8") from None


def read_json_file(path: str | Path, what: str = "file"):
    """The parsed JSON document; a JSON Lines file or invalid JSON is named as such."""
    text = read_text_file(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        if _looks_like_json_lines(text):
            raise ValueError(f"{what} {path} is JSON Lines (one record per line), not one JSON document; JSON Lines "
                             "is a classification format (finetune-cls / evaluate --task classification)") from None
        raise ValueError(f"{what} {path} is not valid JSON: {error.msg} at line {error.lineno}, column "
                         f"{error.colno}") from None


def _looks_like_json_lines(text: str) -> bool:
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        return len(lines) > 1 and all(isinstance(json.loads(line), dict) for line in lines[:5])
    except json.JSONDecodeError:
        return False


def qa_format_of(document) -> str | None:
    """Which QA format a parsed JSON document looks like: 'korquad2', 'squad' (KorQuAD 1.0 / SQuAD) or None."""
    if not isinstance(document, dict) or not isinstance(document.get("data"), list) or not document["data"]:
        return None
    first = document["data"][0]
    if not isinstance(first, dict):
        return None
    if "paragraphs" in first:
        return "squad"
    if "context" in first and "qas" in first:
        return "korquad2"
    return None


def check_qa_format(document, path, expected: str, requested: str) -> None:
    """Raise a one-line error when a QA file is in another format than the one asked for."""
    found = qa_format_of(document)
    if found == expected:
        return
    if found == "squad":
        raise ValueError(f"{path} is a KorQuAD 1.0 / SQuAD file (articles with 'paragraphs'), not {requested}; "
                         "use --format korquad1 (paragraphs) or korquad1-articles (whole articles)")
    if found == "korquad2":
        raise ValueError(f"{path} is a KorQuAD 2.x file (pages with 'context' and 'qas'), not {requested}; "
                         "use --format korquad2")
    raise ValueError(f"{path} is not {requested} JSON: expected an object with a non-empty 'data' list; "
                     f"{QA_FORMAT_HINT}")


# characters that show nothing: Hangul fillers (default-ignorable, yet letters to Unicode) besides the categories below
INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0")


def text_problem(text: str, fix: str) -> str | None:
    """What makes `text` unreadable, said so that it follows its name ("the question ...", "document: ..."), or None:
    nothing visible in it (whitespace, control and format characters such as zero-width spaces and byte-order marks,
    Hangul fillers: a document of them was "answered" with a BOM), then `fix`; or a lone surrogate (not Unicode: the
    tokenizer fails on it with a TypeError)."""
    visible = next((char for char in text if not (char.isspace() or char in INVISIBLE
                                                  or unicodedata.category(char) in ("Cc", "Cf"))), None)
    if visible is None:
        return f"is empty (nothing but whitespace or invisible characters); {fix}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return (f"holds a lone surrogate ({text[error.start]!r} at character {error.start}), which is not Unicode "
                "text: a JSON escape such as \\ud800 without its pair, or text decoded wrongly; remove it")
    return None
