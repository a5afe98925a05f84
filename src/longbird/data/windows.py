"""QA training windows built lazily: memory that grows with the documents, not with questions × windows.

The eager route (`features.features_for_rows` then `training.finetune.qa_training_items`) tokenizes the question and
the whole document as a pair for every question and keeps every window of every question as Python lists of ids and
offsets: 4,843 KorQuAD 1.0 questions over 112 whole articles at 512-token windows made 117,895 windows and peaked
at 13 GB before the first step. Here each document is tokenized once (ids and character offsets as numpy arrays,
shared by all its questions), each question once; a window is then only a range of document tokens, labelled from
the offsets, and windows without the answer are drawn (kept with probability `negative_fraction`) before anything
is built. `QAWindows[i]` assembles one training item when the data loader asks for it.

The windows are exactly the eager ones (tests/test_windows.py compares ids, token types and labels): the special
tokens around question and window come from the tokenizer's own pair encoding (`PairTemplate`), the windows follow
the fast tokenizer's overflow rule for `truncation="only_second"` with a stride (windows of `room` document tokens
starting every `room - stride` tokens until one reaches the end), and the negative draws consume the random stream
in the same order as `qa_training_items`.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import numpy as np

from .features import MAX_QUESTION_TOKENS, _question_prefix, prepare_document, resolve_doc_stride
from .html import ProcessedDocument
from .null_regions import NullRegions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PairTemplate:
    """The special tokens a tokenizer puts around a (question, document) pair, and the token type of each part:
    prefix + question + middle + document + suffix (BERT: [CLS] q [SEP] d [SEP]; XLM-R: <s> q </s></s> d </s>)."""

    prefix: tuple[int, ...]
    middle: tuple[int, ...]
    suffix: tuple[int, ...]
    # token type of (prefix, question, middle, document, suffix); None when the tokenizer gives no types
    types: tuple[int, int, int, int, int] | None

    @classmethod
    def of(cls, tokenizer) -> PairTemplate:
        encoded = tokenizer("a", "b")  # token types only where the tokenizer gives them (as the eager route)
        ids, sequence = encoded["input_ids"], encoded.sequence_ids()
        first = sequence.index(0)
        middle_start = first + sequence.count(0)
        second = sequence.index(1)
        suffix_start = second + sequence.count(1)
        parts = (slice(0, first), slice(first, middle_start), slice(middle_start, second),
                 slice(second, suffix_start), slice(suffix_start, len(ids)))
        types = encoded.get("token_type_ids")
        part_types = None
        if types is not None:
            part_types = tuple(types[part.start] if part.stop > part.start else 0 for part in parts)
        return cls(tuple(ids[parts[0]]), tuple(ids[parts[2]]), tuple(ids[parts[4]]), part_types)

    @property
    def special_tokens(self) -> int:
        return len(self.prefix) + len(self.middle) + len(self.suffix)

    def assemble(self, question: list[int], window: np.ndarray, pair_token_types: bool) -> dict:
        """input_ids (and token_type_ids) of one window. `pair_token_types`: give BERT's segments (question side 0,
        document and final separator 1) also where the tokenizer emits none, as `features.make_features` does."""
        ids = [*self.prefix, *question, *self.middle, *window.tolist(), *self.suffix]
        item = {"input_ids": ids, "attention_mask": [1] * len(ids)}
        lengths = (len(self.prefix), len(question), len(self.middle), len(window), len(self.suffix))
        types = self.types
        if pair_token_types and (types is None or not any(types)):
            types = (0, 0, 0, 1, 1)
        if types is not None:
            item["token_type_ids"] = [t for t, n in zip(types, lengths) for _ in range(n)]
        return item


@dataclass
class TokenizedDocument:
    """One processed document tokenized once: token ids (n,) and character offsets (n, 2) into `document.text`."""

    document: ProcessedDocument
    ids: np.ndarray
    offsets: np.ndarray

    @classmethod
    def of(cls, tokenizer, document: ProcessedDocument) -> TokenizedDocument:
        encoded = tokenizer(document.text, add_special_tokens=False, return_offsets_mapping=True)
        ids = np.asarray(encoded["input_ids"], dtype=np.int64)
        offsets = np.asarray(encoded["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        return cls(document, ids, offsets)


def window_ranges(length: int, room: int, stride: int) -> list[tuple[int, int]]:
    """Document-token ranges of the windows the fast tokenizer makes for `truncation="only_second"` with `stride`:
    `room` tokens each, starting every `room - stride` tokens, until one reaches the end (one window when it fits)."""
    if length <= room:
        return [(0, length)]
    ranges, step = [], room - stride
    for start in range(0, length, step):
        stop = min(start + room, length)
        ranges.append((start, stop))
        if stop == length:
            break
    return ranges


def label_range(offsets: np.ndarray, target: tuple[int, int]) -> tuple[int, int] | None:
    """`features.label_window` on a window's document offsets (m, 2): the (start, end) indices, within the window's
    document tokens, of the character range `target` if the window holds all of it, else None."""
    inside = np.flatnonzero(offsets[:, 1] > offsets[:, 0])
    if not len(inside):
        return None
    if target[0] < offsets[inside[0], 0] or target[1] > offsets[inside[-1], 1]:
        return None
    start = inside[np.argmax(offsets[inside, 1] > target[0])]
    end = inside[len(inside) - 1 - np.argmax(offsets[inside[::-1], 0] < target[1])]
    return int(start), int(end)


class QAWindows:
    """The training items of QA fine-tuning, built on demand (a map-style dataset for `Trainer`): item i is
    {"input_ids", "attention_mask"[, "token_type_ids"], "start_positions", "end_positions"}, the same items, in the
    same order, as `qa_training_items(features_for_rows(...), negative_fraction, seed)`.

    `rows`: dataset rows in the `read_korquad_v2` / `read_korquad_v1_articles` schema (the first gold answer labels
    the windows that hold it). `windows` counts every window before the negative draw (the eager route's feature
    count). With `with_question_tokens` an item also says how many tokens its question has (`question_tokens`): what
    a sliding teacher needs to cut the window again (training/sliding_teacher.py). With `null_regions` an item gets
    its regional nulls (data/null_regions.py: "position_ids" and "region_nulls" too, labels moved with their tokens)
    and the windows are cut shorter so that each still fits `max_length` with them, as `features.make_features`."""

    def __init__(self, tokenizer, rows, max_length: int, doc_stride: int | None = None,
                 max_windows: int | None = None, negative_fraction: float = 1.0, seed: int = 0,
                 token_types: bool = False, max_question_tokens: int = MAX_QUESTION_TOKENS,
                 with_question_tokens: bool = False, null_regions: NullRegions | None = None):
        if null_regions is not None and with_question_tokens:
            raise ValueError("a sliding teacher cuts the window again and cannot read regional nulls: train with "
                             "qa_null_every=0 or without the teacher")
        self.null_regions = null_regions
        if null_regions is not None:
            max_length = null_regions.room(max_length)
        self.template = PairTemplate.of(tokenizer)
        self.token_types = token_types
        self.with_question_tokens = with_question_tokens
        self.documents: list[TokenizedDocument] = []
        self.questions: list[list[int]] = []
        rng = random.Random(seed)
        by_context: dict[tuple[str, bool], int] = {}
        # Per item: (question index, document index, first document token, end, start label, end label); labels are
        # positions in the assembled window (0 = [CLS]: the answer is not in this window).
        items: list[tuple[int, int, int, int, int, int]] = []
        self.windows = 0
        for row in rows:
            key = (row["context"], row["is_html"])
            if key not in by_context:
                by_context[key] = len(self.documents)
                self.documents.append(TokenizedDocument.of(tokenizer, prepare_document(*key)))
            document_index = by_context[key]
            document = self.documents[document_index]
            question, _ = _question_prefix(tokenizer, row["question"], max_question_tokens)
            question_ids = tokenizer(question, add_special_tokens=False)["input_ids"]
            stride = resolve_doc_stride(tokenizer, max_length, doc_stride, len(question_ids))
            room = max_length - len(question_ids) - self.template.special_tokens
            target = self._target(row, document)
            ranges = window_ranges(len(document.ids), room, stride)[:max_windows]
            self.windows += len(ranges)
            before = len(self.template.prefix) + len(question_ids) + len(self.template.middle)
            labelled = False
            for start, stop in ranges:
                label = label_range(document.offsets[start:stop], target) if target is not None else None
                if label is None and rng.random() >= negative_fraction:
                    continue
                first, last = (before + label[0], before + label[1]) if label is not None else (0, 0)
                labelled |= label is not None
                items.append((len(self.questions), document_index, start, stop, first, last))
            if target is not None and not labelled and max_windows is None:
                logger.warning("the answer of %s fits in no window (doc_stride %d is shorter than the answer); "
                               "its windows are unlabelled: use a larger --doc-stride", row["id"], stride)
            self.questions.append(question_ids)
        self.items = np.asarray(items, dtype=np.int64).reshape(-1, 6)

    @staticmethod
    def _target(row, document: TokenizedDocument) -> tuple[int, int] | None:
        if not row["answers"]["text"]:
            return None
        start = row["answers"]["answer_start"][0]
        target = document.document.from_source_span(start, start + len(row["answers"]["text"][0]))
        if target is None:
            logger.warning("the answer of %s lies in content dropped by preprocessing; its windows are unlabelled",
                           row["id"])
        return target

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        question, document, start, stop, first, last = (int(x) for x in self.items[index])
        item = self.template.assemble(self.questions[question], self.documents[document].ids[start:stop],
                                      self.token_types)
        if self.null_regions is not None:
            before = len(self.template.prefix) + len(self.questions[question]) + len(self.template.middle)
            in_document = [before <= i < before + stop - start for i in range(len(item["input_ids"]))]
            inserted = self.null_regions.insert(item["input_ids"], in_document, item.get("token_type_ids"))
            first, last = inserted["kept"][first], inserted["kept"][last]
            item = {key: value for key, value in inserted.items() if key not in ("kept", "nulls")}
        item = {**item, "start_positions": first, "end_positions": last}
        if self.with_question_tokens:
            item["question_tokens"] = len(self.questions[question])
        return item

    def lengths(self) -> list[int]:
        """Tokens of every item (for length-grouped batches), without building the items."""
        questions = np.asarray([len(self.questions[q]) for q in self.items[:, 0]], dtype=np.int64)
        lengths = (questions + self.items[:, 3] - self.items[:, 2] + self.template.special_tokens).tolist()
        if self.null_regions is None:
            return lengths
        return [length + self.null_regions.count(length) for length in lengths]  # at most that many nulls
