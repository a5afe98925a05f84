"""Long-document QA inference: run the windows, decode spans, merge windows, map answers to the source.

A candidate's score is start_logit + end_logit(end | start), over the k best starts of a window and the
k best ends for each (LittleBird A.2: beam over the top-k starts). Spans lie inside the document part
of the window, end >= start, and are at most `max_answer_tokens` long. The best candidate over all
windows of a question wins. Its text is always a substring of the original context: real HTML where the
span crosses tags, never tag-token markers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from .data.features import QAFeature, features_for_rows
from .data.batching import PaddedBatches
from .data.html import ProcessedDocument

DEFAULT_MAX_ANSWER_TOKENS = 64


@dataclass
class Answer:
    text: str  # substring of the original context
    start: int  # character offsets in the original context
    end: int
    score: float
    window_index: int = 0


def decode_window(feature: QAFeature, start_top_index, end_top_logits, start_logits, top_k: int,
                  max_answer_tokens: int) -> list[tuple[float, int, int]]:
    """Candidate (score, start token, end token) spans of one window, best first."""
    length = len(feature.input_ids)
    candidates = []
    for rank, start in enumerate(start_top_index.tolist()):
        if start >= length or feature.offsets[start] is None:
            continue
        ends = end_top_logits[rank, :length]
        for end in ends.topk(min(top_k, length)).indices.tolist():
            if end < start or end - start + 1 > max_answer_tokens or feature.offsets[end] is None:
                continue
            candidates.append((float(start_logits[start] + ends[end]), start, end))
    return sorted(candidates, reverse=True)


def _document_tokens(features: list[QAFeature], length: int) -> torch.Tensor:
    """(B, l) bool: tokens of the document part, the only places an answer may start."""
    mask = torch.zeros(len(features), length, dtype=torch.bool)
    for row, feature in enumerate(features):
        mask[row, :len(feature.offsets)] = torch.tensor([offset is not None for offset in feature.offsets])
    return mask


@torch.no_grad()
def predict_features(model, features: list[QAFeature], documents: dict[str, ProcessedDocument],
                     batch_size: int = 4, top_k: int | None = None,
                     max_answer_tokens: int = DEFAULT_MAX_ANSWER_TOKENS, progress: bool = False) -> dict[str, Answer]:
    """Best answer per example id over all of its windows. `documents` maps example id -> its document."""
    model.eval()
    top_k = top_k or model.config.qa_top_k
    collate = PaddedBatches(model.config.pad_token_id if model.config.pad_token_id is not None else 0)
    best: dict[str, Answer] = {}
    batches = range(0, len(features), batch_size)
    for begin in tqdm(batches, desc="predicting", unit="batch", disable=not progress):
        chunk = features[begin:begin + batch_size]
        batch = collate([feature.model_inputs() for feature in chunk])
        out = model(**batch, top_k=top_k, start_candidates=_document_tokens(chunk, batch["input_ids"].shape[1]))
        for row, feature in enumerate(chunk):
            candidates = decode_window(feature, out.start_top_index[row], out.end_top_logits[row].float(),
                                       out.start_logits[row].float(), top_k, max_answer_tokens)
            document = documents[feature.example_id]
            for score, start, end in candidates:
                current = best.get(feature.example_id)
                if current is not None and current.score >= score:
                    break
                span = document.to_source_span(feature.offsets[start][0], feature.offsets[end][1])
                if span is None:  # only tag tokens: try the next candidate
                    continue
                best[feature.example_id] = Answer(document.source[span[0]:span[1]], span[0], span[1], score,
                                                  feature.window_index)
                break
    return best


def predict_rows(model, tokenizer, rows: Sequence[dict], max_length: int, doc_stride: int | None = None,
                 max_windows: int | None = None, batch_size: int = 4,
                 max_answer_tokens: int = DEFAULT_MAX_ANSWER_TOKENS, progress: bool = False) -> dict[str, Answer]:
    """Answers for dataset rows (KorQuAD reader schema). Unanswerable windows never win over a real span."""
    cache: dict[tuple[str, bool], ProcessedDocument] = {}
    features = features_for_rows(tokenizer, rows, max_length, doc_stride, max_windows, with_labels=False,
                                 documents=cache)
    documents = {row["id"]: cache[(row["context"], row["is_html"])] for row in rows}
    return predict_features(model, features, documents, batch_size, max_answer_tokens=max_answer_tokens,
                            progress=progress)


def answer_question(model, tokenizer, document: str, question: str, is_html: bool, max_length: int | None = None,
                    doc_stride: int | None = None, max_answer_tokens: int = DEFAULT_MAX_ANSWER_TOKENS) -> Answer | None:
    """The best answer to `question` in `document` (plain text or HTML), or None if no span qualifies."""
    max_length = max_length or model.config.max_position_embeddings
    row = {"id": "question", "question": question, "context": document, "is_html": is_html}
    return predict_rows(model, tokenizer, [row], max_length, doc_stride,
                        max_answer_tokens=max_answer_tokens).get("question")
