"""bf16 inference with the encoder's Linear weights stored in bf16 (`precision.store_encoder_linears_in`).

Under bf16 autocast a Linear casts its fp32 weight and bias to bf16 at every call (round to nearest even, as `.to`
does) and multiplies in bf16, so storing them in bf16 once changes no arithmetic: the outputs must be equal bit for
bit, not close, for every preset and both QA heads, with padded rows and lengths above the source's. `Reader`,
`evaluate` and `answer` with `--bf16` load the model that way.
"""

from __future__ import annotations

import copy

import pytest
import torch

import longbird
from longbird.precision import bf16_autocast, store_encoder_linears_in
from longbird.reader import Reader
from longbird.tasks.qa import evaluate_qa
from conftest import BLOCK, SOURCE_LENGTH, make_batch, make_source
from test_qa_cli import PAGES, tiny_qa, tiny_source  # noqa: F401  (fixtures)

PRESETS = {"kobigbird": {}, "littlebird": {}, "tape": {}, "tape-bigbird": {"preset": "tape", "attention": "bigbird"},
           "full": {}}


def qa_model(preset: str, qa_head: str) -> longbird.LongBirdForQuestionAnswering:
    settings = {"preset": preset, **PRESETS[preset]}
    base = longbird.convert(make_source("bert"), max_length=4 * SOURCE_LENGTH, block_size=BLOCK, **settings)
    model = longbird.LongBirdForQuestionAnswering(base.config.__class__(**{**base.config.to_dict(),
                                                                           "qa_head": qa_head}))
    model.longbird.load_state_dict(base.state_dict())
    return model.eval()


def outputs(model, input_ids, attention_mask) -> dict:
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=input_ids, attention_mask=attention_mask)
    return {name: value for name, value in out.items() if isinstance(value, torch.Tensor)}


@pytest.mark.parametrize("qa_head", ["linear", "conditional"])
@pytest.mark.parametrize("preset", list(PRESETS))
def test_stored_bf16_linears_read_as_autocast_does_bit_for_bit(preset, qa_head):
    torch.manual_seed(0)
    model = qa_model(preset, qa_head)
    stored = store_encoder_linears_in(copy.deepcopy(model))
    input_ids, attention_mask = make_batch(3 * SOURCE_LENGTH + 5, batch=2)
    expected, got = outputs(model, input_ids, attention_mask), outputs(stored, input_ids, attention_mask)
    assert expected.keys() == got.keys() and "start_logits" in got
    for name in expected:
        assert got[name].dtype == expected[name].dtype and torch.equal(got[name], expected[name]), name


def test_only_the_encoders_linears_are_stored_in_bf16():
    model = store_encoder_linears_in(qa_model("kobigbird", "conditional"))
    linears = [m for m in model.longbird.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(p.dtype == torch.bfloat16 for m in linears for p in m.parameters())
    # the heads (the conditional end head adds its bias by hand), LayerNorm and the embeddings keep fp32
    assert all(p.dtype == torch.float32 for p in model.qa_end.parameters())
    assert model.longbird.embeddings.word_embeddings.weight.dtype == torch.float32
    assert all(p.dtype == torch.float32 for m in model.modules() if isinstance(m, torch.nn.LayerNorm)
               for p in m.parameters())


def test_the_bf16_reader_stores_them_and_answers_as_autocast_alone(tiny_qa):
    document = "서울은 대한민국의 수도이다. " * 40 + "부산은 항구 도시이다. " * 40
    stored = Reader(tiny_qa, bf16=True)
    assert stored.model.longbird.encoder.layer[0].attention.self.query.weight.dtype == torch.bfloat16
    plain = Reader(tiny_qa)
    autocast_alone = Reader.of(plain.model, plain.tokenizer, tiny_qa, bf16=True)
    a = stored.answer("대한민국의 수도는?", document, top_k=3)
    b = autocast_alone.answer("대한민국의 수도는?", document, top_k=3)
    assert a.answers and a.answers == b.answers


def test_bf16_autocast_off_leaves_the_callers_autocast_on():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with bf16_autocast("cpu", False):
            assert torch.is_autocast_enabled("cpu")  # torch.autocast(enabled=False) would switch it off
        with bf16_autocast("cpu", True):
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with bf16_autocast("cpu", False):
        assert not torch.is_autocast_enabled("cpu")


def test_evaluate_bf16_predicts_as_the_callers_autocast_does(tiny_qa):
    settings = {"data": [str(page) for page in PAGES], "data_format": "korquad2"}
    stored = evaluate_qa(tiny_qa, bf16=True, **settings)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast_alone = evaluate_qa(tiny_qa, **settings)
    assert stored["predictions"] == autocast_alone["predictions"] and stored["metrics"] == autocast_alone["metrics"]
