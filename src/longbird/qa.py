"""Long-document QA inference: run the windows, decode spans, merge windows, map answers to the source.

Within a window a candidate's raw score is start_logit + log p(end | start), the end distribution taken over the ends
that start allows, for the k best starts of a window and the k best allowed ends of each (LittleBird A.2: beam over
the top-k starts). Spans lie inside the document part of the window, end >= start, and are at most
`max_answer_tokens` long. Its text is always a substring of the original context: real HTML where the span crosses
tags, never tag-token markers.

Across windows raw start logits are not comparable: the start loss is a softmax over the positions of one window
(`[CLS]` included, the target of a window without the answer), blind to a constant added to every start logit of
that window. A scoring rule therefore adds one offset per window before the best candidate over all windows of a
question wins (`SCORING_RULES`; the default chosen by measurement, docs/qa.md, "Choosing the scoring rule"):
- "log-probability": log P(start) + log P(end | start), P(start) the window's softmax over all its tokens,
  `[CLS]` included: the span's probability in its window, so a window that believes "no answer here" scores low.
- "null-relative": the same minus log P([CLS]) = start_logit - start_logit[CLS] + log P(end | start): the span
  against the window's own "no answer" score (the SQuAD 2.0 null-score difference). A model with a window selector
  (`config.qa_selector_weight`, window_selector.py) adds its correction c_w to this offset.
- "logit": the raw score, the rule before 2026-11-24 (not comparable across windows; kept as an option).
Every rule is the raw score plus a per-window constant, so the order of candidates inside a window never changes.
On top of the rule, the lexical prior (lexical_prior.py, on by default where documents are read: `predict_rows`,
`Reader`) adds weight × BM25 of the passage around each span's start: the question's words near the span.
With regional nulls (`config.qa_null_every`, data/null_regions.py) a long window is scored as sliding windows are:
"null-relative" takes the start logit of the span's own region's null, "log-probability" the softmax over that
region (`WindowCandidates.region_offsets`: per start token, on top of the window's constant).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from .compilation import batch_multiple
from .data.batching import PaddedBatches, plan_batches
from .data.features import MAX_QUESTION_TOKENS, QAFeature, features_for_rows, whole_characters
from .data.html import ProcessedDocument
from .data.null_regions import NullRegions
from .lexical_prior import DEFAULT_RADIUS, DEFAULT_WEIGHT, LexicalPrior

SCORING_RULES = ("log-probability", "null-relative", "logit")
# Chosen on the training side of the by-article split (experiments/cross_window_scoring.py, 200 questions of
# training-side articles read whole in sliding 512-token windows: F1 59.1 null-relative, 46.7 logit, 40.1
# log-probability); only then reported on E4's dev questions.
DEFAULT_SCORING = "null-relative"


@dataclass
class Answer:
    text: str  # substring of the original context
    start: int  # character offsets in the original context
    end: int
    # the scoring rule's value (default null-relative: start − [CLS] start logit + log P(end | start)) plus the lexical
    # prior where one is used; higher wins
    score: float
    window_index: int = 0
    # P(start) · P(end | start) within the answer's window (its region with regional nulls: the conditional head's two
    # softmaxes); None for 'linear'
    probability: float | None = None
    lexical_prior: float = 0.0  # the lexical prior's part of `score` (0 without one)
    readable: str | None = None  # the span as the reader read it (`ProcessedDocument.readable`): an HTML answer's text


def decode_window(feature: QAFeature, start_top_index, end_top_logits, start_logits, top_k: int,
                  max_answer_tokens: int, normalise_ends: bool = True) -> list[tuple[float, int, int]]:
    """Candidate (score, start token, end token) spans of one window, best first.

    For each of the k best starts, the ends it allows (end >= start, at most `max_answer_tokens` tokens, inside the
    document) are masked *before* the top-k. With `normalise_ends` (the conditional-end head) a candidate scores
    start logit + log-softmax of the end logits over the ends allowed for that start: the conditional-end loss is
    blind to a per-start constant, so raw end logits are not comparable across starts (design.md §7).
    """
    length = len(feature.input_ids)
    document = torch.tensor([offset is not None for offset in feature.offsets[:length]])
    positions = torch.arange(length)
    candidates = []
    for rank, start in enumerate(start_top_index.tolist()):
        if start >= length or feature.offsets[start] is None:
            continue
        allowed = document & (positions >= start) & (positions - start < max_answer_tokens)
        ends = end_top_logits[rank, :length].float().masked_fill(~allowed, float("-inf"))
        if normalise_ends:
            ends = torch.log_softmax(ends, dim=-1)
        count = min(top_k, int(allowed.sum()))
        for end in ends.topk(count).indices.tolist():
            candidates.append((float(start_logits[start] + ends[end]), start, end))
    return sorted(candidates, reverse=True)


def _answer_bounds(text: str, begin: int, end: int) -> tuple[int, int]:
    """An answer's character span from its tokens' offsets: whole characters (`whole_characters`: a normalising
    tokenizer's offsets can end inside one), and never starting or ending with whitespace (a Metaspace token,
    "▁word" of XLM-R/SentencePiece, carries the space before the word in its offsets)."""
    begin, end = whole_characters(text, begin, end)
    while begin < end and text[begin].isspace():
        begin += 1
    while end > begin and text[end - 1].isspace():
        end -= 1
    return begin, end


def _document_tokens(features: list[QAFeature], length: int) -> torch.Tensor:
    """(B, l) bool: tokens of the document part, the only places an answer may start."""
    mask = torch.zeros(len(features), length, dtype=torch.bool)
    for row, feature in enumerate(features):
        mask[row, :len(feature.offsets)] = torch.tensor([offset is not None for offset in feature.offsets])
    return mask


def window_offset(start_logits: torch.Tensor, end_logits: torch.Tensor | None, scoring: str) -> float:
    """What `scoring` adds to every raw candidate score of one window (see the module docstring). `start_logits`
    (l,) are the window's start logits over its real tokens, `[CLS]` at 0; `end_logits` (l,) the linear head's
    independent end logits (None for the conditional head, whose end part is already a log-probability)."""
    if scoring not in SCORING_RULES:
        raise ValueError(f"unknown scoring rule {scoring!r}; use one of {', '.join(SCORING_RULES)}")
    if scoring == "logit":
        return 0.0
    parts = [start_logits.float()] + ([end_logits.float()] if end_logits is not None else [])
    if scoring == "log-probability":  # log-softmax over the window = logit - logsumexp
        return -sum(float(torch.logsumexp(part, -1)) for part in parts)
    return -sum(float(part[0]) for part in parts)  # null-relative: minus the [CLS] (no answer) score


@dataclass
class WindowCandidates:
    """One window's decoded candidates: raw (score, start, end) best first, and what each rule adds to them."""

    feature: QAFeature
    spans: list[tuple[float, int, int]]
    offsets: dict[str, float]
    log_start_normaliser: float | None  # -logsumexp of the start logits (conditional head), for `probability`
    # With regional nulls: per rule, what a span starting at each token adds on top of `offsets` (its region's null
    # or normaliser in place of the window's)
    region_offsets: dict[str, torch.Tensor] | None = None

    def offset(self, scoring: str, start: int) -> float:
        """What `scoring` adds to the raw score of a span starting at token `start`."""
        if self.region_offsets is None:
            return self.offsets[scoring]
        return self.offsets[scoring] + float(self.region_offsets[scoring][start])


