"""Layout distillation on cuts: the paragraph reader reads each training cut of the long layout as a window of its
own, and its scores are soft targets for the long reader on the same tokens (issue 24, E7 round 12).

Why: E7 rounds 9-11 trained the long reader on 512-token cuts of its own layout (data/layout_cuts.py: the question
block, then 384 consecutive tokens with their whole-article position ids and regional nulls). Near the answer it then
reads at F1 76-77 where the same paragraph reader, read in sliding windows, reads at 80.9 before any training (round
10): the long layout (copied positions past 512, nulls, a question block that is not next to the text) costs what
the gold labels of 30 CPU minutes do not win back. A cut holds no more than a paragraph reader's window does, so the
reader can say, token by token, what it would score on the very same text in the layout it was trained in; the long
reader is asked to score the same in its own.

The teacher's window for a cut: the cut's tokens without its inserted nulls (its own [CLS] first), the tokenizer's
closing tokens appended when the cut does not end with them and they fit the teacher's positions, read with the
teacher's positions 0..n-1. Targets, in the cut's own positions:
- start: the teacher's null-relative scores s_T(t) - s_T([CLS]), the score the library ranks spans by across windows
  (`qa.DEFAULT_SCORING`), every null of the cut at 0. The soft loss mirrors the gold one (heads.py): per region,
  KL(P_T || P_S) over its null and its tokens, weighted as `regional_start_loss` weights regions; and, with
  `config.qa_ranking_weight` w, (1 - w) of it plus w of the KL over the softmax that `cross_region_ranking_loss`
  takes (every non-null token's null-relative score and one "no answer" at 0). The teacher reads the cut in one
  window, so its scores in different regions are comparable: it teaches the ranking across regions too.
  What each region's target is (`TARGETS`, `--teacher-targets`):
  - "null-relative": softmax over the region's null at 0 and its tokens' s_T. But the teacher's [CLS] reads the
    whole cut, so its "not here" is the window's: in a cut with the answer every token of every region scores high
    against it, and the target says a token beats the null in regions without the answer (E7 round 12 counted 121 of
    130 such regions, experiments/e7_teacher_nulls.py), where the gold labels say "null";
  - "within-region": the teacher's distribution over the region's own tokens, the null left to the gold labels, no
    soft ranking term;
  - "marginal": the teacher's one softmax over its window marginalised per region: each token keeps its
    probability, the null gets the rest (the answer starts elsewhere or nowhere), a region's "not here".
- end: the teacher's P(end | gold start) for the conditional head (LittleBird A.2; answered cuts only), its end
  distribution for the linear head, over the cut's non-null tokens (`sliding_teacher.divergence`).

Loss (Hinton et al. 2015): (1 - weight) * the gold loss + weight * T^2 * (soft start + soft end) / 2, as
`SlidingTeacherTrainer`. A student that reads a cut without nulls exactly as its teacher does has zero soft loss
(tests/test_cut_teacher.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..data.batching import PaddedBatches
from ..data.null_regions import NullRegions, is_null
from ..data.windows import PairTemplate
from ..precision import bf16_autocast, store_encoder_linears_in
from ..region_losses import IGNORE_INDEX, answer_regions, mean_over_regions, region_members
from .sliding_teacher import TeacherTrainer, divergence

MASKED = -1e30  # below this a head's logit is masked (heads._masked fills the dtype's minimum)
TARGETS = ("null-relative", "within-region", "marginal")  # what the soft start loss asks of each region (docstring)


@dataclass
class CutTargets:
    """Per cut, in the cut's positions: `relative` (B, L) the teacher's null-relative start scores / T (0 at the nulls,
    -inf at padding); `end` (B, L) the teacher's end log-probabilities (-inf outside the support); `has_end` (B,)."""

    relative: torch.Tensor
    end: torch.Tensor
    has_end: torch.Tensor


