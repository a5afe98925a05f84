"""torch.export, ONNX and torch.compile for every preset (issue 11, item 6): each computes what eager longbird computes,
and tracing never leaves fake tensors in longbird's caches. Exported kobigbird graphs hold the random-block plan as a
constant even when no eager call drew it first (issue 22, item 1), and dynamic sequence lengths export where the
attention pattern allows them."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim
from transformers import AutoModel

import longbird
from conftest import BLOCK, SOURCE_LENGTH, make_batch, make_source
from longbird.attention import bigbird, flex, patterns

PRESETS = ["kobigbird", "littlebird", "full"]


# a kobigbird model whose question block is global as keys only (attention/patterns.py), as E7's long reader
VARIANTS = {"kobigbird-first-reads-source": ("kobigbird", {"global_blocks": "first-reads-source",
                                                          "full_attention_max_length": 2 * BLOCK}),
            # and one whose middle blocks read source-length chunks instead of sliding windows
            "kobigbird-source-chunks": ("kobigbird", {"global_blocks": "first-reads-source",
                                                      "local_windows": "source-chunks",
                                                      "full_attention_max_length": 4 * BLOCK})}


def _model(preset):
    preset, overrides = VARIANTS.get(preset, (preset, {}))
    return longbird.convert(make_source("bert"), preset=preset, max_length=256, block_size=BLOCK, **overrides).eval()


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


@pytest.mark.parametrize("preset", ["kobigbird", "littlebird", "full", "tape", "kobigbird-first-reads-source",
                                    "kobigbird-source-chunks"])
def test_torch_compile_fullgraph_has_no_graph_break_and_equals_eager(preset):
    """Issue 27, item 3: one graph per model (fullgraph=True raises at any graph break: a logging call, `.tolist()`, a
    data-dependent branch), on a padded batch, with TAPE weights non-zero so the state updates are in the graph.
    kobigbird's per-row plan, which reads the rows' real lengths, runs inside one opaque op per layer
    (dispatch.PlanInGraph); the padded row keeps its own plan, as eagerly."""
    model = _model(preset)
    if preset == "tape":
        with torch.no_grad():  # non-zero TAPE weights (zero at init, which would leave the states out of the graph)
            generator = torch.Generator().manual_seed(0)
            for name, parameter in model.named_parameters():
                if "tape_" in name:
                    parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    input_ids, attention_mask = make_batch(200, batch=2)
    torch._dynamo.reset()
    with torch.no_grad():
        eager = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        compiled = torch.compile(model, fullgraph=True)(input_ids=input_ids,
                                                       attention_mask=attention_mask).last_hidden_state
    real = attention_mask.bool()
    # fp32 with Inductor's reordered sums: the same 1e-5 on unit-scale (LayerNorm-ed) states as the test above
    assert (compiled - eager)[real].abs().max() <= 1e-5


def test_torch_compile_of_kobigbird_does_not_take_the_export_path_where_dynamo_says_exporting(monkeypatch):
    """Dynamo before torch 2.13 answered torch.compiler.is_exporting() with True inside any torch.compile trace; on
    torch 2.11 (an H100) a compiled kobigbird then took the export path, traced the eager plan and failed. Emulated
    here by an is_exporting that always says True: longbird reads torch.export's own flag instead, so the compiled
    graph still runs the per-row plan op and equals eager."""
    model = _model("kobigbird")
    input_ids, attention_mask = make_batch(200, batch=2)
    with torch.no_grad():
        eager = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True)(input_ids=input_ids,
                                                       attention_mask=attention_mask).last_hidden_state
    real = attention_mask.bool()
    assert (compiled - eager)[real].abs().max() <= 1e-5  # as in the fullgraph test above


def test_the_per_row_plan_op_is_marked_unsafe_for_cuda_graph_capture():
    """The op reads each row's length (a host synchronisation on a GPU), which a CUDA graph capture cannot hold: the
    tag makes torch.compile(mode="reduce-overhead") graph the model around it instead of failing in capture."""
    from torch._inductor.utils import is_cudagraph_unsafe_fx_node

    import longbird.dispatch  # noqa: F401  (registers the ops)

    for op in (torch.ops.longbird.bigbird_rows.default, torch.ops.longbird.bigbird_rows_backward.default):
        assert torch.Tag.cudagraph_unsafe in op.tags
        node = torch.fx.Graph().call_function(op, ())
        assert is_cudagraph_unsafe_fx_node(node)


@pytest.fixture
def cold_plan_caches():
    """No length has run in this process: what a model loaded from disk in a fresh process sees. The plan caches are
    process-wide, so without this an earlier test (or the eager call these tests used to make first) would have drawn
    the plan already and the trace would never draw one."""
    for cache in (patterns.bigbird_pattern, bigbird._middle_key_blocks, flex.bigbird_block_table):
        cache.cache_clear()


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


def test_onnx_of_kobigbird_fresh_from_disk_equals_pytorch(tmp_path, cold_plan_caches):
    """Before, the dynamo exporter failed on the traced plan's generator (aten::rand ... found 'CustomObjArgument')."""
    onnx = pytest.importorskip("onnx", reason="needs the onnx extra: pip install longbird[onnx]")
    pytest.importorskip("onnxscript", reason="ONNX export needs the onnx extra: pip install longbird[onnx]")
    onnxruntime = pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install longbird[onnx]")
    model = _kobigbird_from_disk(tmp_path)
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)
    mask = torch.ones_like(input_ids)
    path = tmp_path / "kobigbird.onnx"
    torch.onnx.export(model, (input_ids, mask), path, input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], dynamo=True)
    assert not [node.op_type for node in onnx.load(str(path)).graph.node if node.op_type.startswith("Random")]
    session = onnxruntime.InferenceSession(str(path))
    feed = {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()}
    (first, *_), (second, *_) = session.run(None, feed), session.run(None, feed)
    with torch.no_grad():
        eager = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    assert (first == second).all()
    assert abs(first - eager.numpy()).max() <= 1e-5


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


