"""ONNX: `longbird export --format onnx`, one ONNX graph per saved model, with its head, a dynamic batch and a dynamic
length, whose rows ONNX Runtime reads as PyTorch reads each of them alone (docs/export.md); and `torch.onnx.export` of
every preset's encoder (issue 11, item 6), as ONNX Runtime reads it, equal to eager PyTorch, kobigbird fresh from disk
included, with dynamic lengths where the pattern allows them (their torch.export graphs: test_export_compile.py).
ONNX Runtime's kernels, not ATen's, are what these check, so .ci/run's second pass leaves the file out."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from typer.testing import CliRunner

import longbird
from conftest import make_batch, make_source
from longbird.cli import app as cli
from longbird.export import export_onnx
from longbird.heads import LongBirdForQuestionAnswering
from test_export_compile import DYNAMIC, PRESETS, _kobigbird_from_disk, _model
from test_qa_cli import tiny_qa, tiny_source  # noqa: F401  (fixtures)

onnxruntime = pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install longbird[onnx]")
onnx = pytest.importorskip("onnx", reason="needs the onnx extra: pip install longbird[onnx]")
pytest.importorskip("onnxscript", reason="ONNX export needs the onnx extra: pip install longbird[onnx]")


def _padded_batch(lengths, width, vocab, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab, (len(lengths), width), generator=generator)
    mask = torch.zeros_like(input_ids)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
        input_ids[row, length:] = 0
    return input_ids, mask


def test_a_qa_model_exports_one_graph_that_reads_every_row_as_pytorch_reads_it_alone(tiny_qa, tmp_path):
    out = tmp_path / "onnx"
    result = CliRunner().invoke(cli, ["export", str(tiny_qa), "--format", "onnx", "--out", str(out)])
    assert result.exit_code == 0, result.output
    # the exporter's step messages and warnings (about 16 lines) only with --verbose
    assert "[torch.onnx]" not in result.output and "Warning" not in result.output, result.output
    model = LongBirdForQuestionAnswering.from_pretrained(tiny_qa).eval()
    config = model.config
    record = json.loads((out / "longbird_onnx.json").read_text())
    block = config.block_size
    # kobigbird: block multiples above the full-attention threshold, up to the longest input
    assert record["lengths"] == {"shortest": (config.full_attention_threshold // block + 1) * block,
                                 "longest": config.max_position_embeddings, "multiple": block}
    assert record["architecture"] == "LongBirdForQuestionAnswering"
    assert record["outputs"][:2] == ["start_logits", "end_logits"]
    assert [check["batch"] for check in record["check"]] == [[2, record["lengths"]["shortest"] + block],
                                                              [2, record["lengths"]["longest"]]]
    assert all(max(check["max_abs_difference"].values()) <= 1e-5 for check in record["check"])
    assert (out / "tokenizer.json").is_file() or (out / "vocab.txt").is_file()
    # SDPA got the additive mask: no NaN guard after each softmax (with a bool mask, 29 % of ONNX Runtime's time)
    assert "IsNaN" not in {node.op_type for node in onnx.load(str(out / "model.onnx")).graph.node}
    session = onnxruntime.InferenceSession(str(out / "model.onnx"))
    longest, shortest = record["lengths"]["longest"], record["lengths"]["shortest"]
    # rows longer than the threshold (sparse: their own block counts), at it and below it (full attention), in batches
    # of the longest length and of the shortest one the graph takes
    threshold = config.full_attention_threshold
    for lengths, width in (([longest, longest - block - 5, threshold, 9], longest), ([shortest - 3, 20], shortest)):
        input_ids, mask = _padded_batch(lengths, width, config.vocab_size)
        start, end = session.run(["start_logits", "end_logits"],
                                 {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()})
        for row, length in enumerate(lengths):
            with torch.no_grad():
                alone = model(input_ids=input_ids[row:row + 1, :length])
            # unit-scale fp32 logits of the same products summed in another order: ~1e-6
            torch.testing.assert_close(torch.from_numpy(start[row, :length]), alone.start_logits[0], atol=1e-5,
                                       rtol=1e-5)
            torch.testing.assert_close(torch.from_numpy(end[row, :length]), alone.end_logits[0], atol=1e-5,
                                       rtol=1e-5)


def test_a_tape_encoder_exports_with_its_own_lengths(tmp_path):
    """(littlebird's dynamic ONNX graph: tests/test_export_compile.py, the same exporter call)"""
    model = longbird.convert(make_source("bert"), preset="tape", max_length=256).eval()
    model.save_pretrained(tmp_path / "tape")
    out = export_onnx(tmp_path / "tape", tmp_path / "onnx")
    record = json.loads((out / "longbird_onnx.json").read_text())
    assert record["lengths"] == {"shortest": 2, "longest": 256, "multiple": 1}
    assert record["outputs"][0] == "last_hidden_state"
    session = onnxruntime.InferenceSession(str(out / "model.onnx"))
    lengths = [150, 7]
    input_ids, mask = _padded_batch(lengths, lengths[0], model.config.vocab_size, seed=1)
    (hidden,) = session.run(["last_hidden_state"], {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        eager = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert abs(hidden[real.numpy()] - eager[real].numpy()).max() <= 1e-5


def test_a_littlebird_graph_takes_batches_with_more_elements_than_its_example(tmp_path, monkeypatch):
    """LittleBird's attention runs a few heads at a time, as many as fit a number of elements; under export that
    number, computed from the example's sizes, was fixed by a guard, and the graph refused any batch with more tokens
    (a 2,048-token model above 1,088 tokens). Here the budget is made small so that the example batch is already
    split: the graph must still read a longer batch, and the export checks one itself."""
    import longbird.attention.littlebird as usw

    model = longbird.convert(make_source("bert"), preset="littlebird", max_length=256, block_size=16).eval()
    model.save_pretrained(tmp_path / "littlebird")
    heads, example_tokens = model.config.num_attention_heads, 2 * (2 * 16 + 16)  # _example_batch: 2 rows of 48
    per_token = model.config.pack_size + 4 * 16
    monkeypatch.setattr(usw, "_CHUNK_ELEMENTS", example_tokens * per_token * 2)  # two heads at a time at the example
    assert len(usw._head_chunks(heads, example_tokens * per_token)) == heads // 2
    out = export_onnx(tmp_path / "littlebird", tmp_path / "onnx")
    record = json.loads((out / "longbird_onnx.json").read_text())
    assert [check["batch"] for check in record["check"]] == [[2, 48], [2, 256]]
    session = onnxruntime.InferenceSession(str(out / "model.onnx"))
    input_ids, mask = _padded_batch([256, 200, 256], 256, model.config.vocab_size, seed=2)
    (hidden,) = session.run(["last_hidden_state"], {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        eager = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert abs(hidden[real.numpy()] - eager[real].numpy()).max() <= 1e-5


def test_onnx_export_says_what_is_missing(tmp_path, monkeypatch):
    make_source("bert").save_pretrained(tmp_path / "bert")
    with pytest.raises(ValueError, match="is not a longbird model .*longbird convert"):
        export_onnx(tmp_path / "bert", tmp_path / "onnx")
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if the onnx extra were not installed
    with pytest.raises(ImportError, match=r'pip install "longbird\[onnx\]"'):
        export_onnx(tmp_path / "bert", tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()


def test_a_graph_that_onnx_runtime_reads_otherwise_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    model = longbird.convert(make_source("bert"), preset="full", max_length=128).eval()
    model.save_pretrained(tmp_path / "full")
    run = onnxruntime.InferenceSession.run
    monkeypatch.setattr(onnxruntime.InferenceSession, "run",
                        lambda self, names, feed: [value + 1e-2 for value in run(self, names, feed)])
    with pytest.raises(RuntimeError, match="last_hidden_state differs from PyTorch's by 0.01.*nothing was written"):
        export_onnx(tmp_path / "full", tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()


def _onnx_session(model, input_ids, path, seq=None):
    """The encoder exported by torch.onnx.export (dynamo) at `input_ids` with an all-ones mask, read by ONNX Runtime;
    `seq`: a dynamic sequence length."""
    dynamic = {"dynamic_shapes": {"input_ids": {1: seq}, "attention_mask": {1: seq}}} if seq is not None else {}
    torch.onnx.export(model, (input_ids, torch.ones_like(input_ids)), path, input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], dynamo=True, **dynamic)
    return onnxruntime.InferenceSession(str(path))


@pytest.mark.parametrize("preset", PRESETS)
def test_onnx_runtime_equals_pytorch(preset, tmp_path):
    model = _model(preset)
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)
    mask = torch.ones_like(input_ids)
    with torch.no_grad():
        eager = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    session = _onnx_session(model, input_ids, tmp_path / f"{preset}.onnx")
    (out, *_) = session.run(None, {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()})
    assert abs(out - eager.numpy()).max() <= 1e-5


def test_onnx_of_kobigbird_fresh_from_disk_equals_pytorch(tmp_path, cold_plan_caches):
    """Before, the dynamo exporter failed on the traced plan's generator (aten::rand ... found 'CustomObjArgument')."""
    model = _kobigbird_from_disk(tmp_path)
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)
    mask = torch.ones_like(input_ids)
    path = tmp_path / "kobigbird.onnx"
    session = _onnx_session(model, input_ids, path)
    assert not [node.op_type for node in onnx.load(str(path)).graph.node if node.op_type.startswith("Random")]
    feed = {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()}
    (first, *_), (second, *_) = session.run(None, feed), session.run(None, feed)
    with torch.no_grad():
        eager = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    assert (first == second).all()
    assert abs(first - eager.numpy()).max() <= 1e-5


@pytest.mark.parametrize("preset", list(DYNAMIC))
def test_onnx_with_a_dynamic_sequence_length_runs_other_lengths(preset, tmp_path):
    model = _model(preset)
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)
    session = _onnx_session(model, input_ids, tmp_path / f"{preset}.onnx", seq=DYNAMIC[preset])
    for length in (40, 256):
        other, _ = make_batch(length, batch=1, padded_rows=0)
        mask = torch.ones_like(other)
        (out, *_) = session.run(None, {"input_ids": other.numpy(), "attention_mask": mask.numpy()})
        with torch.no_grad():
            eager = model(input_ids=other, attention_mask=mask).last_hidden_state
        assert abs(out - eager.numpy()).max() <= 1e-5


def test_a_pretrained_span_selection_model_exports_its_encoder(tmp_path, caplog):
    """`pretrain` saves LongBirdForSpanSelection, whose head needs question_positions: the export failed with that
    head's error; it writes the encoder, with a warning."""
    from longbird.heads import LongBirdForSpanSelection

    encoder = longbird.convert(make_source("bert"), preset="littlebird", max_length=128, block_size=16).eval()
    LongBirdForSpanSelection(encoder.config).save_pretrained(tmp_path / "rss")
    out = export_onnx(tmp_path / "rss", tmp_path / "onnx")
    record = json.loads((out / "longbird_onnx.json").read_text())
    assert record["architecture"] == "LongBirdModel" and record["outputs"][0] == "last_hidden_state"
    assert "the encoder alone is exported" in caplog.text
