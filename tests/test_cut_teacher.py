"""Layout distillation on cuts (training/cut_teacher.py): the teacher reads a cut without its nulls in one window,
its null-relative scores land on the cut's own positions (0 at every null), the soft start loss is the per-region KL
weighted as the gold regional loss (plus the cross-region ranking KL), a student that scores as its teacher does
diverges by rounding only, and `finetune-qa --cut-windows --teacher` trains with it end to end."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import VOCAB, assert_loss_equals_loop, kl_rounding_bound
from test_sliding_teacher import TEMPLATE, qa_model

from longbird.heads import IGNORE_INDEX
from longbird.training.cut_teacher import CutTeacher, regional_divergence
from longbird.training.sliding_teacher import divergence

NULL = 2  # the [CLS] id of TEMPLATE, which regional nulls copy


def random_ids(count: int, seed: int) -> list[int]:
    return torch.randint(5, VOCAB, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def cut_with_nulls(question: int = 4, head_doc: int = 6, regions: tuple[int, ...] = (5, 7, 3), seed: int = 0):
    """A cut as data/layout_cuts.py builds one: [CLS] q [SEP] + head document tokens, then a span that starts at a
    null, regions of the given sizes each after its null, no closing [SEP]; long-window position ids."""
    ids = [2, *random_ids(question, seed), 3, *random_ids(head_doc, seed + 1)]
    region_nulls = [0] * len(ids)
    for index, size in enumerate(regions):
        null = len(ids)
        ids += [NULL, *random_ids(size, seed + 2 + index)]
        region_nulls += [null] * (size + 1)
    positions = list(range(len(ids)))
    for index, null in enumerate(region_nulls):
        if null == index and index > 0:
            positions[index] = 0
        elif index >= question + 2 + head_doc:
            positions[index] += 100  # far in the article: what the teacher never sees
    return ids, region_nulls, positions


def batch_of(ids, region_nulls=None, positions=None, gold: int = 0) -> dict:
    batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
             "start_positions": torch.tensor([gold]), "end_positions": torch.tensor([gold])}
    if region_nulls is not None:
        batch["region_nulls"] = torch.tensor([region_nulls])
    if positions is not None:
        batch["position_ids"] = torch.tensor([positions])
    return batch


@pytest.mark.parametrize("qa_head", ["conditional", "linear"])
def test_a_cut_its_teacher_reads_as_it_does_diverges_by_rounding_only(qa_head):
    """No nulls, positions 0..n-1, closing [SEP] in: the teacher's window is the cut itself, so the targets are the
    model's own scores and the same model as student has zero soft loss up to fp32 rounding."""
    model = qa_model(qa_head)
    ids = [2, *random_ids(5, 0), 3, *random_ids(30, 1), 3]
    gold = 12
    batch = batch_of(ids, gold=gold)
    teacher = CutTeacher(model, TEMPLATE, temperature=2.0)
    items, kept = teacher.windows(batch)
    assert items[0]["input_ids"] == ids and kept[0].tolist() == list(range(len(ids)))
    targets = teacher.targets(batch)
    with torch.no_grad():
        out = model(**batch)
    torch.testing.assert_close(targets.relative[0], (out.start_logits[0] - out.start_logits[0, 0]) / 2.0,
                               atol=1e-5, rtol=0)
    bound = kl_rounding_bound(len(ids))
    start = regional_divergence(targets.relative, out.start_logits / 2.0, None, batch["attention_mask"].bool(),
                                batch["start_positions"])
    assert abs(float(start)) < bound
    assert bool(targets.has_end[0])
    assert abs(float(divergence(targets.end, out.end_logits / 2.0, targets.has_end))) < bound


