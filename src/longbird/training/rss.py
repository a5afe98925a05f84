"""Recurring Span Selection (RSS; Ram et al. 2021, Splinter; LittleBird §4.1 pretrains with it).

In a window of text, spans of whole words (at most 10 tokens, at least one non-stopword) that occur two or more
times are found. For up to `30 · length / 512` such span groups, one occurrence is kept as the answer and every other
occurrence is replaced by a single `[QUESTION]` token, whose target is the kept span's (start, end) in the new
sequence. The model points from each `[QUESTION]` token at its span: start first, then end given the start
(`heads.LongBirdForSpanSelection`). Accuracy is the exact match of the selected span.

Word boundaries come from the fast tokenizer's `word_ids()` (a SentencePiece "▁" word start or a WordPiece word), so
spans never cut a word.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from ..data.corpus import window_ends
from ..data.tokens import add_special_tokens

QUESTION_TOKEN = "[QUESTION]"
MAX_SPAN_TOKENS = 10
SPAN_GROUPS_PER_512 = 30
IGNORE_INDEX = -100
# Words that alone never make a span worth asking about (Korean particles and endings, English function words).
STOPWORDS = frozenset("""
은 는 이 가 을 를 의 에 에서 와 과 도 로 으로 및 등 또는 그 이 저 것 수 한 하는 있는 있다 한다 된다 하여 위한 대한
the a an
of and or to in on at for by with is are was were be as that this it its from
""".split())


def add_question_token(tokenizer, model=None) -> int:
    """Add `[QUESTION]` as a special token (and an embedding row, initialised as the mean embedding); return its id."""
    added = add_special_tokens(tokenizer, model, [QUESTION_TOKEN])
    if model is not None and added:
        table = model.get_input_embeddings().weight
        with torch.no_grad():
            table[added[QUESTION_TOKEN]] = table[:added[QUESTION_TOKEN]].mean(0)
    return tokenizer.convert_tokens_to_ids(QUESTION_TOKEN)


@dataclass
class RSSExample:
    input_ids: list[int]
    question_positions: list[int]
    start_positions: list[int]
    end_positions: list[int]


def _words(word_ids: list[int | None]) -> list[tuple[int, int]]:
    """Token ranges [start, end] (inclusive) of each word; special tokens (word id None) are no word."""
    words: list[tuple[int, int]] = []
    previous = None
    for index, word in enumerate(word_ids):
        if word is None:
            previous = None
            continue
        if word == previous:
            words[-1] = (words[-1][0], index)
        else:
            words.append((index, index))
        previous = word
    return words


def recurring_spans(input_ids: list[int], word_ids: list[int | None], tokenizer) -> dict[tuple[int, ...], list[int]]:
    """{span token ids: start indices of its non-overlapping occurrences}, for spans of whole words occurring at
    least twice."""
    words = _words(word_ids)
    texts = [tokenizer.decode(input_ids[a:b + 1]).strip() for a, b in words]
    content = [len(text) >= 2 and text.lower() not in STOPWORDS for text in texts]
    spans: dict[tuple[int, ...], list[int]] = {}
    for first in range(len(words)):
        for last in range(first, len(words)):
            start, end = words[first][0], words[last][1]
            if end - start + 1 > MAX_SPAN_TOKENS:
                break
            if any(content[first:last + 1]):  # at least one non-stopword
                spans.setdefault(tuple(input_ids[start:end + 1]), []).append(start)
    recurring = {}
    for span, starts in spans.items():
        kept, last_end = [], -1
        for start in starts:  # occurrences of one span may overlap themselves ("a a a"): keep disjoint ones
            if start > last_end:
                kept.append(start)
                last_end = start + len(span) - 1
        if len(kept) >= 2:
            recurring[span] = kept
    return recurring


def rss_example(input_ids: list[int], word_ids: list[int | None], tokenizer, question_id: int,
                rng: random.Random) -> RSSExample | None:
    """One RSS training example from a tokenized window, or None if nothing recurs."""
    groups = max(1, round(SPAN_GROUPS_PER_512 * len(input_ids) / 512))
    candidates = list(recurring_spans(input_ids, word_ids, tokenizer).items())
    rng.shuffle(candidates)
    candidates.sort(key=lambda item: -len(item[0]))  # longer spans first (stable: random among equals)
    used = [False] * len(input_ids)
    chosen = []
    for span, starts in candidates:
        if len(chosen) == groups:
            break
        if any(used[s + k] for s in starts for k in range(len(span))):
            continue
        for s in starts:
            for k in range(len(span)):
                used[s + k] = True
        chosen.append((span, starts, rng.randrange(len(starts))))
    if not chosen:
        return None
    # Rebuild left to right: questions collapse to one token, kept spans stay.
    replaced: dict[int, tuple[int, int]] = {}  # occurrence start -> (group, span length) for replaced occurrences
    kept: dict[int, int] = {}  # occurrence start -> group, for kept occurrences
    for group, (span, starts, keep) in enumerate(chosen):
        for index, start in enumerate(starts):
            if index == keep:
                kept[start] = group
            else:
                replaced[start] = (group, len(span))
    new_ids: list[int] = []
    answer_start: dict[int, int] = {}
    questions: list[tuple[int, int]] = []  # (position, group)
    position = 0
    while position < len(input_ids):
        if position in replaced:
            group, length = replaced[position]
            questions.append((len(new_ids), group))
            new_ids.append(question_id)
            position += length
            continue
        if position in kept:
            answer_start[kept[position]] = len(new_ids)
        new_ids.append(input_ids[position])
        position += 1
    starts = [answer_start[group] for _, group in questions]
    ends = [answer_start[group] + len(chosen[group][0]) - 1 for _, group in questions]
    return RSSExample(new_ids, [q for q, _ in questions], starts, ends)


def rss_examples(documents: list[str], tokenizer, length: int, seed: int = 0) -> list[dict]:
    """Corpus documents -> RSS training items of at most `length` tokens (windows with no recurring span dropped)."""
    question_id = add_question_token(tokenizer)
    rng = random.Random(seed)
    first, last = window_ends(tokenizer)
    opening, closing = [t for t in (first,) if t is not None], [t for t in (last,) if t is not None]
    room = length - len(opening) - len(closing)
    items = []
    for document in documents:
        encoding = tokenizer(document, add_special_tokens=False, verbose=False)
        ids, word_ids = encoding["input_ids"], encoding.word_ids()
        for start in range(0, len(ids), room):
            window_ids = opening + ids[start:start + room] + closing
            window_words = [None] * len(opening) + word_ids[start:start + room] + [None] * len(closing)
            example = rss_example(window_ids, window_words, tokenizer, question_id, rng)
            if example is not None:
                items.append({"input_ids": example.input_ids, "attention_mask": [1] * len(example.input_ids),
                              "question_positions": example.question_positions,
                              "start_positions": example.start_positions, "end_positions": example.end_positions})
    if not items:
        raise ValueError("no window of the corpus holds a recurring span; give more (or longer) text")
    return items


class RSSCollator:
    """Pads ids/masks to the longest window and question lists to the most questions (targets IGNORE_INDEX)."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(len(item["input_ids"]) for item in items)
        most = max(len(item["question_positions"]) for item in items)

        def pad(values, size, fill):
            return torch.tensor([list(v) + [fill] * (size - len(v)) for v in values], dtype=torch.long)

        return {
            "input_ids": pad([i["input_ids"] for i in items], longest, self.pad_token_id),
            "attention_mask": pad([i["attention_mask"] for i in items], longest, 0),
            "question_positions": pad([i["question_positions"] for i in items], most, 0),
            "start_positions": pad([i["start_positions"] for i in items], most, IGNORE_INDEX),
            "end_positions": pad([i["end_positions"] for i in items], most, IGNORE_INDEX),
        }