def region_offsets(start_logits: torch.Tensor, region_nulls: list[int]) -> dict[str, torch.Tensor]:
    """Per start token and rule, the change from the window's offset to its region's (see `WindowCandidates`):
    null-relative subtracts the region's null logit instead of [CLS]'s, log-probability normalises over the region
    instead of the window. `start_logits` (l,) over the window's real tokens."""
    start = start_logits.float()
    nulls = torch.tensor(region_nulls)
    normaliser = torch.empty_like(start)
    for null in nulls.unique().tolist():
        region = nulls == null
        normaliser[region] = torch.logsumexp(start[region], -1)
    return {"null-relative": start[0] - start[nulls], "log-probability": torch.logsumexp(start, -1) - normaliser,
            "logit": torch.zeros_like(start)}


@dataclass
class WindowOutputs:
    """What the model gives for one window, on the CPU: the k best starts (k,), the end logits conditioned on each
    (k, l) (the linear head's one end row repeated) and the start logits (l,)."""

    start_top: torch.Tensor
    end_top: torch.Tensor
    start_logits: torch.Tensor
    selector: float = 0.0  # the window selector's correction to the null-relative offset (window_selector.py)


@torch.no_grad()
def run_windows(model, features: list[QAFeature], top_k: int,
                start_candidates: list[torch.Tensor] | None = None,
                max_answer_tokens: int | None = None) -> list[WindowOutputs]:
    """One forward pass over `features` as one padded batch (the per-row plan makes each row's outputs independent
    of the others and of the padding: tests/test_batch_independence.py). `start_candidates`: per feature a bool
    (len(input_ids),) that narrows where its k best starts may lie (within the document; E7's diagnosis reads an
    answer's neighbourhood only). `max_answer_tokens`: the longest span the decoding will read (default: the model's
    `qa_max_answer_tokens`); the conditional head computes no end beyond it (`ConditionalEndHead`'s `width`)."""
    model.eval()
    collate = PaddedBatches(model.config.pad_token_id if model.config.pad_token_id is not None else 0,
                            batch_multiple(model))
    batch = {name: tensor.to(model.device) for name, tensor in
             collate([feature.model_inputs() for feature in features]).items()}
    candidates = _document_tokens(features, batch["input_ids"].shape[1])
    if start_candidates is not None:
        for row, allowed in enumerate(start_candidates):  # past len(allowed) is padding: already False
            candidates[row, :len(allowed)] &= allowed
    candidates = candidates.to(model.device)
    if getattr(model.config, "linked_windows", False):  # the windows of one question are linked (linked_windows.py)
        batch["document_ids"] = torch.tensor(document_ids(features), device=model.device)
    out = model(**batch, return_dict=True, top_k=top_k, start_candidates=candidates,
                end_width=max_answer_tokens or model.config.qa_max_answer_tokens)
    selector = ([0.0] * len(features) if getattr(out, "selector_logits", None) is None
                else out.selector_logits.float().cpu().tolist())
    # Decoding is Python over a few candidates: on the CPU, whatever device the model ran on.
    start_top, end_top, start_logits = (t.float().cpu() if t.is_floating_point() else t.cpu()
                                        for t in (out.start_top_index, out.end_top_logits, out.start_logits))
    return [WindowOutputs(start_top[row], end_top[row], start_logits[row], selector[row])
            for row in range(len(features))]