def test_the_teacher_reads_a_cut_without_its_nulls_and_every_null_scores_zero():
    model = qa_model("conditional")
    ids, region_nulls, positions = cut_with_nulls()
    nulls = [i for i, null in enumerate(region_nulls) if null == i and i > 0]
    gold = nulls[1] + 3  # a token of the second inserted region
    batch = batch_of(ids, region_nulls, positions, gold)
    teacher = CutTeacher(model, TEMPLATE)
    items, kept = teacher.windows(batch)
    without = [token for i, token in enumerate(ids) if i not in nulls]
    assert items[0]["input_ids"] == [*without, 3]  # the closing [SEP] appended: the cut does not end with it
    assert kept[0].tolist() == [i for i in range(len(ids)) if i not in nulls]
    assert items[0]["start_positions"] == gold - 2  # two nulls precede the gold start
    targets = teacher.targets(batch)
    with torch.no_grad():
        own = model(input_ids=torch.tensor([[*without, 3]]), start_positions=torch.tensor([gold - 2]),
                    end_positions=torch.tensor([gold - 2]))
    expected = own.start_logits[0, :-1] - own.start_logits[0, 0]
    torch.testing.assert_close(targets.relative[0, kept[0]], expected, atol=1e-5, rtol=0)
    assert targets.relative[0, nulls].tolist() == [0.0] * len(nulls)
    # P(end | gold start), on the cut's non-null tokens from the gold start on (the appended [SEP] has no place)
    ends = own.end_logits[0, gold - 2:-1]
    support = kept[0][kept[0] >= gold]
    torch.testing.assert_close(targets.end[0, support], torch.log_softmax(ends, -1), atol=1e-5, rtol=0)
    assert torch.isinf(targets.end[0, nulls]).all() and torch.isinf(targets.end[0, :gold]).all()
    # a cut without the answer: a start target, no conditional end target
    negative = teacher.targets(batch_of(ids, region_nulls, positions, 0))
    assert not bool(negative.has_end[0]) and torch.isfinite(negative.relative[0]).all()


def weighted_as_the_gold_loss(kls: dict, answer: int | None) -> float:
    """One row's loss from per-region KLs {null: kl}: the answer region's against the mean of the others (or the mean
    of all without the answer), as region_losses.regional_start_loss weighs regions."""
    if answer is None:
        return sum(kls.values()) / len(kls)
    others = [kl for null, kl in kls.items() if null != answer]
    return (kls[answer] + sum(others) / len(others)) / 2 if others else kls[answer]


