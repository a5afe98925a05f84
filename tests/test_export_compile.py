"""torch.export for every preset (issue 11, item 6): each computes what eager longbird computes, and tracing never
leaves fake tensors in longbird's caches. Exported kobigbird graphs hold the random-block plan as a constant even when
no eager call drew it first (issue 22, item 1), and dynamic sequence lengths export where the attention pattern allows
them. The same graphs read by ONNX Runtime are in test_export_onnx.py, torch.compile's graphs in
test_compile_graph.py."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim
from transformers import AutoModel

import longbird
from conftest import BLOCK, SOURCE_LENGTH, make_batch, make_source

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


def _kobigbird_from_disk(tmp_path):
    longbird.convert(make_source("bert"), preset="kobigbird", max_length=256, block_size=BLOCK).save_pretrained(
        tmp_path / "kobigbird")
    return AutoModel.from_pretrained(tmp_path / "kobigbird").eval()


def _random_ops(graph_module):
    return [str(node.target) for node in graph_module.graph.nodes
            if node.op == "call_function" and any(word in str(node.target) for word in ("rand", "bernoulli", "normal"))]


def test_export_of_kobigbird_fresh_from_disk_holds_the_plan_as_a_constant(tmp_path, cold_plan_caches):
    """BigBird's random blocks (Zaheer et al. 2020, §2) are a pure function of (seed, layer, n), drawn outside the
    trace: before, a cold cache drew them inside it (aten::rand), so the program differed from eager and from itself."""
    model = _kobigbird_from_disk(tmp_path)
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)  # 25 blocks > L = 64 tokens: the sparse path
    exported = torch.export.export(model, (), {"input_ids": input_ids})  # no eager call before it
    assert _random_ops(exported.graph_module) == []
    first = exported.module()(input_ids=input_ids)[0]
    second = exported.module()(input_ids=input_ids)[0]
    with torch.no_grad():
        eager = model(input_ids=input_ids).last_hidden_state
    assert torch.equal(first, second)
    torch.testing.assert_close(first, eager, atol=1e-5, rtol=1e-5)
    # The plan is the one of its length: a graph exported at 200 tokens refuses 256 instead of using the wrong plan.
    with pytest.raises(AssertionError, match="Guard failed"):
        exported.module()(input_ids=make_batch(256, batch=1, padded_rows=0)[0])


# Dynamic sequence lengths: full attention takes any length, littlebird any block multiple (its blocks are fixed-size
# windows); kobigbird a range within full attention or one wholly above it (below).
DYNAMIC = {"full": Dim("seq", max=256), "littlebird": BLOCK * Dim("blocks", max=256 // BLOCK)}


@pytest.mark.parametrize("preset", list(DYNAMIC))
def test_dynamic_sequence_length_exports_one_graph_for_every_length(preset):
    model = _model(preset)
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)
    exported = torch.export.export(model, (), {"input_ids": input_ids},
                                   dynamic_shapes={"input_ids": {1: DYNAMIC[preset]}})
    for length in (40, 120, 256):
        other, _ = make_batch(length, batch=1, padded_rows=0)
        with torch.no_grad():
            eager = model(input_ids=other).last_hidden_state
        torch.testing.assert_close(exported.module()(input_ids=other)[0], eager, atol=1e-5, rtol=1e-5)


def test_kobigbird_exports_a_dynamic_length_within_full_attention():
    model = _model("kobigbird")
    assert model.config.full_attention_threshold == SOURCE_LENGTH
    input_ids, _ = make_batch(50, batch=1, padded_rows=0)
    exported = torch.export.export(model, (), {"input_ids": input_ids},
                                   dynamic_shapes={"input_ids": {1: Dim("seq", max=SOURCE_LENGTH)}})
    for length in (9, SOURCE_LENGTH):
        other, _ = make_batch(length, batch=1, padded_rows=0)
        with torch.no_grad():
            eager = model(input_ids=other).last_hidden_state
        torch.testing.assert_close(exported.module()(input_ids=other)[0], eager, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("example_length", [48, 200])  # full or sparse at the example: the range reaches past L
def test_kobigbird_dynamic_length_across_the_threshold_is_a_clear_error(example_length):
    model = _model("kobigbird")
    input_ids, _ = make_batch(example_length, batch=1, padded_rows=0)
    with pytest.raises(ValueError, match=r"wholly at or below its full-attention threshold \(64 tokens\) or wholly "
                                         r"above it.*min=72"):
        torch.export.export(model, (), {"input_ids": input_ids},
                            dynamic_shapes={"input_ids": {1: BLOCK * Dim("blocks", max=256 // BLOCK)}})


# Above the threshold: every sparse length a block multiple, any batch size; one graph for all of them.
SPARSE_BATCH = Dim("batch", max=8)
SPARSE_SEQ = BLOCK * Dim("blocks", min=SOURCE_LENGTH // BLOCK + 1, max=256 // BLOCK)
SPARSE_SHAPES = {"input_ids": {0: SPARSE_BATCH, 1: SPARSE_SEQ}, "attention_mask": {0: SPARSE_BATCH, 1: SPARSE_SEQ}}
# (length, rows, of which padded): an equal-length batch at the range's ends, padded batches whose short rows are
# sparse, at the threshold, and below it (read with full attention alone)
SPARSE_BATCHES = [(SOURCE_LENGTH + BLOCK, 1, 0), (256, 2, 0), (200, 3, 2), (136, 4, 3)]


def _kobigbird_batch(length, rows, padded):
    input_ids, mask = make_batch(length, batch=rows, padded_rows=padded, seed=rows)
    if rows == 4:  # a row at the full-attention threshold and one far below it
        mask[1, SOURCE_LENGTH:], mask[2, 10:] = 0, 0
    return input_ids, mask


def _each_row_alone(model, input_ids, mask):
    """What eager longbird computes for every row of the batch read on its own, unpadded."""
    with torch.no_grad():
        return [model(input_ids=input_ids[row:row + 1, :int(mask[row].sum())]).last_hidden_state[0]
                for row in range(len(input_ids))]


def test_kobigbird_exports_one_graph_for_every_sparse_length_and_reads_each_row_as_alone(cold_plan_caches):
    """torch.export makes BigBird's per-row plan on the device (attention/device_rows.py): the random blocks of every
    block count are one constant table per layer, so one graph serves every sparse length and batch size, and a row
    of a padded batch is read as eager reads it alone (its own block count, last global block and random blocks).
    Before, an exported graph held one plan for its example length and applied it to every row of the batch."""
    model = _model("kobigbird")
    input_ids, mask = _kobigbird_batch(200, 3, 2)
    exported = torch.export.export(model, (), {"input_ids": input_ids, "attention_mask": mask},
                                   dynamic_shapes=SPARSE_SHAPES)
    assert _random_ops(exported.graph_module) == []
    assert not [node for node in exported.graph_module.graph.nodes if "longbird" in str(node.target)]
    for length, rows, padded in SPARSE_BATCHES:
        input_ids, mask = _kobigbird_batch(length, rows, padded)
        with torch.no_grad():
            out = exported.module()(input_ids=input_ids, attention_mask=mask)[0]
        for row, alone in enumerate(_each_row_alone(model, input_ids, mask)):
            # the same products summed in another grouping (masked key blocks add exact zeros): fp32 rounding
            torch.testing.assert_close(out[row, :len(alone)], alone, atol=1e-5, rtol=1e-5)