def decode_outputs(model, feature: QAFeature, outputs: WindowOutputs, top_k: int | None = None,
                   max_answer_tokens: int | None = None) -> WindowCandidates:
    """One window's candidates from its outputs, with all rules' offsets. Only the `top_k` best starts are decoded
    (a batch run for a larger k holds the same best starts first: `topk` is sorted), so a window decodes the same
    whatever else its batch asked for."""
    top_k = top_k or model.config.qa_top_k
    max_answer_tokens = max_answer_tokens or model.config.qa_max_answer_tokens
    conditional = model.config.qa_head == "conditional"
    length = len(feature.input_ids)
    spans = decode_window(feature, outputs.start_top[:top_k], outputs.end_top[:top_k], outputs.start_logits, top_k,
                          max_answer_tokens, normalise_ends=conditional)
    ends = None if conditional else outputs.end_top[0, :length]
    offsets = {rule: window_offset(outputs.start_logits[:length], ends, rule) for rule in SCORING_RULES}
    offsets["null-relative"] += outputs.selector  # the selector corrects the window's "answer here" (0 without one)
    regions = (None if feature.region_nulls is None
               else region_offsets(outputs.start_logits[:length], feature.region_nulls))
    return WindowCandidates(feature, spans, offsets, offsets["log-probability"] if conditional else None, regions)


def score_windows(model, features: list[QAFeature], batch_size: int = 4, top_k: int | None = None,
                  max_answer_tokens: int | None = None, progress: bool = False,
                  start_candidates: list[torch.Tensor] | None = None) -> list[WindowCandidates]:
    """Run the model over `features` once and decode every window (all rules' offsets kept, so rules can be
    compared without running the model again), in the order given. Batches of at most `batch_size` windows of like
    length (`data.batching.plan_batches`: less padding). `start_candidates` as in `run_windows`, one per feature."""
    top_k = top_k or model.config.qa_top_k
    windows: list[WindowCandidates | None] = [None] * len(features)
    batches = (question_batches(features, batch_size) if getattr(model.config, "linked_windows", False)
               else plan_batches([len(feature.input_ids) for feature in features], max_windows=batch_size))
    for batch in tqdm(batches, desc="predicting", unit="batch", disable=not progress):
        chunk = [features[index] for index in batch]
        allowed = None if start_candidates is None else [start_candidates[index] for index in batch]
        outputs_of_batch = run_windows(model, chunk, top_k, allowed, max_answer_tokens)
        for row, (index, outputs) in enumerate(zip(batch, outputs_of_batch)):
            window = decode_outputs(model, features[index], outputs, top_k, max_answer_tokens)
            if allowed is not None:  # fewer allowed starts than k: the top-k filled up with others, which go
                window.spans = [span for span in window.spans if span[1] < len(allowed[row]) and allowed[row][span[1]]]
            windows[index] = window
    return windows


