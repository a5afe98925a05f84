"""The start losses of a QA window with regional nulls (data/null_regions.py): one softmax per region
(`regional_start_loss`), and the cross-region ranking term (`cross_region_ranking_loss`, E7 round 10); with the pieces
both share, which training/cut_teacher.py reuses. Targets use `IGNORE_INDEX` for a row that adds no loss."""

from __future__ import annotations

import torch

from .data.null_regions import is_null

IGNORE_INDEX = -100


def region_members(region_nulls: torch.Tensor, valid: torch.Tensor, max_regions: int | None = None):
    """The regions of a batch with regional nulls: (nulls (B, R), each region's null index, `l` where a row has fewer
    regions; exists (B, R) bool; member (B, R, l) bool, the tokens of each region, a row's missing regions padded with
    a one-token region at 0 so that no softmax over a region is all -inf, whose backward is NaN). `max_regions`: a
    bound known from the shapes (`NullRegions.max_regions`), so that nothing is read back to the host (a compiled
    training step keeps one graph); default: counted from the batch."""
    length = region_nulls.shape[1]
    positions = torch.arange(length, device=region_nulls.device)
    null_tokens = valid & is_null(region_nulls)
    count = min(length, max_regions) if max_regions is not None else int(null_tokens.sum(-1).max())
    nulls = torch.where(null_tokens, positions, length).sort(-1).values[:, :count]  # (B, R); `length`: no region
    exists = nulls < length
    member = valid[:, None, :] & (region_nulls[:, None, :] == nulls[:, :, None])  # (B, R, l)
    return nulls, exists, member | (~exists[..., None] & (positions == 0))


def answer_regions(nulls: torch.Tensor, exists: torch.Tensor, region_nulls: torch.Tensor,
                   start_targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(kept (B,), answered (B,), positive (B, R)): the rows with a target, those with the answer in the window, and
    the region holding the gold start."""
    kept = start_targets != IGNORE_INDEX
    target = start_targets.clamp(min=0)
    answered = kept & (target > 0)
    answer_region = region_nulls.gather(1, target[:, None])  # (B, 1)
    return kept, answered, exists & answered[:, None] & (nulls == answer_region)


def mean_over_regions(per_region: torch.Tensor, exists: torch.Tensor, kept: torch.Tensor, answered: torch.Tensor,
                      positive: torch.Tensor) -> torch.Tensor:
    """A batch's loss from per-region losses (B, R), weighted as `regional_start_loss` says: a row with the answer is
    the mean of its answer region's loss and the mean over its other regions, a row without it the mean over its
    regions; the mean is over the rows kept."""
    negative = exists & ~positive
    loss_positive = per_region.masked_fill(~positive, 0).sum(-1)
    loss_negative = per_region.masked_fill(~negative, 0).sum(-1) / negative.sum(-1).clamp(min=1)
    has_negative = negative.any(-1)
    row = torch.where(answered & has_negative, (loss_positive + loss_negative) / 2,
                      torch.where(answered, loss_positive, loss_negative))
    return row.masked_fill(~kept, 0).sum() / kept.sum().clamp(min=1)


def regional_start_loss(start_logits: torch.Tensor, region_nulls: torch.Tensor, valid: torch.Tensor,
                        start_targets: torch.Tensor, max_regions: int | None = None) -> torch.Tensor:
    """The start loss with regional nulls (data/null_regions.py): one softmax per region (its null and its tokens),
    as a sliding reader has one per window. The region holding the gold start targets it; every other region targets
    its own null, as a sliding window without the answer targets its [CLS]. A row's loss is the mean of its answer
    region's cross-entropy and the mean over its other regions (one region for the answer, as much weight for all the
    places it is not); a row without the answer (target 0) is the mean over its regions. Rows with an ignored target
    add nothing; the mean is over the rest.

    start_logits (B, l) float; region_nulls (B, l) long, the index of each token's null (a null is its own);
    valid (B, l) bool: the real tokens; start_targets (B,) long (IGNORE_INDEX: ignored). `max_regions`: as
    `region_members`."""
    nulls, exists, member = region_members(region_nulls, valid, max_regions)
    log_p = torch.log_softmax(start_logits.float()[:, None, :].masked_fill(~member, float("-inf")), -1)
    kept, answered, positive = answer_regions(nulls, exists, region_nulls, start_targets)
    target = start_targets.clamp(min=0)
    region_target = torch.where(positive, target[:, None], torch.where(exists, nulls, 0))
    loss = -log_p.gather(2, region_target[..., None]).squeeze(-1)
    return mean_over_regions(loss, exists, kept, answered, positive)


def cross_region_ranking_loss(start_logits: torch.Tensor, region_nulls: torch.Tensor, valid: torch.Tensor,
                               start_targets: torch.Tensor) -> torch.Tensor:
    """What decoding ranks, trained (issue 24, E7 round 10): one softmax over the null-relative start scores of every
    real non-null token of the window, z(t) - z(null(t)) with null(t) its own region's null (the score `qa.py` ranks
    spans by across regions), plus one "no answer" option at 0; the target is the gold start. The per-region loss
    (`regional_start_loss`) never compares two regions, as a sliding reader never compares two windows in training,
    so nothing it teaches makes a wrong span in the next region score below the answer; this term does. Only rows
    with the answer in the window count (a row without it is the regional loss's alone); the mean is over them.

    Shapes as `regional_start_loss`."""
    logits = start_logits.float()
    relative = logits - logits.gather(1, region_nulls.clamp(min=0))
    options = valid & ~is_null(region_nulls)
    ranked = torch.cat([relative.masked_fill(~options, float("-inf")), relative.new_zeros(len(relative), 1)], -1)
    target = start_targets.clamp(min=0)
    answered = (start_targets != IGNORE_INDEX) & (target > 0) & options.gather(1, target[:, None]).squeeze(1)
    loss = -torch.log_softmax(ranked, -1).gather(1, target[:, None]).squeeze(1)
    return loss.masked_fill(~answered, 0).sum() / answered.sum().clamp(min=1)