@pytest.mark.parametrize("preset", list(DYNAMIC))
def test_onnx_with_a_dynamic_sequence_length_runs_other_lengths(preset, tmp_path):
    pytest.importorskip("onnxscript", reason="ONNX export needs the onnx extra: pip install longbird[onnx]")
    onnxruntime = pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install longbird[onnx]")
    model = _model(preset)
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)
    path = tmp_path / f"{preset}.onnx"
    seq = DYNAMIC[preset]
    torch.onnx.export(model, (input_ids, torch.ones_like(input_ids)), path,
                      input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"], dynamo=True,
                      dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}})
    session = onnxruntime.InferenceSession(str(path))
    for length in (40, 256):
        other, _ = make_batch(length, batch=1, padded_rows=0)
        mask = torch.ones_like(other)
        (out, *_) = session.run(None, {"input_ids": other.numpy(), "attention_mask": mask.numpy()})
        with torch.no_grad():
            eager = model(input_ids=other, attention_mask=mask).last_hidden_state
        assert abs(out - eager.numpy()).max() <= 1e-5


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


def test_compiled_kobigbird_reuses_its_gather_buffers_without_stale_results():
    """The compiled per-row op keeps its gather buffers per thread between calls (dispatch._op_workspace): calls of
    the same shape with other inputs, and of another shape in between, still equal eager, and the buffers stay
    bounded."""
    from longbird import dispatch

    model = _model("kobigbird")
    compiled = torch.compile(model, fullgraph=True)
    batches = [make_batch(200, batch=2, seed=0), make_batch(200, batch=2, seed=1), make_batch(150, batch=2, seed=2),
               make_batch(200, batch=2, seed=0)]
    torch._dynamo.reset()
    with torch.no_grad():
        for input_ids, attention_mask in batches:
            eager = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            ours = compiled(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            real = attention_mask.bool()
            assert (ours - eager)[real].abs().max() <= 1e-5
    with torch.no_grad():
        workspace = dispatch._op_workspace(torch.device("cpu"))
    assert workspace and sum(buffer.nbytes for buffer in workspace.values()) <= dispatch._OP_WORKSPACE_BYTES
    assert dispatch._op_workspace(torch.device("cuda")) is None  # GPUs' caching allocators reuse memory already
    # buffers made under inference mode are not written outside it (torch refuses an in-place update of an
    # inference tensor): the same shape under inference_mode, then no_grad, then inference_mode again
    input_ids, attention_mask = batches[0]
    eager = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.detach()
    dispatch._OP_WORKSPACES.buffers = {}  # so the first buffers of this shape are made under inference mode
    for context in (torch.inference_mode, torch.no_grad, torch.inference_mode):
        with context():
            ours = compiled(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        assert (ours - eager)[attention_mask.bool()].abs().max() <= 1e-5
