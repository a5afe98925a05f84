"""Distillation from the sliding reader: a short paragraph reader's span distributions over a long window, read in
sliding windows and merged, as soft targets for a long reader (issue 24; none of the three papers does this).

A long reader fine-tuned on a few hundred long windows forgets what the short reader it came from knew. The short
reader can still read any long window the slow way, in overlapping windows of its own length, so its knowledge can be
handed to the long reader on the very inputs the long reader trains on: for each training window of the long reader
(`[CLS] question [SEP] document part [SEP]`) the teacher reads the document part in windows of `window_length` tokens
sharing `doc_stride` tokens, with the same question, and its scores are merged onto the long window's positions.

Merging (what makes scores of different teacher windows comparable):
- start: each document token takes its score from the teacher window in which it has the most context on both
  sides (BERT's SQuAD "max context" rule: max over windows of min(left, right) + 0.01 * window size). The score is
  null-relative, start_logit(t) - start_logit([CLS]) of that window, the rule `qa.DEFAULT_SCORING` chose by
  measurement for ranking spans across windows; the long window's `[CLS]` gets 0, the teacher's "not here".
  Target: P_T(start = t) = softmax_t(score / T) over `[CLS]` and the document tokens.
- end, conditional head (LittleBird A.2): the student's end distribution is conditioned on the gold start, so the
  target is the teacher's P(end | gold start) from the max-context window of the gold start, over the document
  tokens from the start to that window's end. Rows whose gold start is not in the long window get no end target.
- end, linear head: merged like the start (end_logit(t) - end_logit([CLS])).

Loss (Hinton et al. 2015): (1 - weight) * the gold cross-entropy + weight * T^2 * (KL(P_T^start || P_S^start) +
KL(P_T^end || P_S^end)) / 2, the student's distributions taken over the same support as the teacher's (so a student
equal to its teacher on a window the teacher reads whole has zero divergence; tests/test_sliding_teacher.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..data.batching import PaddedBatches
from ..data.windows import PairTemplate, window_ranges
from .trainer import LongBirdTrainer

QUESTION_TOKENS = "question_tokens"  # the item field that says where the question ends (data/windows.QAWindows)


def max_context_windows(length: int, ranges: list[tuple[int, int]]) -> np.ndarray:
    """(length,) index of the window of `ranges` in which each token has the most context (BERT's SQuAD rule:
    max of min(tokens left, tokens right) + 0.01 * window size; the first such window on ties)."""
    best = np.full(length, -1, dtype=np.int64)
    best_score = np.full(length, -np.inf)
    for index, (begin, stop) in enumerate(ranges):
        tokens = np.arange(begin, stop)
        score = np.minimum(tokens - begin, stop - 1 - tokens) + 0.01 * (stop - begin)
        better = score > best_score[begin:stop]
        best[begin:stop][better] = index
        best_score[begin:stop][better] = score[better]
    if (best < 0).any():
        raise ValueError("the windows do not cover the document")
    return best


@dataclass
class TeacherTargets:
    """Log-probabilities (B, L) over the long windows' positions (-inf outside the support); `has_end` (B,) bool
    says which rows have an end target."""

    start: torch.Tensor
    end: torch.Tensor
    has_end: torch.Tensor


class SlidingTeacher:
    """A short QA reader that reads long windows in sliding windows of its own length and merges its scores (module
    docstring). `template`: the tokenizer's pair layout (shared by teacher and student: one tokenizer)."""

    def __init__(self, model, template: PairTemplate, window_length: int = 512, doc_stride: int = 128,
                 temperature: float = 1.0, batch_size: int = 8, token_types: bool = False):
        if temperature <= 0:
            raise ValueError(f"the distillation temperature must be positive; got {temperature}")
        limit = model.config.max_position_embeddings
        if not 1 <= window_length <= limit:
            raise ValueError(f"the teacher reads windows of at most {limit} tokens; got {window_length}")
        self.model = model.eval().requires_grad_(False)
        self.template = template
        self.window_length, self.doc_stride = window_length, doc_stride
        self.temperature, self.batch_size, self.token_types = temperature, batch_size, token_types
        self.conditional = model.config.qa_head == "conditional"
        pad = model.config.pad_token_id
        self.collate = PaddedBatches(pad if pad is not None else 0)

    def _windows(self, ids: list[int], question_tokens: int, gold_start: int | None):
        """The teacher windows of one long window: (question, document ids, document ranges, teacher items)."""
        prefix, middle, suffix = (len(self.template.prefix), len(self.template.middle), len(self.template.suffix))
        question = ids[prefix:prefix + question_tokens]
        document = np.asarray(ids[prefix + question_tokens + middle:len(ids) - suffix], dtype=np.int64)
        room = self.window_length - question_tokens - self.template.special_tokens
        if room < 2 or not 0 <= self.doc_stride < room:
            raise ValueError(f"teacher windows of {self.window_length} tokens hold {room} document tokens after a "
                             f"{question_tokens}-token question: doc_stride {self.doc_stride} must lie in "
                             f"0..{room - 1}")
        ranges = window_ranges(len(document), room, self.doc_stride)
        before = prefix + question_tokens + middle
        items = []
        for begin, stop in ranges:
            item = self.template.assemble(question, document[begin:stop], self.token_types)
            inside = gold_start is not None and begin <= gold_start < stop
            item["start_positions"] = before + gold_start - begin if inside else 0  # conditions the end head
            item["end_positions"] = item["start_positions"]
            items.append(item)
        return document, ranges, before, items

    @torch.no_grad()
    def _logits(self, items: list[dict]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(start logits, end logits) per teacher window, fp32 on the CPU, over its real tokens."""
        out = []
        device = next(self.model.parameters()).device
        for begin in range(0, len(items), self.batch_size):
            chunk = items[begin:begin + self.batch_size]
            batch = {k: v.to(device) for k, v in self.collate(chunk).items()}
            result = self.model(**batch, top_k=1, return_dict=True)
            for row, item in enumerate(chunk):
                n = len(item["input_ids"])
                out.append((result.start_logits[row, :n].float().cpu(), result.end_logits[row, :n].float().cpu()))
        return out

    def targets(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, question_tokens: torch.Tensor,
                start_positions: torch.Tensor) -> TeacherTargets:
        """The teacher's merged log-probabilities over the positions of a batch of long windows."""
        batch, length = input_ids.shape
        start = torch.full((batch, length), float("-inf"))
        end = torch.full((batch, length), float("-inf"))
        has_end = torch.zeros(batch, dtype=torch.bool)
        for row in range(batch):
            ids = input_ids[row, :int(attention_mask[row].sum())].tolist()
            q = int(question_tokens[row])
            gold = int(start_positions[row])
            doc_begin = len(self.template.prefix) + q + len(self.template.middle)
            # the gold start in document coordinates, None when the answer is not in this long window
            gold_start = gold - doc_begin if doc_begin <= gold < len(ids) - len(self.template.suffix) else None
            document, ranges, before, items = self._windows(ids, q, gold_start)
            logits = self._logits(items)
            owner = max_context_windows(len(document), ranges)
            scores = torch.empty(len(document))
            end_scores = torch.empty(len(document))
            for index, (begin, stop) in enumerate(ranges):
                mine = torch.from_numpy(np.flatnonzero(owner[begin:stop] == index))
                window_start, window_end = logits[index]
                scores[begin + mine] = window_start[before + mine] - window_start[0]
                end_scores[begin + mine] = window_end[before + mine] - window_end[0]
            start[row, 0] = 0.0
            start[row, doc_begin:doc_begin + len(document)] = scores / self.temperature
            if not self.conditional:
                end[row, 0] = 0.0
                end[row, doc_begin:doc_begin + len(document)] = end_scores / self.temperature
                has_end[row] = True
            elif gold_start is not None:
                index = int(owner[gold_start])
                begin, stop = ranges[index]
                window_end = logits[index][1]
                span = torch.arange(gold_start, stop)
                end[row, doc_begin + span] = window_end[before + span - begin] / self.temperature
                has_end[row] = True
        return TeacherTargets(torch.log_softmax(start, -1), torch.log_softmax(end, -1), has_end)


def divergence(teacher_log_probs: torch.Tensor, student_logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean over `rows` of KL(P_T || P_S), the student's logits (B, L) normalised over the teacher's support."""
    teacher = teacher_log_probs.to(student_logits.device)
    support = torch.isfinite(teacher) & rows.to(student_logits.device)[:, None]
    if not support.any():
        return (student_logits.float() * 0.0).sum()  # keeps the graph: no row has a target (0 * logit, never inf * 0)
    student = torch.log_softmax(student_logits.float().masked_fill(~support, float("-inf")), -1)
    teacher, student = teacher.masked_fill(~support, 0.0), student.masked_fill(~support, 0.0)  # no inf - inf
    terms = torch.where(support, teacher.exp() * (teacher - student), torch.zeros_like(student))
    return terms.sum() / rows.sum().to(terms.device)


class TeacherTrainer(LongBirdTrainer):
    """`LongBirdTrainer` for distillation from a short reader (`SlidingTeacherTrainer` here, `CutTeacherTrainer` in
    training/cut_teacher.py): the teacher and its weight, checked, and the Hinton mix of the two losses."""

    def __init__(self, *args, teacher, teacher_weight: float = 0.5, **kwargs):
        if not 0.0 <= teacher_weight <= 1.0:
            raise ValueError(f"the teacher's weight must lie in [0, 1]; got {teacher_weight}")
        super().__init__(*args, **kwargs)
        if self.padding_insertion is not None:
            raise ValueError("distillation from a short reader cannot be combined with Padding Insertion (the gaps "
                             "would move the tokens the teacher scores); leave --padding-insertion out")
        self.teacher, self.teacher_weight = teacher, teacher_weight

    def mixed(self, gold: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
        """(1 - weight) * the gold loss + weight * T^2 * the soft one (Hinton et al. 2015)."""
        return (1 - self.teacher_weight) * gold + self.teacher_weight * self.teacher.temperature ** 2 * soft


class SlidingTeacherTrainer(TeacherTrainer):
    """`TeacherTrainer` whose soft targets are a `SlidingTeacher`'s merged ones (module docstring). Items carry
    `question_tokens` (`QAWindows(..., with_question_tokens=True)`)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        question_tokens = inputs.pop(QUESTION_TOKENS)
        outputs = model(**inputs, return_dict=True)
        targets = self.teacher.targets(inputs["input_ids"].cpu(), inputs["attention_mask"].cpu(), question_tokens.cpu(),
                                       inputs["start_positions"].cpu())
        every_row = torch.ones(len(question_tokens), dtype=torch.bool)
        temperature = self.teacher.temperature
        soft = (divergence(targets.start, outputs.start_logits / temperature, every_row)
                + divergence(targets.end, outputs.end_logits / temperature, targets.has_end)) / 2
        loss = self.mixed(outputs.loss, soft)
        return (loss, outputs) if return_outputs else loss
