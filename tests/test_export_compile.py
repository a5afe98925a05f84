"""torch.export, ONNX and torch.compile for every preset (issue 11, item 6): each computes what eager longbird computes,
and tracing never leaves fake tensors in longbird's caches."""

from __future__ import annotations

import pytest
import torch

import longbird
from conftest import BLOCK, make_batch, make_source

PRESETS = ["kobigbird", "littlebird", "full"]


def _model(preset):
    return longbird.convert(make_source("bert"), preset=preset, max_length=256, block_size=BLOCK).eval()


@pytest.mark.parametrize("preset", PRESETS)
def test_torch_export_equals_eager_and_leaves_real_tensors_behind(preset):
    model = _model(preset)
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)  # sparse for kobigbird (L = 64)
    with torch.no_grad():
        eager = model(input_ids=input_ids).last_hidden_state
    exported = torch.export.export(model, (), {"input_ids": input_ids})
    torch.testing.assert_close(exported.module()(input_ids=input_ids)[0], eager, atol=1e-5, rtol=1e-5)
    # A fresh model in the same process: the pattern caches must hold real tensors, not the trace's fake ones.
    other_ids, other_mask = make_batch(150, batch=2)
    with torch.no_grad():
        fresh = _model(preset)(input_ids=other_ids, attention_mask=other_mask).last_hidden_state
        again = model(input_ids=input_ids).last_hidden_state
    assert type(fresh) is torch.Tensor and type(again) is torch.Tensor
    assert torch.equal(again, eager)


@pytest.mark.parametrize("preset", PRESETS)
def test_onnx_runtime_equals_pytorch(preset, tmp_path):
    pytest.importorskip("onnxscript", reason="ONNX export needs the onnx extra: pip install longbird[onnx]")
    onnxruntime = pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install longbird[onnx]")
    model = _model(preset)
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)
    mask = torch.ones_like(input_ids)
    with torch.no_grad():
        eager = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    path = tmp_path / f"{preset}.onnx"
    torch.onnx.export(model, (input_ids, mask), path, input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], dynamo=True)
    session = onnxruntime.InferenceSession(str(path))
    (out, *_) = session.run(None, {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()})
    assert abs(out - eager.numpy()).max() <= 1e-5


@pytest.mark.parametrize("preset", ["littlebird", "kobigbird"])
def test_torch_compile_equals_eager_with_the_per_row_plan(preset):
    model = _model(preset)
    input_ids, attention_mask = make_batch(200, batch=2)  # a padded row: the compiled model keeps per-row decisions
    with torch.no_grad():
        eager = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        compiled = torch.compile(model)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    real = attention_mask.bool()
    assert (compiled - eager)[real].abs().max() <= 1e-5
