"""The cross-region ranking term of the start loss (region_losses.py `cross_region_ranking_loss`, E7 round 10): against a loop
of plain cross-entropies over null-relative scores (values and gradients), what it sees that the per-region loss does
not (a constant added to one region), the rows it skips, and the model setting end to end with its refusals."""

import pytest
import torch
from conftest import BLOCK, assert_loss_equals_loop, make_source

import longbird
from longbird.heads import LongBirdForQuestionAnswering
from longbird.region_losses import IGNORE_INDEX, cross_region_ranking_loss, regional_start_loss

REGION_NULLS = torch.tensor([[0] * 6 + [6] * 5 + [11] * 9,  # three regions
                             [0] * 10 + [10] * 10,  # two
                             [0] * 20,  # one
                             [0] * 8 + [8] * 12])


def _valid():
    valid = torch.ones(4, 20, dtype=torch.bool)
    valid[1, 15:] = False  # padding
    valid[3, 12:] = False
    return valid


def _loop_loss(logits, region_nulls, valid, targets):
    """Written out: per answered row, a cross-entropy over [z(t) - z(null of t) for every real non-null t] + [0]."""
    rows = []
    for row in range(logits.shape[0]):
        target = int(targets[row])
        if target <= 0 or int(region_nulls[row, target]) == target:
            continue
        tokens = [t for t in range(logits.shape[1]) if valid[row, t] and int(region_nulls[row, t]) != t]
        scores = torch.stack([logits[row, t] - logits[row, int(region_nulls[row, t])] for t in tokens]
                             + [logits.new_zeros(())])
        rows.append(torch.nn.functional.cross_entropy(scores[None], torch.tensor([tokens.index(target)])))
    return torch.stack(rows).mean()


def test_the_ranking_term_is_one_cross_entropy_over_null_relative_scores_with_its_gradients():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 20, generator=generator, requires_grad=True)
    valid = _valid()
    # answers in the first, second and last region; a row without the answer (0) and an ignored one skip
    for targets in (torch.tensor([13, 0, 4, IGNORE_INDEX]), torch.tensor([2, 12, 0, 9]), torch.tensor([8, 3, 19, 11])):
        got = cross_region_ranking_loss(logits, REGION_NULLS, valid, targets)
        assert_loss_equals_loop(got, _loop_loss(logits, REGION_NULLS, valid, targets), logits, valid)


def test_it_weighs_a_distractor_in_another_region_against_the_answer_where_the_per_region_loss_cannot():
    """Under the per-region loss a token of a region without the answer is pushed below its own null whatever the
    answer scores; under the ranking term its push is the probability that it outranks the answer, so a higher answer
    score shrinks it. A constant added to the whole window changes neither loss."""
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 20, generator=generator)
    valid = _valid()
    targets = torch.tensor([13, 12, 4, 9])  # rows 0, 1, 3: the answer outside the first region
    distractor = 3  # a token of the first region of every row

    def distractor_grads(raise_answer: float):
        raised = logits.clone()
        raised[torch.arange(4), targets] += raise_answer
        raised.requires_grad_(True)
        regional, ranking = (torch.autograd.grad(loss(raised, REGION_NULLS, valid, targets), raised)[0][:, distractor]
                             for loss in (regional_start_loss, cross_region_ranking_loss))
        return regional, ranking

    regional, ranking = distractor_grads(0.0)
    regional_raised, ranking_raised = distractor_grads(3.0)
    answered_elsewhere = torch.tensor([0, 1, 3])
    torch.testing.assert_close(regional_raised[answered_elsewhere], regional[answered_elsewhere], rtol=0, atol=1e-7)
    assert (ranking[answered_elsewhere] > 0).all()  # pushed down
    # exp(-3) of the push is left, give or take the changed normaliser: well below half
    assert (ranking_raised[answered_elsewhere] < 0.5 * ranking[answered_elsewhere]).all()
    for loss in (regional_start_loss, cross_region_ranking_loss):
        torch.testing.assert_close(loss(logits + 3.0, REGION_NULLS, valid, targets),
                                   loss(logits, REGION_NULLS, valid, targets), rtol=0, atol=1e-5)


def test_rows_without_the_answer_add_nothing_and_a_batch_of_them_gives_zero_with_a_gradient_path():
    logits = torch.randn(4, 20, requires_grad=True)
    valid = _valid()
    for targets in (torch.zeros(4, dtype=torch.long), torch.full((4,), IGNORE_INDEX),
                    torch.tensor([6, 0, 0, 8])):  # the gold start on a null: no span starts there
        loss = cross_region_ranking_loss(logits, REGION_NULLS, valid, targets)
        assert float(loss.detach()) == 0.0 and loss.requires_grad


def _reader(**overrides):
    base = longbird.convert(make_source("bert"), max_length=256, block_size=BLOCK, qa_null_every=16, **overrides)
    model = LongBirdForQuestionAnswering(base.config)
    model.longbird.load_state_dict(base.state_dict())
    return model


def test_the_model_mixes_the_two_start_losses_by_its_weight_and_refuses_a_bad_one(tmp_path):
    model = _reader(qa_ranking_weight=0.25).eval()
    model.save_pretrained(tmp_path / "m")
    assert LongBirdForQuestionAnswering.from_pretrained(tmp_path / "m").config.qa_ranking_weight == 0.25
    generator = torch.Generator().manual_seed(2)
    input_ids = torch.randint(5, model.config.vocab_size, (2, 40), generator=generator)
    region_nulls = torch.tensor([[0] * 24 + [24] * 16, [0] * 30 + [30] * 10])
    input_ids[0, 24] = input_ids[1, 30] = input_ids[0, 0]  # nulls are [CLS] tokens; values do not matter here
    starts, ends = torch.tensor([27, 5]), torch.tensor([29, 6])
    out = model(input_ids, start_positions=starts, end_positions=ends, region_nulls=region_nulls)
    valid = torch.ones(2, 40, dtype=torch.bool)
    start = (0.75 * regional_start_loss(out.start_logits, region_nulls, valid, starts)
             + 0.25 * cross_region_ranking_loss(out.start_logits, region_nulls, valid, starts))
    end = torch.nn.functional.cross_entropy(out.end_logits.float(), ends)
    # the same fp32 terms summed in another order: rounding of order 1e-6
    torch.testing.assert_close(out.loss, (start + end) / 2, rtol=0, atol=1e-5)
    model.config.qa_ranking_weight = 0.0
    plain = model(input_ids, start_positions=starts, end_positions=ends, region_nulls=region_nulls)
    start = regional_start_loss(plain.start_logits, region_nulls, valid, starts)
    torch.testing.assert_close(plain.loss, (start + end) / 2, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=r"qa_ranking_weight must lie in \[0, 1\]"):
        _reader(qa_ranking_weight=1.5)
    with pytest.raises(ValueError, match=r"qa_ranking_weight ranks spans across regional nulls.*qa_null_every=0"):
        longbird.convert(make_source("bert"), max_length=256, block_size=BLOCK, qa_ranking_weight=0.5)
