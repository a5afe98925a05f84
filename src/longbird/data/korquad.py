"""KorQuAD readers: 2.x pages (HTML contexts); 1.0 / SQuAD 1.1 as paragraphs or as whole-article contexts.

Both give a `datasets.Dataset` with one row per question, SQuAD-style:
``{id, title, question, context, is_html, answers: {text: [...], answer_start: [...]}}``.
A record whose answer offsets do not match its context is reported (id and reason) and skipped; a record
missing a field raises an error naming the record.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path

from datasets import Dataset, DatasetDict

from .reading import check_qa_format, read_json_file

logger = logging.getLogger(__name__)
V2_QA_FIELDS = ("question", "id", "answer")
V2_ANSWER_FIELDS = ("text", "answer_start")
WHOLE_ARTICLE_SEPARATOR = "\n\n"


class MalformedRecordError(ValueError):
    pass


@dataclass(frozen=True)
class SkippedRecord:
    id: str
    reason: str


def _json_files(path) -> list[Path]:
    if isinstance(path, (list, tuple)):
        return [file for item in path for file in _json_files(item)]
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.json"))
        if not files:
            raise FileNotFoundError(f"no *.json files in {path}")
        return files
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    return [path]


# The JSON type each field must have where present (an answer_start that is not an integer skips its record instead)
FIELD_TYPES = {"title": "a string", "context": "a string", "paragraphs": "an array", "qas": "an array",
               "id": "a string or a number", "question": "a string", "answer": "an object", "answers": "an array",
               "text": "a string"}
JSON_TYPES = ((bool, "boolean"), (dict, "object"), (list, "array"), (str, "string"), ((int, float), "number"))


def _json_type(value) -> str:
    return "null" if value is None else next(name for kind, name in JSON_TYPES if isinstance(value, kind))


def _require(record, fields, where: str) -> None:
    """MalformedRecordError naming the record unless it is an object holding `fields`, each of its FIELD_TYPES."""
    if not isinstance(record, dict):
        raise MalformedRecordError(f"malformed record {where}: a JSON {_json_type(record)} where an object is "
                                   "expected; fix or remove that record")
    missing = [name for name in fields if name not in record]
    if missing:
        raise MalformedRecordError(f"malformed record {where}: missing field(s) {missing}; fix or remove that record")
    wrong = [f"{name} is a JSON {_json_type(record[name])}, not {FIELD_TYPES[name]}" for name in fields
             if name in FIELD_TYPES and f" {_json_type(record[name])}" not in FIELD_TYPES[name]]
    if wrong:
        raise MalformedRecordError(f"malformed record {where}: {'; '.join(wrong)}; fix or remove that record")


def _name(record, key: str = "id") -> str:
    """A record's id (or title) for an error message, '?' where it has none (or is not an object)."""
    return str(record.get(key, "?")) if isinstance(record, dict) else "?"


def _offset_problem(context: str, text: str, start) -> str | None:
    if not isinstance(start, int) or start < 0:
        return f"answer_start {start!r} is not a non-negative integer"
    found = context[start:start + len(text)]
    if found != text:
        return f"context[{start}:{start + len(text)}] is {found[:40]!r}, not the answer {text[:40]!r}"
    return None


def read_korquad_v2(path) -> tuple[Dataset, list[SkippedRecord]]:
    """Read KorQuAD 2.x JSON (a file, a directory of *.json files, or a list of either).
    Returns (questions, skipped records)."""
    rows, skipped = [], []
    for file in _json_files(path):
        documents = read_json_file(file, "dataset file")
        check_qa_format(documents, file, "korquad2", "KorQuAD 2.x")
        for index, document in enumerate(documents["data"]):
            _require(document, ("title", "context", "qas"), f"data[{index}] in {file.name}")
            for qa in document["qas"]:
                where = f"{_name(qa)} (document {document['title']!r}, {file.name})"
                _require(qa, V2_QA_FIELDS, where)
                _require(qa["answer"], V2_ANSWER_FIELDS, f"{where}: answer")
                answer = qa["answer"]
                problem = _offset_problem(document["context"], answer["text"], answer["answer_start"])
                if problem:
                    skipped.append(SkippedRecord(str(qa["id"]), problem))
                    continue
                rows.append({
                    "id": str(qa["id"]), "title": document["title"], "question": qa["question"],
                    "context": document["context"], "is_html": True,
                    "answers": {"text": [answer["text"]], "answer_start": [answer["answer_start"]]},
                })
    _report(skipped, path)
    return Dataset.from_list(rows), skipped


def _report(skipped: list[SkippedRecord], path) -> None:
    for record in skipped:
        logger.warning("skipped record %s from %s: %s", record.id, path, record.reason)


