"""`--compile` for reading (issue 27, item 3): a reader whose encoder is compiled in place answers as the eager one,
through the Python API and `longbird answer --compile`, and the compiled model keeps its state-dict keys."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

import longbird
from conftest import BLOCK, make_source
from longbird.cli import app as cli
from longbird.compilation import compile_encoder
from longbird.data.korquad import read_korquad_v2
from longbird.reader import Reader
from test_qa_cli import PAGES, tiny_qa, tiny_source  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def page():
    row = read_korquad_v2(PAGES[0])[0][0]
    return row["context"][:6000], row["question"]  # a few windows of the tiny model's 256 tokens


def test_a_compiled_reader_answers_as_the_eager_one(tiny_qa, page, tmp_path):
    document, question = page
    eager = Reader(tiny_qa).answer(question, document, is_html=True, top_k=3)
    compiled_reader = Reader(tiny_qa, compile=True)
    compiled = compiled_reader.answer(question, document, is_html=True, top_k=3)
    assert eager.windows > 1
    assert [(a["start"], a["end"]) for a in compiled.answers] == [(a["start"], a["end"]) for a in eager.answers]
    for got, expected in zip(compiled.answers, eager.answers):
        # fp32 logits of unit-scale states through Inductor's reordered sums: ~1e-6 relative, far below 1e-4
        assert got["score"] == pytest.approx(expected["score"], abs=1e-4)
    path = tmp_path / "page.html"
    path.write_text(document, encoding="utf-8")
    result = CliRunner().invoke(cli, ["answer", "--model", str(tiny_qa), "--document", str(path), "--question",
                                      question, "--json", "--compile"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert (record["start"], record["end"]) == (eager.answers[0]["start"], eager.answers[0]["end"])


@pytest.mark.parametrize("preset", ["kobigbird", "littlebird", "tape"])
def test_compile_encoder_keeps_the_state_dict(preset):
    model = longbird.convert(make_source("bert"), preset=preset, max_length=256, block_size=BLOCK).eval()
    keys = list(model.state_dict())
    assert compile_encoder(model) is model
    assert list(model.state_dict()) == keys  # saves as a plain model: no "_orig_mod." prefix


def test_finetune_qa_compile_trains_and_saves_a_plain_model(tiny_source, tmp_path):
    """`finetune-qa --compile` (Trainer's torch_compile): it trains, and what it saves is the plain model (no
    torch.compile wrapper prefix in the weights), which loads for reading. That the compiled steps compute the eager
    loss and gradients is test_compile_training.py (with dropout off; here dropout runs inside the compiled graph)."""
    from safetensors import safe_open

    out = tmp_path / "compiled"
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    result = CliRunner().invoke(cli, ["finetune-qa", "--model", str(tiny_source), "--preset", "kobigbird",
                                      "--max-length", "256", "--train", str(PAGES[0]), "--out", str(out),
                                      "--max-steps", "2", "--batch-size", "2", "--logging-steps", "1",
                                      "--negative-fraction", "0.5", "--compile"])
    assert result.exit_code == 0, result.output
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # the steps did run through torch.compile
    record = json.loads((out / "longbird_finetune.json").read_text())
    assert record["settings"]["compile"] is True
    losses = [entry["loss"] for entry in record["log_history"] if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    with safe_open(str(out / "model.safetensors"), "pt") as weights:
        names = list(weights.keys())
    assert names and not any("_orig_mod" in name for name in names)
    assert Reader(out).task == "qa"


def test_a_compiled_encoders_batches_are_padded_to_its_block_multiple():
    """compilation.batch_multiple: the encoder's block size once it is compiled (so every batch takes the same side of
    the encoder's own padding branch, on which torch.compile guards), None eagerly; PaddedBatches pads to it."""
    from longbird.compilation import batch_multiple
    from longbird.data.batching import PaddedBatches

    model = longbird.convert(make_source("bert"), preset="kobigbird", max_length=256, block_size=BLOCK).eval()
    assert batch_multiple(model) is None
    compile_encoder(model)  # compiles at its first call, not here
    assert batch_multiple(model) == BLOCK
    items = [{"input_ids": [5] * 9, "attention_mask": [1] * 9, "start_positions": 3},
             {"input_ids": [6] * 4, "attention_mask": [1] * 4, "start_positions": 0}]
    batch = PaddedBatches(1, BLOCK)(items)
    assert batch["input_ids"].shape == (2, 2 * BLOCK) and batch["attention_mask"].sum(1).tolist() == [9, 4]
    assert batch["input_ids"][0, 9:].eq(1).all() and batch["start_positions"].tolist() == [3, 0]
    assert PaddedBatches(1, BLOCK)(items[:1])["input_ids"].shape == (1, 2 * BLOCK)
    assert PaddedBatches(1)(items)["input_ids"].shape == (2, 9)


