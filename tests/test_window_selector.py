"""The window selector (window_selector.py, E7 round 15): zero at init, its loss against a loop, its weight in the
model's loss, where its gradient goes, decoding with it, conversion and training end to end."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import BLOCK, make_source
from test_linked_windows import linked_reader, set_gates, short_reader_by_cli, windows

import longbird
from longbird.conversion import reconvert
from longbird.heads import IGNORE_INDEX, LongBirdForQuestionAnswering
from longbird.window_selector import window_selector_loss

STARTS, ENDS = torch.tensor([7, 0, 0, 0, 3]), torch.tensor([9, 0, 0, 0, 4])  # documents: rows 0-2 and 3-4


def set_selector(model, seed: int = 5):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.qa_selector.weight.copy_(torch.randn(model.qa_selector.weight.shape, generator=generator) * 0.3)
        model.qa_selector.bias.fill_(0.4)


def test_a_fresh_selector_reads_exactly_as_no_selector_and_reconvert_adds_and_drops_it():
    ids, mask, documents = windows()
    plain = linked_reader(seed=1)
    set_gates(plain, 0.3)
    selected = reconvert(plain, qa_selector_weight=0.5)
    assert not selected.qa_selector.weight.any() and not selected.qa_selector.bias.any()
    got, expected = selected(ids, mask, document_ids=documents), plain(ids, mask, document_ids=documents)
    assert torch.equal(got.start_logits, expected.start_logits)
    assert torch.equal(got.end_top_logits, expected.end_top_logits)
    assert torch.equal(got.selector_logits, torch.zeros(5)) and expected.selector_logits is None
    # a model built with a selector (not reconverted) starts at zero too: _init_weights
    assert not linked_reader(qa_selector_weight=0.5).qa_selector.weight.any()
    back = reconvert(selected, qa_selector_weight=0)
    assert not hasattr(back, "qa_selector")


def _loop_selector(corrections, logits, valid, targets, documents):
    """Written out: per document with the answer, a cross-entropy over [logsumexp_{t > 0, valid} z_w(t) - z_w(0) +
    c_w for each window w with a kept target] + [0], the windows holding the gold start summed."""
    losses = []
    for document in documents.unique().tolist():
        scores, gold = [], []
        for row in range(len(documents)):
            if documents[row] != document or targets[row] == IGNORE_INDEX:
                continue
            real = [logits[row, t] for t in range(1, logits.shape[1]) if valid[row, t]]
            if int(targets[row]) > 0:
                gold.append(len(scores))
            scores.append(torch.logsumexp(torch.stack(real), 0) - logits[row, 0] + corrections[row])
        if not gold:
            continue
        scores = torch.stack(scores + [corrections.new_zeros(())])
        losses.append(torch.logsumexp(scores, 0) - torch.logsumexp(scores[gold], 0))
    return torch.stack(losses).mean()


def test_the_selector_loss_equals_its_loop_and_never_reaches_the_span_logits():
    generator = torch.Generator().manual_seed(3)
    logits = (3 * torch.randn(7, 20, generator=generator)).requires_grad_()
    corrections = torch.randn(7, generator=generator).requires_grad_()
    valid = torch.ones(7, 20, dtype=torch.bool)
    valid[2, 12:] = False
    valid[5, 9:] = False
    documents = torch.tensor([4, 4, 4, 7, 7, 9, 4])
    # the answer twice in document 4 (overlapping windows) beside an ignored row; document 7 has no answer
    targets = torch.tensor([5, 0, 3, 0, 0, 2, IGNORE_INDEX])
    got = window_selector_loss(corrections, logits, valid, targets, documents, IGNORE_INDEX)
    expected = _loop_selector(corrections, logits.detach(), valid, targets, documents)
    (grad,) = torch.autograd.grad(got, corrections, retain_graph=True)
    (expected_grad,) = torch.autograd.grad(expected, corrections)
    # a few log-sum-exps of about 20 fp32 terms of size ~3: rounding of order 1e-6
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-6)
    assert grad[6] == 0 and grad[3:5].abs().sum() == 0  # the ignored row and the document without the answer
    (span_grad,) = torch.autograd.grad(got, logits, allow_unused=True, materialize_grads=True)
    assert not span_grad.any()  # the stop-gradient: the span logits are what the selector corrects, not what it trains
    none = window_selector_loss(corrections, logits, valid, torch.zeros(7, dtype=torch.long), documents)
    assert none.item() == 0 and none.requires_grad


def test_the_model_adds_the_selector_loss_by_its_weight_and_the_selector_learns():
    ids, mask, documents = windows()
    model = linked_reader(qa_selector_weight=0.25)
    set_gates(model, 0.3)
    set_selector(model)
    out = model(ids, mask, document_ids=documents, start_positions=STARTS, end_positions=ENDS)
    start = torch.nn.functional.cross_entropy(out.start_logits.float(), STARTS)
    end = torch.nn.functional.cross_entropy(out.end_logits.float(), ENDS)
    selector = window_selector_loss(out.selector_logits, out.start_logits, mask.bool(), STARTS, documents)
    # the same fp32 terms summed in another order: rounding of order 1e-6
    torch.testing.assert_close(out.loss, (start + end) / 2 + 0.25 * selector, rtol=0, atol=1e-5)
    alone = model(ids, mask, start_positions=STARTS, end_positions=ENDS)  # no documents: nothing to select among
    torch.testing.assert_close(alone.loss, (torch.nn.functional.cross_entropy(alone.start_logits.float(), STARTS)
                                            + torch.nn.functional.cross_entropy(alone.end_logits.float(), ENDS)) / 2,
                               rtol=0, atol=1e-5)
    fresh = linked_reader(qa_selector_weight=0.25).train()
    fresh(ids, mask, document_ids=documents, start_positions=STARTS, end_positions=ENDS).loss.backward()
    assert fresh.qa_selector.weight.grad.abs().sum() > 0 and fresh.qa_selector.bias.grad.abs() > 0


def test_decoding_adds_the_correction_to_each_windows_null_relative_scores_only():
    from longbird import qa
    from longbird.data.features import QAFeature

    features = [QAFeature(example, [2, 5 + w, 6, 7 + 3 * w, 8 + e, 9], None,
                          [None, None, (0, 1), (1, 2), (2, 3), (3, 4)], window_index=w)
                for e, (example, count) in enumerate((("a", 3), ("b", 2))) for w in range(count)]
    model = linked_reader(qa_selector_weight=0.5)
    set_gates(model, 0.3)
    set_selector(model)
    outputs = qa.run_windows(model, features, top_k=2)
    ids = torch.tensor([feature.input_ids for feature in features])
    corrections = model(ids, torch.ones_like(ids), document_ids=torch.tensor([0, 0, 0, 1, 1])).selector_logits
    assert [o.selector for o in outputs] == pytest.approx(corrections.tolist(), abs=1e-6)
    assert len({round(o.selector, 4) for o in outputs}) == 5  # every window its own correction
    for feature, output in zip(features, outputs):
        window = qa.decode_outputs(model, feature, output, top_k=2)
        without = qa.decode_outputs(model, feature, qa.WindowOutputs(output.start_top, output.end_top,
                                                                     output.start_logits), top_k=2)
        assert window.offsets["null-relative"] == pytest.approx(without.offsets["null-relative"] + output.selector)
        for rule in ("log-probability", "logit"):
            assert window.offsets[rule] == without.offsets[rule]


def test_a_selector_needs_linked_windows_and_a_weight_in_range():
    with pytest.raises(ValueError, match="linked_windows=true or qa_selector_weight=0"):
        longbird.convert(make_source("bert"), max_length=256, block_size=BLOCK, qa_selector_weight=0.5)
    with pytest.raises(ValueError, match=r"qa_selector_weight must lie in \[0, 1\]"):
        longbird.convert(make_source("bert"), max_length=256, block_size=BLOCK, linked_windows=True,
                         qa_selector_weight=1.5)


def test_finetune_qa_trains_the_selector_at_the_gates_rate_and_answer_reads_with_it(tmp_path):
    runner, app, common, short = short_reader_by_cli(tmp_path)
    selected = tmp_path / "selected"
    result = runner.invoke(app, ["convert", str(short), "--out", str(selected), "--max-length", "256",
                                 "--set", "linked_windows=true", "--set", "qa_selector_weight=0.5"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "trained"
    result = runner.invoke(app, ["finetune-qa", "--model", str(selected), *common, "--out", str(out),
                                 "--linked-windows", "3", "--link-learning-rate", "0.01", "--linked-negatives",
                                 "lexical"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "longbird_finetune.json").read_text())["linked_groups"] == 3
    trained = LongBirdForQuestionAnswering.from_pretrained(out)
    # two Adam steps move a weight by at most about two learning rates: past 1e-3 only at the gates' 0.01, not at the
    # rows' rate (finetune-qa's default 5e-5)
    assert trained.qa_selector.weight.abs().max() > 1e-3 and trained.qa_selector.bias.abs() > 1e-3
    document = tmp_path / "page.txt"
    document.write_text("T-X 프로그램은 미국 공군의 고등훈련기 교체 사업이다. 초기 물량은 350대이다. " * 12,
                        encoding="utf-8")
    result = runner.invoke(app, ["answer", "--model", str(out), "--document", str(document), "--question",
                                 "초기 물량은 몇 대?", "--window-length", "64", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output[result.output.index('{"answer"'):])
    assert answer["answer"] and answer["answer"] in document.read_text(encoding="utf-8")