class CutTeacher:
    """A short QA reader that reads every cut of a batch in one window of its own (module docstring)."""

    def __init__(self, model, template: PairTemplate, temperature: float = 1.0, bf16: bool = False,
                 start_targets: str = "null-relative"):
        if temperature <= 0:
            raise ValueError(f"the distillation temperature must be positive; got {temperature}")
        if start_targets not in TARGETS:
            raise ValueError(f"teacher targets {start_targets!r} are not one of {', '.join(TARGETS)}")
        self.start_targets = start_targets
        # Trainer's bf16 autocasts the student's forward only (accelerate wraps the prepared model), so the teacher
        # asks for its own, with its Linear weights stored in bf16 once (the same arithmetic: precision.py)
        self.model = model.eval().requires_grad_(False)
        self.bf16 = bf16
        if bf16:
            store_encoder_linears_in(self.model)
        self.template, self.temperature = template, temperature
        self.limit = model.config.max_position_embeddings
        self.conditional = model.config.qa_head == "conditional"
        pad = model.config.pad_token_id
        self.collate = PaddedBatches(pad if pad is not None else 0)

    def windows(self, batch: dict) -> tuple[list[dict], list[torch.Tensor]]:
        """The teacher's window of every cut (items for `PaddedBatches`) and, per cut, the cut positions of the
        teacher's tokens (the appended closing tokens have none)."""
        input_ids, valid = batch["input_ids"].cpu(), batch["attention_mask"].cpu().bool()
        region_nulls = batch.get("region_nulls")
        inserted = (torch.zeros_like(valid) if region_nulls is None
                    else is_null(region_nulls.cpu()) & (torch.arange(valid.shape[1]) > 0))  # the [CLS] stays
        types = batch.get("token_type_ids")
        suffix = list(self.template.suffix)
        items, kept = [], []
        for row in range(len(input_ids)):
            where = torch.nonzero(valid[row] & ~inserted[row]).flatten()
            ids = input_ids[row, where].tolist()
            if len(ids) > self.limit:
                raise ValueError(f"a cut holds {len(ids)} tokens besides its nulls and the teacher reads at most "
                                 f"{self.limit}: cut windows must not be longer than the teacher's windows")
            closing = suffix if ids[-len(suffix):] != suffix and len(ids) + len(suffix) <= self.limit else []
            gold = int(batch["start_positions"][row]) if "start_positions" in batch else 0
            start = int(torch.searchsorted(where, gold)) if gold > 0 else 0
            item = {"input_ids": ids + closing, "attention_mask": [1] * (len(ids) + len(closing)),
                    "start_positions": start, "end_positions": start}
            if types is not None:
                last = self.template.types[4] if self.template.types else 0
                item["token_type_ids"] = types[row].cpu()[where].tolist() + [last] * len(closing)
            items.append(item)
            kept.append(where)
        return items, kept

    @torch.no_grad()
    def targets(self, batch: dict) -> CutTargets:
        """The teacher's targets over the positions of a batch of cuts (module docstring)."""
        items, kept = self.windows(batch)
        device = next(self.model.parameters()).device
        with bf16_autocast(device.type, self.bf16):
            taught = self.model(**{k: v.to(device) for k, v in self.collate(items).items()}, top_k=1, return_dict=True)
        shape = batch["input_ids"].shape
        relative = torch.full(shape, float("-inf"))
        end = torch.full(shape, float("-inf"))
        has_end = torch.zeros(shape[0], dtype=torch.bool)
        valid = batch["attention_mask"].cpu().bool()
        for row, where in enumerate(kept):
            start_logits = taught.start_logits[row, :len(where)].float().cpu()
            end_logits = taught.end_logits[row, :len(where)].float().cpu()
            relative[row] = torch.where(valid[row], 0.0, float("-inf"))  # the nulls' 0
            relative[row, where] = (start_logits - start_logits[0]) / self.temperature
            if self.conditional and items[row]["start_positions"] == 0:
                continue  # P(end | gold start) needs a gold start in the cut
            allowed = end_logits > MASKED
            end[row, where[allowed]] = end_logits[allowed] / self.temperature
            has_end[row] = True
        return CutTargets(relative, torch.log_softmax(end, -1), has_end)


def region_targets(relative: torch.Tensor, region_nulls: torch.Tensor, valid: torch.Tensor,
                   targets: str = "null-relative", max_regions: int | None = None):
    """What each region of a batch of cuts is taught (module docstring): (nulls, exists, member, scores) as
    `region_losses.region_members` gives the first three (with `targets="within-region"` the nulls are no members), and
    `scores` (B, R, l) whose softmax over `member` is each region's target. `relative` (B, l): the teacher's
    null-relative scores (0 at the nulls). `targets="marginal"`: the teacher's one softmax over its window (every
    non-null token and its [CLS]) marginalised per region: a token keeps its probability, the region's null gets the
    rest, 1 - the region's tokens' sum, the probability that the answer starts anywhere else or nowhere: a region's
    "not here" instead of the window's (`TARGETS`)."""
    if targets not in TARGETS:
        raise ValueError(f"teacher targets {targets!r} are not one of {', '.join(TARGETS)}")
    nulls, exists, member = region_members(region_nulls, valid, max_regions)
    null_tokens = is_null(region_nulls)
    if targets == "within-region":
        member = member & ~null_tokens[:, None, :]
    if targets != "marginal":
        return nulls, exists, member, relative[:, None, :]
    positions = torch.arange(valid.shape[1], device=valid.device)
    window = valid & (~null_tokens | (positions == 0))  # what the teacher's softmax ran over
    log_p = relative.masked_fill(~window, float("-inf"))
    log_p = log_p - torch.logsumexp(log_p, -1, keepdim=True)
    rest = window[:, None, :] & ~(member & ~null_tokens[:, None, :])  # starts outside the region's tokens, or none
    log_null = torch.logsumexp(log_p[:, None, :].masked_fill(~rest, float("-inf")), -1)  # (B, R), stable
    return nulls, exists, member, torch.where(positions == nulls[..., None], log_null[..., None], log_p[:, None, :])