def document_ids(features: list[QAFeature]) -> list[int]:
    """Per feature, the index of its question (example id) in order of first appearance: the rows a model with linked
    windows links (linked_windows.py)."""
    seen: dict[str, int] = {}
    return [seen.setdefault(feature.example_id, len(seen)) for feature in features]


def question_batches(features: list[QAFeature], batch_size: int) -> list[list[int]]:
    """Batches that hold every window of a question (linked windows read each other, so a question is never split):
    whole questions in order while the batch holds at most `batch_size` windows; a question with more windows goes
    alone."""
    by_question: dict[str, list[int]] = {}
    for index, feature in enumerate(features):
        by_question.setdefault(feature.example_id, []).append(index)
    batches: list[list[int]] = []
    for indices in by_question.values():
        if batches and len(batches[-1]) + len(indices) <= batch_size:
            batches[-1].extend(indices)
        else:
            batches.append(list(indices))
    return batches


def merge_windows(windows: list[WindowCandidates], documents: dict[str, ProcessedDocument],
                  scoring: str = DEFAULT_SCORING, lexical: LexicalPrior | None = None) -> dict[str, Answer]:
    """Best answer per example id over all of its windows under `scoring`. `documents` maps example id -> its
    document. A span that maps to only tags or spaces gives way to the next candidate."""
    return {example: answers[0] for example, answers in rank_answers(windows, documents, scoring, 1, lexical).items()}


def rank_answers(windows: list[WindowCandidates], documents: dict[str, ProcessedDocument],
                 scoring: str = DEFAULT_SCORING, top_k: int = 1,
                 lexical: LexicalPrior | None = None, distinct: str = "place") -> dict[str, list[Answer]]:
    """The `top_k` best distinct answers per example id over all of its windows under `scoring`, best first (equal
    scores: the earlier window first). A span that maps to only tags or spaces gives way to the next candidate, and
    so does one that is not distinct from an answer above: with `distinct="place"` (what a person reading the list
    wants) one that overlaps it ("신중현", then "중현" and "현" are one place), with `distinct="span"` only the same
    span again (overlapping windows see it twice; E7's shortlists of a reader's candidates, e7_headroom.py).
    `lexical`: a lexical prior (lexical_prior.py) added to every span's score, the question's passage match."""
    if scoring not in SCORING_RULES:
        raise ValueError(f"unknown scoring rule {scoring!r}; use one of {', '.join(SCORING_RULES)}")
    if distinct not in ("place", "span"):
        raise ValueError(f"distinct must be 'place' or 'span'; got {distinct!r}")
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1; got {top_k}")
    priors = {}
    if lexical is not None and lexical.weight != 0:
        by_question: dict[str, list[QAFeature]] = {}
        for window in windows:
            by_question.setdefault(window.feature.example_id, []).append(window.feature)
        priors = {example: lexical.for_question(features) for example, features in by_question.items()}
    candidates: dict[str, list[tuple[float, int, WindowCandidates, float, int, int]]] = {}
    for order, window in enumerate(windows):
        prior = priors.get(window.feature.example_id)
        for raw, start, end in window.spans:
            bonus = prior(window.feature, start) if prior else 0.0
            score = raw + window.offset(scoring, start) + bonus
            candidates.setdefault(window.feature.example_id, []).append((score, -order, window, raw, start, end,
                                                                         bonus))
    ranked: dict[str, list[Answer]] = {}
    for example, found in candidates.items():
        document, answers = documents[example], []
        for score, _, window, raw, start, end, bonus in sorted(found, key=lambda c: (c[0], c[1]), reverse=True):
            feature = window.feature
            processed = _answer_bounds(document.text, feature.offsets[start][0], feature.offsets[end][1])
            span = document.to_source_span(*processed)
            if span is None or not document.source[span[0]:span[1]].strip():  # only tags or spaces: next candidate
                continue
            if any((answer.start, answer.end) == span if distinct == "span"
                   else answer.start < span[1] and span[0] < answer.end for answer in answers):
                continue
            # raw = start logit + log P(end | start); adding -logsumexp(start logits) gives log P(start)P(end | start)
            # (with regional nulls: P(start) within the span's region)
            probability = (None if window.log_start_normaliser is None else float(torch.exp(torch.tensor(
                raw + window.offset("log-probability", start)))))
            answers.append(Answer(document.source[span[0]:span[1]], span[0], span[1], score, feature.window_index,
                                  probability, bonus, document.readable(*processed)))
            if len(answers) == top_k:
                break
        if answers:
            ranked[example] = answers
    return ranked