def join_article(article: dict, separator: str = WHOLE_ARTICLE_SEPARATOR) -> tuple[str, list[dict]]:
    """One whole-article context from the paragraphs of a SQuAD-format article; answer offsets shifted."""
    context_parts, questions, offset = [], [], 0
    for index, paragraph in enumerate(article["paragraphs"]):
        title = _name(article, "title")
        _require(paragraph, ("context", "qas"), f"paragraph {index} of article {title!r}")
        if index:
            offset += len(separator)
        for qa in paragraph["qas"]:
            where = f"{_name(qa)} (article {title!r})"
            _require(qa, ("id", "question", "answers"), where)
            for number, answer in enumerate(qa["answers"]):
                _require(answer, ("text", "answer_start"), f"{where}: answers[{number}]")
            # an answer_start that is not an integer is kept as it is: _offset_problem skips its record, saying so
            answers = [{"text": a["text"], "answer_start": a["answer_start"] + offset
                        if isinstance(a["answer_start"], int) else a["answer_start"],
                        "paragraph_start": a["answer_start"], "paragraph": paragraph["context"]}
                       for a in qa["answers"]]
            questions.append({"id": str(qa["id"]), "question": qa["question"], "answers": answers})
        context_parts.append(paragraph["context"])
        offset += len(paragraph["context"])
    return separator.join(context_parts), questions


def read_korquad_v1_articles(path: str | Path) -> tuple[Dataset, list[SkippedRecord]]:
    """KorQuAD 1.0 (SQuAD 1.1 format) with each article's paragraphs joined into one context."""
    return _read_squad_format(path, whole_articles=True)


def read_squad_paragraphs(path: str | Path) -> tuple[Dataset, list[SkippedRecord]]:
    """KorQuAD 1.0 / SQuAD 1.1 as published: one context per paragraph."""
    return _read_squad_format(path, whole_articles=False)


def _read_squad_format(path: str | Path, whole_articles: bool) -> tuple[Dataset, list[SkippedRecord]]:
    data = read_json_file(path, "dataset file")
    check_qa_format(data, path, "squad", "KorQuAD 1.0 / SQuAD")
    rows, skipped = [], []
    for index, article in enumerate(data["data"]):
        _require(article, ("title", "paragraphs"), f"data[{index}] (article {_name(article, 'title')!r}) in {path}")
        if whole_articles:
            contexts = [join_article(article)]
        else:  # join_article on a one-paragraph article validates fields and keeps offsets unchanged
            contexts = [join_article({**article, "paragraphs": [paragraph]}) for paragraph in article["paragraphs"]]
        for context, questions in contexts:
            _collect_questions(article["title"], context, questions, rows, skipped)
    _report(skipped, path)
    return Dataset.from_list(rows), skipped


def _collect_questions(title: str, context: str, questions: list[dict], rows: list, skipped: list) -> None:
    for qa in questions:
        problems = [_offset_problem(a["paragraph"], a["text"], a["paragraph_start"]) for a in qa["answers"]]
        problems = [p for p in problems if p]
        if problems or not qa["answers"]:
            skipped.append(SkippedRecord(qa["id"], problems[0] if problems else "no answer"))
            continue
        rows.append({
            "id": qa["id"], "title": title, "question": qa["question"], "context": context, "is_html": False,
            "answers": {"text": [a["text"] for a in qa["answers"]],
                        "answer_start": [a["answer_start"] for a in qa["answers"]]},
        })


def split_by_title(dataset: Dataset, dev_fraction: float = 0.2, seed: int = 0) -> DatasetDict:
    """Train/dev split by article (all questions of one article on one side), reproducible with `seed`."""
    titles = sorted(set(dataset["title"]))
    random.Random(seed).shuffle(titles)
    dev_titles = set(titles[:max(1, round(dev_fraction * len(titles)))])
    is_dev = [title in dev_titles for title in dataset["title"]]
    return DatasetDict(
        train=dataset.select([i for i, dev in enumerate(is_dev) if not dev]),
        dev=dataset.select([i for i, dev in enumerate(is_dev) if dev]),
    )


def as_squad_json(dataset: Dataset) -> dict:
    """The official-script input format (one paragraph per distinct context) for a question dataset."""
    articles: dict[tuple[str, str], list[dict]] = {}
    for row in dataset:
        qa = {"id": row["id"], "question": row["question"],
              "answers": [{"text": t, "answer_start": s}
                          for t, s in zip(row["answers"]["text"], row["answers"]["answer_start"])]}
        articles.setdefault((row["title"], row["context"]), []).append(qa)
    return {"version": "longbird", "data": [
        {"title": title, "paragraphs": [{"context": context, "qas": qas}]}
        for (title, context), qas in articles.items()
    ]}
