"""Official extractive-QA metrics: KorQuAD 2.0, KorQuAD 1.0 and SQuAD 1.1.

Each function takes what the official script takes: ``predictions`` = {question id: answer text} and
``dataset`` = the parsed JSON (the whole file, or its ``data`` list). Scores are percentages.
Unanswered questions score 0, as in the official scripts. The normalisations reproduce the scripts
character for character, including their quirks (an empty prediction against an empty gold answer is
an exact match with F1 0).
"""

from __future__ import annotations

import re
import string
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from bs4 import BeautifulSoup, MarkupResemblesLocatorWarning

# The KorQuAD scripts replace these symbols by a space before anything else.
KORQUAD_SYMBOLS = re.compile("['\"《》<>〈〉()‘’]")
ASCII_PUNCTUATION = frozenset(string.punctuation)
ENGLISH_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _strip_html(text: str) -> str:
    with warnings.catch_warnings():
        # A short answer such as "a.b" looks like a file name to BeautifulSoup; it is text here.
        warnings.simplefilter("ignore", MarkupResemblesLocatorWarning)
        return BeautifulSoup(text, "lxml").get_text()


def _remove_punctuation(text: str) -> str:
    return "".join(ch for ch in text if ch not in ASCII_PUNCTUATION)


def normalize_korquad_v2(text: str) -> str:
    """KorQuAD 2.0: strip HTML, drop symbols, lower-case, drop ASCII punctuation, drop all whitespace."""
    text = _remove_punctuation(KORQUAD_SYMBOLS.sub(" ", _strip_html(text)).lower())
    return "".join(text.split())


def normalize_korquad_v1(text: str) -> str:
    """KorQuAD 1.0: drop symbols, lower-case, drop ASCII punctuation, collapse whitespace (no HTML step)."""
    return " ".join(_remove_punctuation(KORQUAD_SYMBOLS.sub(" ", text).lower()).split())


def normalize_squad(text: str) -> str:
    """SQuAD 1.1: lower-case, drop punctuation, drop English articles, collapse whitespace."""
    return " ".join(ENGLISH_ARTICLES.sub(" ", _remove_punctuation(text.lower())).split())


def _f1(prediction_units: list[str], gold_units: list[str]) -> float:
    common = Counter(prediction_units) & Counter(gold_units)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction_units), same / len(gold_units)
    return 2 * precision * recall / (precision + recall)


def _characters(normalized: str) -> list[str]:
    # The KorQuAD scripts count the characters of the whitespace tokens, so spaces never count.
    return [ch for token in normalized.split() for ch in token]


def f1_korquad_v2(prediction: str, gold: str) -> float:
    return _f1(_characters(normalize_korquad_v2(prediction)), _characters(normalize_korquad_v2(gold)))


def f1_korquad_v1(prediction: str, gold: str) -> float:
    return _f1(_characters(normalize_korquad_v1(prediction)), _characters(normalize_korquad_v1(gold)))


def f1_squad(prediction: str, gold: str) -> float:
    return _f1(normalize_squad(prediction).split(), normalize_squad(gold).split())


def _records(dataset: Mapping[str, Any] | list) -> list:
    return dataset["data"] if isinstance(dataset, Mapping) else dataset


def _v1_questions(dataset) -> Iterable[tuple[str, list[str]]]:
    for article in _records(dataset):
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                yield qa["id"], [answer["text"] for answer in qa["answers"]]


def _v2_questions(dataset) -> Iterable[tuple[str, list[str]]]:
    for document in _records(dataset):
        for qa in document["qas"]:
            yield qa["id"], [qa["answer"]["text"]]


def _score(
    questions: Iterable[tuple[str, list[str]]],
    predictions: Mapping[str, str],
    normalize: Callable[[str], str],
    f1: Callable[[str, str], float],
) -> dict[str, float]:
    exact = f1_total = 0.0
    total = 0
    for question_id, golds in questions:
        total += 1
        if question_id not in predictions:
            continue
        prediction = predictions[question_id]
        exact += max(float(normalize(prediction) == normalize(gold)) for gold in golds)
        f1_total += max(f1(prediction, gold) for gold in golds)
    if total == 0:
        raise ValueError("the dataset holds no questions; check that it is the right file and format")
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1_total / total}


def korquad_v2(predictions: Mapping[str, str], dataset) -> dict[str, float]:
    """KorQuAD 2.0 official EM/F1 (one gold answer per question, character F1 after HTML stripping)."""
    return _score(_v2_questions(dataset), predictions, normalize_korquad_v2, f1_korquad_v2)


def korquad_v1(predictions: Mapping[str, str], dataset) -> dict[str, float]:
    """KorQuAD 1.0 official EM/F1 (max over gold answers, character F1 over whitespace tokens)."""
    return _score(_v1_questions(dataset), predictions, normalize_korquad_v1, f1_korquad_v1)


def squad_v1(predictions: Mapping[str, str], dataset) -> dict[str, float]:
    """SQuAD 1.1 official EM/F1 (token F1 with English article removal) on a SQuAD-format dataset."""
    return _score(_v1_questions(dataset), predictions, normalize_squad, f1_squad)