def _linear_ops(model, input_ids, attention_mask) -> set[str]:
    """The operators one call of `model` runs (torch.profiler), after a first call that compiles."""
    from torch.profiler import profile

    model(input_ids=input_ids, attention_mask=attention_mask)  # compiles
    with profile() as trace:
        model(input_ids=input_ids, attention_mask=attention_mask)
    return {event.key for event in trace.key_averages()}


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="needs a CPU that multiplies bf16")
def test_compile_encoder_freezes_bf16_weights_on_the_cpu_for_calls_without_autograd():
    """With the encoder's Linear weights in bf16 (`--bf16`), `compile_encoder` compiles with Inductor's freezing
    (compilation.frozen_calls): under no_grad the linears run as oneDNN's packed-weight ops with fused epilogues, no
    `aten::addmm` / `aten::mm` left, with the eager outputs: both round every product to bf16, in other orders and
    with GELU fused into the product, which can move a unit-scale state by a bf16 step (2^-8) before the next layer's
    products; over this model's two layers that stays within 2^-5 (2^-6 per layer, as in
    tests/test_cpu_kernel.py's compiled bf16 case)."""
    from longbird.compilation import encoder_is_frozen
    from longbird.precision import store_encoder_linears_in

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = store_encoder_linears_in(longbird.convert(make_source("bert"), preset="kobigbird", max_length=256,
                                                      block_size=BLOCK).eval())
    assert model.config.num_hidden_layers == 2
    input_ids = torch.randint(5, model.config.vocab_size, (2, 64))
    attention_mask = torch.ones_like(input_ids)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        eager = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        compile_encoder(model)
        assert encoder_is_frozen(model)
        ops = _linear_ops(model, input_ids, attention_mask)
        frozen = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    assert not ops & {"aten::addmm", "aten::mm", "aten::linear"}, ops
    assert "mkldnn::_linear_pointwise" in ops, ops
    assert (frozen.float() - eager.float()).abs().max().item() <= 2.0 ** -5


def test_compile_encoder_compiles_fp32_weights_without_freezing():
    """With fp32 weights `compile_encoder` compiles without freezing (frozen, the linears became MKL's packed
    `mkl::_mkl_linear`, slower than the plain compile in every fp32 cell of benchmarks/compile_freezing.py): the
    products stay `aten::addmm`, the outputs equal eager's within reordered fp32 sums of unit-scale LayerNorm'd
    states (~1e-6), and a call with autograd on has gradients."""
    from longbird.compilation import encoder_is_frozen

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = longbird.convert(make_source("bert"), preset="kobigbird", max_length=256, block_size=BLOCK).eval()
    input_ids = torch.randint(5, model.config.vocab_size, (2, 64))
    attention_mask = torch.ones_like(input_ids)
    with torch.no_grad():
        eager = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    compile_encoder(model)
    assert not encoder_is_frozen(model)
    with torch.no_grad():
        ops = _linear_ops(model, input_ids, attention_mask)
        compiled = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    assert ops & {"aten::addmm", "aten::mm"} and not ops & {"mkl::_mkl_linear", "mkldnn::_linear_pointwise"}, ops
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
    out = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    out.pow(2).mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)
    torch.testing.assert_close(out.detach(), eager, atol=1e-4, rtol=1e-4)
    assert not encoder_is_frozen(longbird.convert(make_source("bert"), preset="kobigbird", max_length=256,
                                                  block_size=BLOCK))  # not compiled: not frozen
