"""QA features: ``[CLS] question [SEP] window of the document [SEP]`` with overlapping windows.

`doc_stride` is the number of document tokens two neighbouring windows share (the Hugging Face meaning of
`stride`). Left unset it is half a window for any document longer than one window (LittleBird A.2: 8K windows
with a 4K stride). A window that does not hold the whole answer is labelled with [CLS] (index 0) as start and end.
With `token_types`, features carry token type ids (question and specials before the document 0, the document and
the final separator 1) also where the tokenizer emits none (RoBERTa/XLM-R family), for models with two types.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import regex

from .html import ProcessedDocument, plain_document, preprocess_html
from .null_regions import NullRegions
from .window_limit import check_window_limit

logger = logging.getLogger(__name__)
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
    # With regional nulls (data/null_regions.py): the position ids (nulls at 0) and, per token, its null's index
    position_ids: list[int] | None = None
    region_nulls: list[int] | None = None

    def model_inputs(self) -> dict:
        inputs = {"input_ids": self.input_ids, "attention_mask": [1] * len(self.input_ids)}
        if self.token_type_ids is not None:
            inputs["token_type_ids"] = self.token_type_ids
        if self.region_nulls is not None:
            inputs["position_ids"], inputs["region_nulls"] = self.position_ids, self.region_nulls
        return inputs

    def with_nulls(self, regions: NullRegions) -> QAFeature:
        """This window with its regional nulls inserted: offsets None at a null, labels moved with their tokens
        (a window without the answer keeps (0, 0): the real [CLS])."""
        item = regions.insert(self.input_ids, [offset is not None for offset in self.offsets], self.token_type_ids)
        kept = item["kept"]
        offsets: list[tuple[int, int] | None] = [None] * len(item["input_ids"])
        for old, new in enumerate(kept):
            offsets[new] = self.offsets[old]
        return QAFeature(self.example_id, item["input_ids"], item.get("token_type_ids"), offsets,
                         kept[self.start_position], kept[self.end_position], self.window_index,
                         item["position_ids"], item["region_nulls"])


def prepare_document(context: str, is_html: bool) -> ProcessedDocument:
    return preprocess_html(context) if is_html else plain_document(context)


def question_token_count(tokenizer, question: str) -> int:
    """Tokens of `question` alone; above `MAX_QUESTION_TOKENS` only its first tokens are read (`_question_prefix`)."""
    return len(tokenizer(question, add_special_tokens=False)["input_ids"])


def question_token_cap(config, window_length: int, tokens_before_question: int = 1) -> int | None:
    """The most question tokens a window of `window_length` can read with a model of `config`; None when no
    attention pattern limits it (full attention).

    The question must be seen by every document token and see every one of them. Full attention does that at any
    length; the sparse patterns do it only for their global tokens, and the question lies in the first block, which is
    global in both (BigBird ITC: query and key block 0; LittleBird: the global first block). A question token past the
    first block would be a plain local token, read only by its neighbours. So when the window is sparse the question
    must fit the first block with what precedes it (`[CLS]`): `block_size - tokens_before_question` tokens (63 at
    block 64; the longest KorQuAD 1.0 question is 59 multilingual-e5-small tokens, so none is cut there)."""
    sparse = (config.attention == "littlebird"
              or (config.attention == "bigbird" and window_length > config.full_attention_threshold))
    return config.block_size - tokens_before_question if sparse else None


def question_token_limit(config, window_length: int, tokens_before_question: int = 1) -> int:
    """The question tokens read by default: `MAX_QUESTION_TOKENS`, or fewer where a sparse window's first block
    holds fewer (`question_token_cap`)."""
    cap = question_token_cap(config, window_length, tokens_before_question)
    return MAX_QUESTION_TOKENS if cap is None else min(MAX_QUESTION_TOKENS, cap)


def _question_prefix(tokenizer, question: str, max_question_tokens: int) -> tuple[str, int]:
    """(question cut to at most `max_question_tokens` tokens, its token count)."""
    offsets = tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    if len(offsets) <= max_question_tokens:
        return question, len(offsets)
    # Cut before the first token past the limit; a character split into several pieces goes whole.
    question = question[:offsets[max_question_tokens][0]]
    return question, len(tokenizer(question, add_special_tokens=False)["input_ids"])


class WindowTooShort(ValueError):
    """A window that cannot hold the question, its special tokens and at least two document tokens."""


def resolve_doc_stride(tokenizer, max_length: int, doc_stride: int | None, question_tokens: int) -> int:
    """The stride for windows of `max_length` after a question of `question_tokens` (default: half a window)."""
    room = max_length - question_tokens - tokenizer.num_special_tokens_to_add(pair=True)
    if room < 2:
        raise WindowTooShort(f"{max_length}-token windows leave no room for the document after a question of "
                             f"{question_tokens} tokens; use longer windows")
    if doc_stride is None:
        # Half a window (LittleBird A.2); it only matters for documents longer than one window.
        doc_stride = min(max_length // 2, room // 2)
    if not 0 <= doc_stride < room:
        raise ValueError(f"doc_stride ({doc_stride}) must lie in 0..{room - 1}: {max_length}-token windows hold "
                         f"{room} document tokens after this question")
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
    token_types: bool = False,
    null_regions: NullRegions | None = None,
    window_limit: int | None = None,
) -> list[QAFeature]:
    """Windows over `document` for one question. `answer_span` is a (start, end) range of the *source*
    text (e.g. a KorQuAD answer); it labels the windows that contain it. `max_windows=1` is truncation.
    `token_types`: always give token type ids (question 0, document 1), for models with two token types.
    `null_regions`: insert regional nulls (data/null_regions.py); the windows are cut shorter so that each still
    fits `max_length` tokens with its nulls. `window_limit`: raise TooManyWindows, before building any, where the
    document makes more windows than that."""
    window = max_length  # as asked, for messages
    if null_regions is not None:
        max_length = null_regions.room(max_length)
    question, question_tokens = _question_prefix(tokenizer, question, max_question_tokens)
    stride = resolve_doc_stride(tokenizer, max_length, doc_stride, question_tokens)
    if window_limit is not None:
        room = max_length - question_tokens - tokenizer.num_special_tokens_to_add(pair=True)
        check_window_limit(tokenizer, document.text, window, room, stride, window_limit)
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
        types = encoded["token_type_ids"][window] if "token_type_ids" in encoded else None
        if token_types and (types is None or not any(types)):
            types = _pair_token_types(sequence_ids)
        feature = QAFeature(example_id, encoded["input_ids"][window], types, offsets, window_index=window)
        if target is not None:
            feature.start_position, feature.end_position = label_window(offsets, target)
        features.append(feature if null_regions is None else feature.with_nulls(null_regions))
    if target is not None and not any(f.start_position for f in features) and max_windows is None:
        logger.warning("the answer of %s fits in no window (doc_stride %d is shorter than the answer); its windows "
                       "are unlabelled: use a larger --doc-stride", example_id, stride)
    return features


def _pair_token_types(sequence_ids: list[int | None]) -> list[int]:
    """BERT's segments for a pair: 0 up to the document, 1 from its first token to the end (final separator)."""
    first = next((i for i, sequence in enumerate(sequence_ids) if sequence == 1), len(sequence_ids))
    return [0] * first + [1] * (len(sequence_ids) - first)


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
                      documents: dict | None = None, token_types: bool = False,
                      max_question_tokens: int = MAX_QUESTION_TOKENS,
                      null_regions: NullRegions | None = None,
                      window_limit: int | None = None) -> list[QAFeature]:
    """Features for dataset rows (`read_korquad_v2` / `read_korquad_v1_articles` schema); the first gold answer
    labels the windows that hold it. `documents` caches processed contexts by (context, is_html); each
    document is processed once however many questions it has. `token_types` and `max_question_tokens` as in
    `make_features`, and `null_regions`."""
    documents = {} if documents is None else documents
    features = []
    for row in rows:
        key = (row["context"], row["is_html"])
        if key not in documents:
            documents[key] = prepare_document(row["context"], row["is_html"])
        span = None
        if with_labels and row["answers"]["text"]:
            start = row["answers"]["answer_start"][0]
            span = (start, start + len(row["answers"]["text"][0]))
        features.extend(make_features(tokenizer, row["id"], row["question"], documents[key], max_length,
                                      doc_stride, span, max_windows, token_types=token_types,
                                      max_question_tokens=max_question_tokens, null_regions=null_regions,
                                      window_limit=window_limit))
    return features


GRAPHEME = regex.compile(r"\X")  # a user-perceived character (Unicode's extended grapheme cluster, UAX #29)


def _character_at(text: str, position: int) -> tuple[int, int]:
    """[start, end) of the user-perceived character holding text[position] (clusters read from 32 code points
    before it: longer ones are not written)."""
    for cluster in GRAPHEME.finditer(text, max(0, position - 32), min(len(text), position + 33)):
        if cluster.start() <= position < cluster.end():
            return cluster.start(), cluster.end()
    return position, position + 1


def whole_characters(text: str, begin: int, end: int) -> tuple[int, int]:
    """[begin, end) widened to whole user-perceived characters (grapheme clusters). A tokenizer that normalises text
    (NFC, NFKC) gives a composed token the offsets of the first code point it came from: in Korean written decomposed
    (NFD, as text copied on macOS often is) the token 일 spans only its first jamo, and an answer ended "15ᄋ"
    instead of "15일"; the same holds for a letter and its combining accent, or an emoji and its modifier. An empty
    span stays."""
    if not 0 <= begin < end <= len(text):
        return begin, end
    return _character_at(text, begin)[0], _character_at(text, end - 1)[1]
