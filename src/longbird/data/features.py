"""QA features: ``[CLS] question [SEP] window of the document [SEP]`` with overlapping windows.

`doc_stride` is the number of document tokens two neighbouring windows share (the Hugging Face meaning of
`stride`). Left unset it is 128, or max_length/2 for documents longer than 2 x max_length (the LittleBird
KorQuAD 2.0 setting: 8K windows with a 4K stride). A window that does not hold the whole answer is labelled
with [CLS] (index 0) as start and end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .html import ProcessedDocument, plain_document, preprocess_html

logger = logging.getLogger(__name__)
DEFAULT_DOC_STRIDE = 128
MAX_QUESTION_TOKENS = 64


@dataclass
class QAFeature:
    example_id: str
    input_ids: list[int]
    token_type_ids: list[int] | None
    # Per token: (start, end) in the processed document text, or None outside the document.
    offsets: list[tuple[int, int] | None]
    start_position: int = 0
    end_position: int = 0
    window_index: int = 0

    def model_inputs(self) -> dict:
        inputs = {"input_ids": self.input_ids, "attention_mask": [1] * len(self.input_ids)}
        if self.token_type_ids is not None:
            inputs["token_type_ids"] = self.token_type_ids
        return inputs


def prepare_document(context: str, is_html: bool) -> ProcessedDocument:
    return preprocess_html(context) if is_html else plain_document(context)


def _question_prefix(tokenizer, question: str, max_question_tokens: int) -> tuple[str, int]:
    """(question cut to at most `max_question_tokens` tokens, its token count)."""
    offsets = tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    if len(offsets) <= max_question_tokens:
        return question, len(offsets)
    # Cut before the first token past the limit; a character split into several pieces goes whole.
    question = question[:offsets[max_question_tokens][0]]
    return question, len(tokenizer(question, add_special_tokens=False)["input_ids"])


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def resolve_doc_stride(tokenizer, document_text: str, max_length: int, doc_stride: int | None,
                       question_tokens: int, document_tokens: int | None = None) -> int:
    """`document_tokens` (the token count of `document_text`) is counted here when not given."""
    room = max_length - question_tokens - tokenizer.num_special_tokens_to_add(pair=True)
    if room < 2:
        raise ValueError(f"max_length ({max_length}) leaves no room for the document after a question of "
                         f"{question_tokens} tokens; use a larger max_length")
    if doc_stride is None:
        if document_tokens is None:
            document_tokens = count_tokens(tokenizer, document_text)
        doc_stride = max_length // 2 if document_tokens > 2 * max_length else DEFAULT_DOC_STRIDE
        doc_stride = min(doc_stride, room // 2)
    if not 0 <= doc_stride < room:
        raise ValueError(f"doc_stride ({doc_stride}) must lie in 0..{room - 1}: windows of max_length={max_length} "
                         f"hold {room} document tokens after this question")
    return doc_stride


def make_features(
    tokenizer,
    example_id: str,
    question: str,
    document: ProcessedDocument,
    max_length: int,
    doc_stride: int | None = None,
    answer_span: tuple[int, int] | None = None,
    max_windows: int | None = None,
    max_question_tokens: int = MAX_QUESTION_TOKENS,
    document_tokens: int | None = None,
) -> list[QAFeature]:
    """Windows over `document` for one question. `answer_span` is a (start, end) range of the *source*
    text (e.g. a KorQuAD answer); it labels the windows that contain it. `max_windows=1` is truncation."""
    question, question_tokens = _question_prefix(tokenizer, question, max_question_tokens)
    stride = resolve_doc_stride(tokenizer, document.text, max_length, doc_stride, question_tokens, document_tokens)
    encoded = tokenizer(question, document.text, truncation="only_second", max_length=max_length, stride=stride,
                        return_overflowing_tokens=True, return_offsets_mapping=True)
    target = document.from_source_span(*answer_span) if answer_span is not None else None
    if answer_span is not None and target is None:
        logger.warning("the answer of %s lies in content dropped by preprocessing; its windows are unlabelled",
                       example_id)
    features = []
    for window in range(len(encoded["input_ids"])):
        if max_windows is not None and window >= max_windows:
            break
        sequence_ids = encoded.sequence_ids(window)
        offsets = [tuple(offset) if sequence == 1 else None
                   for offset, sequence in zip(encoded["offset_mapping"][window], sequence_ids)]
        feature = QAFeature(example_id, encoded["input_ids"][window],
                            encoded["token_type_ids"][window] if "token_type_ids" in encoded else None,
                            offsets, window_index=window)
        if target is not None:
            feature.start_position, feature.end_position = label_window(offsets, target)
        features.append(feature)
    if target is not None and not any(f.start_position for f in features) and max_windows is None:
        logger.warning("the answer of %s fits in no window (doc_stride %d is shorter than the answer); its windows "
                       "are unlabelled: use a larger --doc-stride", example_id, stride)
    return features


def label_window(offsets: list[tuple[int, int] | None], target: tuple[int, int]) -> tuple[int, int]:
    """Token (start, end) of the character range `target` if the window holds all of it, else (0, 0)."""
    inside = [i for i, offset in enumerate(offsets) if offset is not None and offset[1] > offset[0]]
    if not inside:
        return 0, 0
    first, last = offsets[inside[0]], offsets[inside[-1]]
    if target[0] < first[0] or target[1] > last[1]:
        return 0, 0
    start = next(i for i in inside if offsets[i][1] > target[0])
    end = next(i for i in reversed(inside) if offsets[i][0] < target[1])
    return start, end


def features_for_rows(tokenizer, rows, max_length: int, doc_stride: int | None = None,
                      max_windows: int | None = None, with_labels: bool = True,
                      documents: dict | None = None) -> list[QAFeature]:
    """Features for dataset rows (`read_korquad_v2` / `read_korquad_v1_articles` schema); the first gold answer
    labels the windows that hold it. `documents` caches processed contexts by (context, is_html); each
    document is processed (and, for the default stride, counted) once however many questions it has."""
    documents = {} if documents is None else documents
    token_counts: dict[tuple[str, bool], int] = {}
    features = []
    for row in rows:
        key = (row["context"], row["is_html"])
        if key not in documents:
            documents[key] = prepare_document(row["context"], row["is_html"])
        if doc_stride is None and key not in token_counts:
            token_counts[key] = count_tokens(tokenizer, documents[key].text)
        span = None
        if with_labels and row["answers"]["text"]:
            start = row["answers"]["answer_start"][0]
            span = (start, start + len(row["answers"]["text"][0]))
        features.extend(make_features(tokenizer, row["id"], row["question"], documents[key], max_length,
                                      doc_stride, span, max_windows, document_tokens=token_counts.get(key)))
    return features