def kl_of(target: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """KL(target || softmax(scores)) in float64, differentiable in `scores`."""
    log_q = torch.log_softmax(scores.double(), 0)
    return (target * (target.log() - log_q)).sum()


def reference(relative, logits, region_nulls, target, weight):
    """The soft start loss of one unpadded row by loops, differentiable in `logits`: per region KL over its null and
    tokens, the answer region's against the mean of the others (or the mean of all without the answer), plus `weight`
    of the ranking KL."""
    kls = {}
    for null in sorted({int(n) for n in region_nulls}):
        members = [i for i, n in enumerate(region_nulls) if n == null]
        kls[null] = kl_of(torch.softmax(relative[members].double(), 0), logits[members])
    regional = weighted_as_the_gold_loss(kls, int(region_nulls[target]) if target > 0 else None)
    options = [i for i, n in enumerate(region_nulls) if n != i]
    zero = torch.zeros(1, dtype=torch.double)
    student = torch.cat([torch.stack([logits[i] - logits[region_nulls[i]] for i in options]).double(), zero])
    teacher = torch.cat([relative[options].double(), zero])
    return (1 - weight) * regional + weight * kl_of(torch.softmax(teacher, 0), student)


def padded_pair(first: tuple[int, ...], second: tuple[int, ...], seed: int):
    """Two cuts with regions of the given sizes in one batch, the shorter padded as the collator pads (region 0, not
    valid), garbage scores under the padding: (region_nulls lists, nulls (2, l), valid (2, l), relative, logits)."""
    cuts = [cut_with_nulls(regions=first)[1], cut_with_nulls(regions=second, seed=seed)[1]]
    length = max(map(len, cuts))
    nulls = torch.tensor([row + [0] * (length - len(row)) for row in cuts])
    valid = torch.tensor([[i < len(row) for i in range(length)] for row in cuts])
    generator = torch.Generator().manual_seed(seed)
    relative = torch.randn(2, length, generator=generator).masked_fill(nulls == torch.arange(length), 0.0)
    relative = relative.masked_fill(~valid, float("-inf"))  # CutTeacher.targets: -inf beyond the cut
    logits = (torch.randn(2, length, generator=generator) + 50.0 * ~valid).requires_grad_()
    return cuts, nulls, valid, relative, logits


@pytest.mark.parametrize("weight", [0.0, 0.5])
def test_the_soft_start_loss_is_the_per_region_kl_weighted_as_the_gold_loss(weight):
    """Value and gradient against the loop reference, over a batch whose second cut is shorter and padded (garbage
    student scores under its padding get no gradient and change nothing)."""
    cuts, nulls, valid, relative, logits = padded_pair((5, 7, 3), (4, 6), seed=3)
    targets = torch.tensor([20, 0])  # one row answered in a later region, one without the answer
    got = regional_divergence(relative, logits, nulls, valid, targets, ranking_weight=weight)
    expected = sum(reference(relative[r, :len(cuts[r])], logits[r, :len(cuts[r])], cuts[r], int(targets[r]), weight)
                   for r in range(2)) / 2
    assert_loss_equals_loop(got, expected.float(), logits, valid)
    ignored = regional_divergence(relative, logits, nulls, valid, torch.tensor([IGNORE_INDEX, 0]),
                                  ranking_weight=weight)
    expected_one = reference(relative[1, :len(cuts[1])], logits[1, :len(cuts[1])], cuts[1], 0, weight)
    assert_loss_equals_loop(ignored, expected_one.float(), logits, valid)  # a row without a target adds nothing


def test_within_region_targets_leave_the_nulls_to_the_gold_labels():
    """targets="within-region": per region the KL over its own tokens only (nulls out), no ranking term; a region
    that is a null alone adds 0 and no NaN to the gradient; padding gets none."""
    cuts, nulls, valid, relative, logits = padded_pair((5, 0, 7), (3, 6), seed=4)  # a null alone in the first
    targets = torch.tensor([cuts[0].index(cuts[0][-1]) + 2, 0])
    got = regional_divergence(relative, logits, nulls, valid, targets, ranking_weight=0.5, targets="within-region")
    expected = 0.0
    for row, region_nulls in enumerate(cuts):
        kls = {}
        for null in sorted(set(region_nulls)):
            members = [i for i, n in enumerate(region_nulls) if n == null and i != null]
            kls[null] = (kl_of(torch.softmax(relative[row, members].double(), 0), logits[row, members]) if members
                         else torch.zeros((), dtype=torch.double))
        expected = expected + weighted_as_the_gold_loss(
            kls, region_nulls[int(targets[row])] if targets[row] > 0 else None) / 2
    assert_loss_equals_loop(got, expected.float(), logits, valid)
    got = regional_divergence(relative, logits, nulls, valid, targets, ranking_weight=0.5, targets="within-region")
    got.backward()
    is_null = nulls == torch.arange(nulls.shape[1])
    assert float(logits.grad[is_null & valid].abs().sum()) == 0.0  # no null is taught by the teacher
    with pytest.raises(ValueError, match="marginal"):
        regional_divergence(relative, logits, nulls, valid, targets, targets="everything")


def test_marginal_targets_give_each_null_the_teachers_probability_that_the_answer_starts_elsewhere():
    """targets="marginal": the teacher's one window softmax (non-null tokens and its [CLS]); in region r a token keeps
    its probability and the null gets 1 - the region's sum. A teacher sure of one token in one region then gives every
    other region's null (nearly) all of that region, as the gold labels do. Values and gradients against the loop,
    over a padded batch."""
    cuts, nulls, valid, relative, logits = padded_pair((5, 7, 3), (4, 4), seed=6)
    sure = cuts[0].index(cuts[0][-1]) + 1  # a token of the first cut's last region
    with torch.no_grad():
        relative[0, sure] = 40.0
    targets = torch.tensor([sure, 0])
    got = regional_divergence(relative, logits, nulls, valid, targets, targets="marginal")
    expected = 0.0
    for row, region_nulls in enumerate(cuts):
        is_null = [n == i for i, n in enumerate(region_nulls)]
        window = [i for i in range(len(region_nulls)) if not is_null[i] or i == 0]
        p_of = dict(zip(window, torch.softmax(relative[row, window].double(), 0).tolist()))
        kls = {}
        for null in sorted(set(region_nulls)):
            tokens = [i for i, n in enumerate(region_nulls) if n == null and i != null]
            elsewhere = sum(p_of[i] for i in window if i not in tokens)  # = 1 - the region's sum, without cancelling
            target = torch.tensor([elsewhere] + [p_of[i] for i in tokens], dtype=torch.double)
            kls[null] = kl_of(target, logits[row, [null, *tokens]])
            if row == 0 and null != cuts[0][sure]:
                assert target[0] > 1 - 1e-9  # the teacher is sure the answer is elsewhere: "not here"
        expected = expected + weighted_as_the_gold_loss(
            kls, region_nulls[int(targets[row])] if targets[row] > 0 else None) / 2
    assert_loss_equals_loop(got, expected.float(), logits, valid)


def test_a_student_with_its_teachers_null_relative_scores_diverges_by_rounding_only():
    """Whatever constant each region adds (a region's softmax and the null-relative ranking cannot see it)."""
    ids, region_nulls, _ = cut_with_nulls(regions=(9, 4, 6))
    length = len(ids)
    nulls = torch.tensor([region_nulls])
    relative = torch.randn(1, length, generator=torch.Generator().manual_seed(5))
    relative = relative.masked_fill(nulls == torch.arange(length), 0.0)
    shift = torch.tensor([float(7 * n % 5) - 2.0 for n in region_nulls])
    student = relative + shift
    got = regional_divergence(relative, student, nulls, torch.ones(1, length, dtype=torch.bool), torch.tensor([0]),
                              ranking_weight=0.5)
    assert abs(float(got)) < kl_rounding_bound(length)


def test_bad_settings_are_named():
    model = qa_model("conditional")
    with pytest.raises(ValueError, match="temperature"):
        CutTeacher(model, TEMPLATE, temperature=0)
    too_long = [2, *random_ids(300, 0), 3]
    with pytest.raises(ValueError, match="at most 256"):
        CutTeacher(model, TEMPLATE).targets(batch_of(too_long))


def test_finetune_qa_on_cuts_distils_from_the_teacher_end_to_end(tmp_path, monkeypatch):
    """finetune-qa --cut-windows --teacher: the teacher reads every training cut in one window of its own, never
    longer than the cut, and its record lands in longbird_finetune.json."""
    from test_qa_cli import PAGES, write_tiny_source
    from typer.testing import CliRunner

    from longbird.cli import app
    from longbird.training import cut_teacher as module

    runner = CliRunner()
    source = write_tiny_source(tmp_path / "source")
    common = ["--model", str(source), "--preset", "kobigbird", "--max-length", "256", "--train", str(PAGES[0]),
              "--max-steps", "2", "--batch-size", "3", "--negative-fraction", "0.5"]
    short = tmp_path / "short"
    result = runner.invoke(app, ["finetune-qa", *common, "--window-length", "96", "--out", str(short)])
    assert result.exit_code == 0, result.output
    calls = []
    targets = module.CutTeacher.targets

    def counted(self, batch):
        calls.append((batch["input_ids"].shape, [len(item["input_ids"]) for item in self.windows(batch)[0]]))
        return targets(self, batch)

    monkeypatch.setattr(module.CutTeacher, "targets", counted)
    out = tmp_path / "cut"
    result = runner.invoke(app, ["finetune-qa", *common, "--out", str(out), "--cut-windows", "96", "--cut-overlap",
                                 "16", "--teacher", str(short), "--teacher-weight", "0.7"])
    assert result.exit_code == 0, result.output
    # at most the cut and its closing [SEP]
    assert len(calls) == 2 and all(shape[1] <= 96 and max(lengths) <= 97 for shape, lengths in calls)
    record = json.loads((out / "longbird_finetune.json").read_text())
    assert record["teacher"] == {"model": str(short), "reads": "each cut in one window", "weight": 0.7,
                                 "temperature": 1.0, "start_targets": "null-relative"}
    assert record["cut_windows"] == 96
    # teacher targets other than the default need a teacher on cuts, and must be one of the two
    for extra, message in ((["--teacher-targets", "within-region"], "--cut-windows"),
                           (["--teacher-targets", "within-region", "--teacher", str(short)], "--cut-windows"),
                           (["--teacher-targets", "all", "--teacher", str(short), "--cut-windows", "96"],
                            "not one of")):
        result = runner.invoke(app, ["finetune-qa", *common, "--out", str(tmp_path / "refused"), *extra])
        assert result.exit_code == 1 and message in result.output, result.output
        assert not (tmp_path / "refused").exists()
