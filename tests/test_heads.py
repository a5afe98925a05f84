"""The task heads follow transformers' conventions: tuples for return_dict=False (argument or config), the loss
`config.problem_type` names, labels no reading can produce ignored, and resize_token_embeddings on the MLM head."""

from __future__ import annotations

import pytest
import torch
from conftest import make_batch, make_source

from longbird import convert
from longbird.heads import (
    LongBirdForMaskedLM,
    LongBirdForQuestionAnswering,
    LongBirdForSequenceClassification,
)
from longbird.modeling import LongBirdModel
from test_qa_cli import tiny_qa, tiny_source  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def config():
    return convert(make_source("bert"), preset="kobigbird", max_length=256).config


def _model(cls, config, **overrides):
    torch.manual_seed(0)
    model = cls(config.__class__.from_dict({**config.to_dict(), **overrides})).eval()
    return model


@pytest.mark.parametrize("cls, labels", [
    (LongBirdModel, {}),
    (LongBirdForSequenceClassification, {"labels": torch.tensor([0, 1])}),
    (LongBirdForQuestionAnswering, {"start_positions": torch.tensor([3, 4]), "end_positions": torch.tensor([5, 9])}),
    (LongBirdForMaskedLM, {"labels": torch.randint(5, 99, (2, 64))}),
])
def test_return_dict_false_gives_the_outputs_tuple(config, cls, labels):
    input_ids, attention_mask = make_batch(64)
    model = _model(cls, config)
    as_dict = model(input_ids=input_ids, attention_mask=attention_mask, **labels)
    for as_tuple in (model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False, **labels),
                     _model(cls, config, return_dict=False)(input_ids=input_ids, attention_mask=attention_mask,
                                                            **labels)):
        assert isinstance(as_tuple, tuple)
        expected = as_dict.to_tuple()
        assert len(as_tuple) == len(expected) and all(torch.is_tensor(value) for value in as_tuple)
        for got, want in zip(as_tuple, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_problem_type_chooses_the_loss_as_transformers_does(config):
    input_ids, attention_mask = make_batch(64)
    regression = _model(LongBirdForSequenceClassification, config, num_labels=2, problem_type="regression")
    targets = torch.tensor([[2.0, -3.0], [0.5, 4.0]])
    out = regression(input_ids=input_ids, attention_mask=attention_mask, labels=targets)
    torch.testing.assert_close(out.loss, torch.nn.functional.mse_loss(out.logits, targets))
    multi = _model(LongBirdForSequenceClassification, config, num_labels=3, problem_type="multi_label_classification")
    hot = torch.tensor([[1, 0, 1], [0, 0, 1]])  # integer multi-hot labels, as datasets often give them
    out = multi(input_ids=input_ids, attention_mask=attention_mask, labels=hot)
    torch.testing.assert_close(out.loss, torch.nn.functional.binary_cross_entropy_with_logits(out.logits, hot.float()))
    single = _model(LongBirdForSequenceClassification, config, num_labels=3)  # unset: integer labels, one class
    out = single(input_ids=input_ids, attention_mask=attention_mask, labels=torch.tensor([2, 0]))
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, torch.tensor([2, 0])))


@pytest.mark.parametrize("qa_head", ["conditional", "linear"])
def test_qa_labels_no_reading_can_produce_are_ignored(config, qa_head):
    """An end before its start, or a start or end on padding, adds no loss, as a label outside the input does (the
    conditional head masks every end before the start: such a row's loss was about 3.4e38)."""
    input_ids, attention_mask = make_batch(64)  # row 1 is padded after attention_mask[1].sum() tokens
    padded_from = int(attention_mask[1].sum())
    model = _model(LongBirdForQuestionAnswering, config, qa_head=qa_head).train()
    torch.manual_seed(0)
    good = model(input_ids=input_ids[:1], attention_mask=attention_mask[:1], start_positions=torch.tensor([5]),
                 end_positions=torch.tensor([6])).loss
    for start, end in ((5, 3), (padded_from + 1, padded_from + 2), (5, padded_from + 1)):
        torch.manual_seed(0)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, start_positions=torch.tensor([5, start]),
                     end_positions=torch.tensor([6, end])).loss
        assert torch.isfinite(loss) and loss < 100
        torch.testing.assert_close(loss, good)  # the bad row is ignored: the loss is the good row's alone


def test_resize_token_embeddings_grows_the_mlm_bias_with_the_vocabulary(config):
    model = _model(LongBirdForMaskedLM, config)
    with torch.no_grad():
        model.lm_head.bias.normal_()
    before = model.lm_head.bias.detach().clone()
    input_ids, attention_mask = make_batch(32)
    logits_before = model(input_ids=input_ids, attention_mask=attention_mask).logits
    model.resize_token_embeddings(config.vocab_size + 10)
    assert model.lm_head.bias.shape == (config.vocab_size + 10,) == (model.config.vocab_size,)
    assert torch.equal(model.lm_head.bias[:config.vocab_size], before)
    assert torch.equal(model.lm_head.bias[config.vocab_size:], torch.zeros(10))
    logits = model(input_ids=torch.cat([input_ids, torch.full((2, 1), config.vocab_size + 9)], 1),
                   attention_mask=torch.cat([attention_mask, torch.ones(2, 1, dtype=torch.long)], 1)).logits
    assert logits.shape[-1] == config.vocab_size + 10
    model.resize_token_embeddings(config.vocab_size)  # and back: the original rows, the original outputs
    torch.testing.assert_close(model(input_ids=input_ids, attention_mask=attention_mask).logits, logits_before)


def test_positional_return_dict_false_gives_a_tuple_too(config):
    """@can_return_tuple reads the keyword only; the encoder's seventh argument is honoured by the encoder itself."""
    input_ids, attention_mask = make_batch(64)
    model = _model(LongBirdModel, config)
    assert isinstance(model(input_ids, attention_mask, None, None, None, None, False), tuple)


def test_a_model_saved_with_return_dict_false_still_reads(tiny_qa, tmp_path):
    """config.return_dict=False is saved in config.json; longbird's own readers ask for outputs by name."""
    import json
    import shutil

    from longbird.reader import Reader

    saved = tmp_path / "tuples"
    shutil.copytree(tiny_qa, saved)
    config = json.loads((saved / "config.json").read_text())
    (saved / "config.json").write_text(json.dumps({**config, "return_dict": False}))
    document = "서울은 대한민국의 수도이다. " * 40
    got = Reader(saved).answer("대한민국의 수도는?", document, top_k=2)
    want = Reader(tiny_qa).answer("대한민국의 수도는?", document, top_k=2)
    assert got.answers == want.answers