def predict_features(model, features: list[QAFeature], documents: dict[str, ProcessedDocument],
                     batch_size: int = 4, top_k: int | None = None, max_answer_tokens: int | None = None,
                     scoring: str = DEFAULT_SCORING, progress: bool = False,
                     lexical: LexicalPrior | None = None) -> dict[str, Answer]:
    """Best answer per example id over all of its windows. `documents` maps example id -> its document;
    `max_answer_tokens` defaults to the model's `qa_max_answer_tokens`; `lexical` as in `rank_answers`."""
    if scoring not in SCORING_RULES:  # before the model runs, not after
        raise ValueError(f"unknown scoring rule {scoring!r}; use one of {', '.join(SCORING_RULES)}")
    windows = score_windows(model, features, batch_size, top_k, max_answer_tokens, progress)
    return merge_windows(windows, documents, scoring, lexical)


def row_features(model, tokenizer, rows: Sequence[dict], max_length: int, doc_stride: int | None = None,
                 max_windows: int | None = None, max_question_tokens: int = MAX_QUESTION_TOKENS,
                 window_limit: int | None = None) -> tuple[list[QAFeature], dict[str, ProcessedDocument]]:
    """The windows of dataset rows (KorQuAD reader schema) and each example id's processed document;
    `window_limit`: data.window_limit.TooManyWindows for a row with more windows."""
    cache: dict[tuple[str, bool], ProcessedDocument] = {}
    features = features_for_rows(tokenizer, rows, max_length, doc_stride, max_windows, with_labels=False,
                                 token_types=model.config.type_vocab_size >= 2,
                                 documents=cache, max_question_tokens=max_question_tokens,
                                 null_regions=NullRegions.of(model.config, tokenizer), window_limit=window_limit)
    return features, {row["id"]: cache[(row["context"], row["is_html"])] for row in rows}


def predict_rows(model, tokenizer, rows: Sequence[dict], max_length: int, doc_stride: int | None = None,
                 max_windows: int | None = None, batch_size: int = 4, max_answer_tokens: int | None = None,
                 scoring: str = DEFAULT_SCORING, progress: bool = False,
                 max_question_tokens: int = MAX_QUESTION_TOKENS, lexical_weight: float = DEFAULT_WEIGHT,
                 lexical_radius: int = DEFAULT_RADIUS) -> dict[str, Answer]:
    """Answers for dataset rows (KorQuAD reader schema). Unanswerable windows never win over a real span.
    `lexical_weight` (0: off) and `lexical_radius`: the lexical prior (lexical_prior.py) across places."""
    lexical = LexicalPrior.of(tokenizer, lexical_weight, lexical_radius)
    features, documents = row_features(model, tokenizer, rows, max_length, doc_stride, max_windows,
                                       max_question_tokens)
    return predict_features(model, features, documents, batch_size, max_answer_tokens=max_answer_tokens,
                            scoring=scoring, progress=progress, lexical=lexical)


def answer_question(model, tokenizer, document: str, question: str, is_html: bool, max_length: int | None = None,
                    doc_stride: int | None = None, max_answer_tokens: int | None = None,
                    scoring: str = DEFAULT_SCORING, max_question_tokens: int = MAX_QUESTION_TOKENS,
                    lexical_weight: float = DEFAULT_WEIGHT, lexical_radius: int = DEFAULT_RADIUS) -> Answer | None:
    """The best answer to `question` in `document` (plain text or HTML), or None if no span qualifies."""
    max_length = max_length or model.config.max_position_embeddings
    row = {"id": "question", "question": question, "context": document, "is_html": is_html}
    return predict_rows(model, tokenizer, [row], max_length, doc_stride, max_answer_tokens=max_answer_tokens,
                        scoring=scoring, max_question_tokens=max_question_tokens, lexical_weight=lexical_weight,
                        lexical_radius=lexical_radius).get("question")


def answer_record(answer: Answer | None, is_html: bool) -> dict:
    """The answer as a person reads it and a script parses it: `answer` (tags stripped for an HTML page),
    `source_text` (the raw span), `start`/`end` (character offsets into the document as given), `score` and
    `probability` (see `Answer`). Every field is None when no span was found."""
    if answer is None:
        return {"answer": None, "source_text": None, "start": None, "end": None, "score": None, "probability": None,
                "lexical_prior": None}
    from .data.html import visible_text

    if not is_html:
        readable = answer.text
    else:  # as the reader read the page; an answer made without its document: the span's text, tags dropped
        readable = answer.readable if answer.readable is not None else visible_text(answer.text)
    return {"answer": readable, "source_text": answer.text,
            "start": answer.start, "end": answer.end, "score": answer.score, "probability": answer.probability,
            "lexical_prior": answer.lexical_prior}
