"""A lexical prior for ranking answers across windows: how well the text around a candidate matches the question.

Why: on whole articles the sliding reader loses about 6 F1 to choosing the wrong place (E7's diagnosis: near the
answer 80.5, whole 74.5), and the scores it ranks places by are its own null-relative logits, which never compare the
place's text with the question's words except through the reader. KorQuAD questions are written from one paragraph
and share many of its words. Open-domain readers combine the two signals linearly: BERTserini (Yang et al. 2019,
"End-to-End Open-Domain Question Answering with BERTserini", sec. 2) ranks spans by
S = (1 − μ) · S_Anserini + μ · S_BERT. Here the reader's score (the scoring rule's value, a log-odds) gets
`weight` × BM25 of the passage around the span's first token added; the order of spans within one passage is the
reader's.

The passage is the `radius` document tokens on either side of the start (2·radius tokens, clipped to the document),
read in the document's own token sequence, so a span scores the same in every window that holds it. BM25 (Robertson
& Zaragoza 2009, Okapi: k1 = 1.5, b = 0.75, the IDF of rank_bm25's `BM25Okapi`, log((N − n + 0.5) / (n + 0.5)) with
negative values raised to 0.25 × the mean IDF) over the distinct question tokens, with N and n counted over the
document cut into passages of 2·radius tokens: a word every passage holds says nothing about where the answer is.
One change from rank_bm25: its floor for a negative IDF is 0.25 × the mean IDF, which is itself negative when most
words are in most passages (a document of one or two passages: every IDF is ≤ 0, and a passage would score *lower*
for holding the question's words); here the floor is never below 0, so such a document gets no prior at all.
Tokens are the model tokenizer's ids (subwords), as the BM25 distractors of `data/window_groups.py`; the question is
what precedes the document in a window, less the tokenizer's special tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from .data.features import QAFeature

K1, B, EPSILON = 1.5, 0.75, 0.25  # rank_bm25's BM25Okapi defaults
# Chosen on 300 validation questions (dev-side articles outside E7's test articles) from radii 32-256 and weights
# 0.05-1.0, the paragraph reader of `make qa-model` read whole in 512-token windows: F1 72.5 without, 76.4 with;
# then reported on E7's 336 test questions: 73.8 -> 78.1 (experiments/results/lexical_prior.md). From round 17 E7 scores
# all 28 dev-side articles, these 20 among them: its readings with the prior may be optimistic (docs/experiments/e7.md).
DEFAULT_WEIGHT, DEFAULT_RADIUS = 0.3, 64


def question_tokens(feature: QAFeature, special_ids: Iterable[int]) -> list[int]:
    """The distinct question token ids of a window (what precedes its first document token), in order."""
    special = set(special_ids)
    first = next((i for i, offset in enumerate(feature.offsets) if offset is not None), len(feature.input_ids))
    return list(dict.fromkeys(t for t in feature.input_ids[:first] if t not in special))


def document_sequence(features: list[QAFeature]) -> tuple[np.ndarray, dict[int, int]]:
    """One question's document as a token sequence, rebuilt from its windows (overlapping windows hold the same
    tokenization of the same text, so a token is known by its first character): the ids in document order and a map
    from a token's first character to its place in that order."""
    tokens: dict[int, int] = {}
    for feature in features:
        for token, offset in zip(feature.input_ids, feature.offsets):
            if offset is not None:
                tokens.setdefault(offset[0], token)
    starts = sorted(tokens)
    return np.array([tokens[s] for s in starts], dtype=np.int64), {s: i for i, s in enumerate(starts)}


class PassageScorer:
    """BM25 of the question against the passage of `radius` tokens either side of any document position."""

    def __init__(self, document: np.ndarray, question: list[int], radius: int):
        if radius < 1:
            raise ValueError(f"the lexical radius is at least 1 token; got {radius}")
        self.length, self.radius = len(document), radius
        width = 2 * radius
        passages = [document[i:i + width] for i in range(0, max(len(document), 1), width)]
        # IDF over the passages of this document (rank_bm25's BM25Okapi: negative IDFs raised to EPSILON × mean, here
        # never below 0: a word in most passages says nothing about where the answer is, never "not here")
        counts = {}
        for passage in passages:
            for token in set(passage.tolist()):
                counts[token] = counts.get(token, 0) + 1
        idf = {t: math.log((len(passages) - n + 0.5) / (n + 0.5)) for t, n in counts.items()}
        floor = max(0.0, EPSILON * (sum(idf.values()) / len(idf))) if idf else 0.0
        self.average_length = sum(len(passage) for passage in passages) / len(passages) or 1.0
        # per question token present in the document: its IDF and the running count of it along the document
        self.terms = [(idf[t] if idf[t] >= 0 else floor,
                       np.concatenate([[0], np.cumsum(document == t)])) for t in question if t in idf]

    def __call__(self, position: int) -> float:
        low, high = max(0, position - self.radius), min(self.length, position + self.radius)
        norm = K1 * (1 - B + B * (high - low) / self.average_length)
        score = 0.0
        for idf, running in self.terms:
            frequency = float(running[high] - running[low])
            score += idf * frequency * (K1 + 1) / (frequency + norm)
        return score


@dataclass(frozen=True)
class LexicalPrior:
    """`weight` × BM25 of the passage around a span's start, added to the span's score across windows."""

    weight: float = DEFAULT_WEIGHT
    radius: int = DEFAULT_RADIUS
    special_ids: frozenset[int] = frozenset()  # the tokenizer's special tokens: never question words

    def __post_init__(self):
        if self.weight < 0:
            raise ValueError(f"the lexical weight must be 0 (off) or more; got {self.weight}")
        if self.radius < 1:
            raise ValueError(f"the lexical radius is at least 1 token; got {self.radius}")

    def for_question(self, features: list[QAFeature]) -> Callable[[QAFeature, int], float]:
        """What a span starting at token `start` of window `feature` (one of `features`, all of one question) adds
        to its score."""
        document, place = document_sequence(features)
        scorer = PassageScorer(document, question_tokens(features[0], self.special_ids), self.radius)
        cache: dict[int, float] = {}

        def prior(feature: QAFeature, start: int) -> float:
            position = place[feature.offsets[start][0]]
            if position not in cache:
                cache[position] = self.weight * scorer(position)
            return cache[position]

        return prior

    @classmethod
    def of(cls, tokenizer, weight: float = DEFAULT_WEIGHT, radius: int = DEFAULT_RADIUS) -> LexicalPrior | None:
        """The prior for a model read with `tokenizer` (its special tokens are never question words); None when
        `weight` is 0 (off). A negative weight or a radius below 1 is refused, off or not."""
        prior = cls(weight, radius, frozenset(tokenizer.all_special_ids))
        return None if weight == 0 else prior