def regional_divergence(relative: torch.Tensor, start_logits: torch.Tensor, region_nulls: torch.Tensor | None,
                        valid: torch.Tensor, start_targets: torch.Tensor, max_regions: int | None = None,
                        ranking_weight: float = 0.0, targets: str = "null-relative") -> torch.Tensor:
    """The soft start loss (module docstring): per region KL(P_T || P_S) against `region_targets`, weighted as the
    gold regional loss, and with `ranking_weight` w, (1 - w) of it + w * the KL over the cross-region ranking softmax
    (none with `targets="within-region"`). `relative` (B, l): the teacher's null-relative scores (0 at the nulls);
    `start_logits` (B, l) the student's, already divided by the temperature; without `region_nulls` the window is one
    region ([CLS] its null)."""
    device = start_logits.device
    relative = relative.to(device)
    if region_nulls is None:
        region_nulls = torch.zeros_like(valid, dtype=torch.long)
    nulls, exists, member, teacher = region_targets(relative, region_nulls, valid, targets, max_regions)
    student = start_logits.float()

    def kl(teacher_scores: torch.Tensor, student_scores: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
        """KL over the last dimension within `support`. A row with no support (a region of a null alone) diverges by
        0: it reads its first element on both sides, so no softmax is all -inf (whose backward is NaN)."""
        first = torch.arange(support.shape[-1], device=support.device) == 0
        support = support | (~support.any(-1, keepdim=True) & first)
        teacher_log = torch.log_softmax(teacher_scores.masked_fill(~support, float("-inf")), -1)
        student_log = torch.log_softmax(student_scores.masked_fill(~support, float("-inf")), -1)
        teacher_log, student_log = teacher_log.masked_fill(~support, 0.0), student_log.masked_fill(~support, 0.0)
        terms = teacher_log.exp() * (teacher_log - student_log)  # no inf - inf outside the support
        return torch.where(support, terms, torch.zeros_like(terms)).sum(-1)

    per_region = kl(teacher, student[:, None, :], member)  # (B, R)
    kept, answered, positive = answer_regions(nulls, exists, region_nulls, start_targets)
    loss = mean_over_regions(per_region, exists, kept, answered, positive)
    if targets == "within-region" or not ranking_weight:
        return loss
    options = valid & ~is_null(region_nulls)
    student_relative = student - student.gather(1, region_nulls.clamp(min=0))
    no_answer = torch.zeros(len(student), 1, device=device)
    support = torch.cat([options, torch.ones_like(no_answer, dtype=torch.bool)], -1)
    ranked = kl(torch.cat([relative, no_answer], -1), torch.cat([student_relative, no_answer], -1), support)
    ranking = ranked.masked_fill(~kept, 0).sum() / kept.sum().clamp(min=1)
    return (1 - ranking_weight) * loss + ranking_weight * ranking


class CutTeacherTrainer(TeacherTrainer):
    """`TeacherTrainer` whose soft targets are a `CutTeacher`'s (module docstring)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs, return_dict=True)
        targets = self.teacher.targets(inputs)
        temperature = self.teacher.temperature
        config = self.model.config
        valid = inputs["attention_mask"].bool()
        start_targets = inputs["start_positions"].masked_fill(inputs["start_positions"] >= valid.shape[1],
                                                              IGNORE_INDEX)
        region_nulls = inputs.get("region_nulls")
        regional = region_nulls is not None  # else the cut is one region, its [CLS] the null
        start = regional_divergence(targets.relative, outputs.start_logits / temperature, region_nulls, valid,
                                    start_targets, NullRegions.max_regions(config, valid.shape[1]) if regional else 1,
                                    config.qa_ranking_weight if regional else 0.0, self.teacher.start_targets)
        soft = (start + divergence(targets.end, outputs.end_logits / temperature, targets.has_end)) / 2
        loss = self.mixed(outputs.loss, soft)
        return (loss, outputs) if return_outputs else loss
