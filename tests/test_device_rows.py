"""BigBird's per-row plan made on the device (attention/device_rows.py; issue 27, item 3: no host synchronisation in a
compiled forward): every real token's output and gradient equal the eager per-row plan's (attention/rows.py) for
every pattern variant and for batches that mix full rows, sparse rows of other block counts and an empty row; the
compiled graph holds no host read and no opaque op; the model takes it under LONGBIRD_ROW_PLAN=device."""

from __future__ import annotations

import pytest
import torch

import longbird
from conftest import BLOCK, make_batch, make_source
from longbird import dispatch
from longbird.attention.device_rows import bigbird_rows_on_device
from longbird.dispatch import PlanInGraph

# (block, full-attention threshold F, random blocks r, random-block plan, first-block reach, last global, chunk)
PATTERNS = {
    "itc": (8, 32, 3, "seeded", 0, True, 0),
    "itc-no-random": (8, 32, 0, "seeded", 0, True, 0),
    "transformers-plan": (8, 32, 2, "transformers", 0, True, 0),  # block 0 counted 1 + r times
    "first-reads-source": (8, 32, 1, "seeded", 4, False, 0),
    "source-chunks": (8, 32, 0, "seeded", 4, False, 3),
    "threshold-not-a-block-multiple": (8, 36, 2, "seeded", 0, True, 0),
    "wider-blocks": (16, 32, 1, "seeded", 2, False, 0),
}
# real lengths per row: sparse rows of other block counts, full rows (<= F), the threshold's edges, an empty row
BATCHES = [[200], [200, 37], [130, 33, 5, 200], [32, 31, 200], [0, 200], [200, 200], [36, 37, 190]]
HEADS, DIM = 4, 8


def _inputs(lengths, block, value_extra=0, seed=0):
    generator = torch.Generator().manual_seed(seed)
    length = -(-max(lengths) // block) * block
    batch = len(lengths)
    query, key = (torch.randn(batch, HEADS, length, DIM, generator=generator) for _ in range(2))
    value = torch.randn(batch, HEADS, length, DIM + value_extra, generator=generator)
    key_mask = torch.arange(length)[None] < torch.tensor(lengths)[:, None]
    return query, key, value, key_mask


def _plan(name, layer=3):
    block, threshold, random, plan, reach, last_global, chunk = PATTERNS[name]
    return PlanInGraph(layer, block, threshold, random, 7, plan, reach, last_global, chunk, max_length=256)


def _real(x, key_mask):
    return x.transpose(1, 2)[key_mask]  # (real tokens, H, d)


# fp32 softmax and weighted sums over at most a few hundred keys, summed in another order (gathered blocks instead of
# a dense row, another SDPA tiling): rounding of a few ulps (1.2e-7) of unit-scale terms per sum, far below 1e-5
TOLERANCE = 1e-5


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_device_plan_equals_the_eager_per_row_plan_with_its_gradients(pattern):
    plan = _plan(pattern)
    for lengths in BATCHES:
        if -(-max(lengths) // plan.block_size) * plan.block_size <= plan.full_max_length:
            continue  # all rows full: the encoder runs one full-attention call, no plan
        query, key, value, key_mask = _inputs(lengths, plan.block_size, value_extra=4)  # TAPE-wide values too
        inputs = [x.clone().requires_grad_() for x in (query, key, value)]
        ours = bigbird_rows_on_device(*inputs, key_mask, plan)
        inputs_eager = [x.clone().requires_grad_() for x in (query, key, value)]
        eager = dispatch._rows_eagerly(*inputs_eager, key_mask, plan)
        assert (_real(ours, key_mask) - _real(eager, key_mask)).abs().max() <= TOLERANCE, lengths
        # padding blocks past a row's end are 0, as the eager plan leaves them
        blocks = -(-torch.tensor(lengths) // plan.block_size) * plan.block_size
        past_end = torch.arange(query.shape[2])[None] >= blocks[:, None]
        assert not ours.transpose(1, 2)[past_end].any()
        weight = torch.randn(ours.shape, generator=torch.Generator().manual_seed(1)) * key_mask[:, None, :, None]
        (ours * weight).sum().backward()
        (eager * weight).sum().backward()
        for mine, theirs in zip(inputs, inputs_eager):
            assert torch.isfinite(mine.grad).all()
            assert (mine.grad - theirs.grad).abs().max() <= TOLERANCE, lengths


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_device_plan_makes_every_tensor_on_its_inputs_device(pattern):
    """On the meta device, which refuses a CPU tensor beside its own as CUDA does: a constant made without the inputs'
    device (a CPU `arange` of window offsets added to a CUDA one) failed the compiled plan on an H200 (2026-11-28,
    `Unhandled FakeTensor Device Propagation ... cuda:0, cpu`), and fails here without a GPU."""
    plan = _plan(pattern)
    query, key, value, key_mask = (t.to("meta") for t in _inputs([200, 37], plan.block_size))
    out = bigbird_rows_on_device(query, key, value, key_mask, plan)
    assert out.device.type == "meta" and out.shape[:3] == query.shape[:3]


def test_compiled_device_plan_is_one_graph_without_host_reads_or_opaque_ops():
    """fullgraph=True fails at any graph break (a `.tolist()`, a branch on a tensor); the captured graph has no scalar
    read (`aten._local_scalar_dense`, what `.item()` becomes) and no longbird op: nothing for a CUDA graph to stop at."""
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    plan = _plan("itc")
    query, key, value, key_mask = _inputs([200, 37, 90], plan.block_size)
    compiled = torch.compile(bigbird_rows_on_device, backend=capture, fullgraph=True, dynamic=False)
    with torch.no_grad():
        ours = compiled(query, key, value, key_mask, plan)
        eager = dispatch._rows_eagerly(query, key, value, key_mask, plan)
    assert (_real(ours, key_mask) - _real(eager, key_mask)).abs().max() <= TOLERANCE
    (graph,) = graphs
    calls = [(node.op, str(node.target)) for node in graph.graph.nodes if node.op.startswith("call_")]
    assert calls  # the graph was captured
    assert not [(op, target) for op, target in calls
                if target in ("item", "tolist", "cpu", "numpy") or "local_scalar" in target or "longbird" in target]


def test_compiled_with_dynamic_shapes_one_graph_serves_other_lengths():
    """A graph compiled with a symbolic length reads the random blocks from the table of the model's longest input
    (a static length gets a table of its own): other lengths, other row mixes, equal to the eager plan."""
    plan = _plan("itc")
    # the plan a constant of the graph, as in the encoder (which builds it from the config); the length made
    # symbolic by Dynamo's automatic dynamic shapes at the second length (torch.compile's default, `--compile`'s)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *inputs: bigbird_rows_on_device(*inputs, plan), fullgraph=True)
    for lengths in ([200, 37, 90], [150, 150, 33], [250, 120, 7]):
        query, key, value, key_mask = _inputs(lengths, plan.block_size)
        with torch.no_grad():
            ours = compiled(query, key, value, key_mask)
            eager = dispatch._rows_eagerly(query, key, value, key_mask, plan)
        assert (_real(ours, key_mask) - _real(eager, key_mask)).abs().max() <= TOLERANCE, lengths


def test_the_random_table_is_every_block_counts_own_plan():
    """One table per layer serves every padded length: row n holds bigbird_pattern(n)'s random blocks."""
    from longbird.attention.device_rows import _drawn_random_table
    from longbird.attention.patterns import bigbird_pattern

    table = _drawn_random_table(32, BLOCK, HEADS, 32, 3, 7, 2, "seeded", 0, True, 0, "cpu")
    assert table.shape == (33, HEADS, 32, 3)  # a spare slot: M - 1 middle blocks never fill the dimension
    assert (table[:5] == -1).all()  # n <= F / b: full rows, no random blocks
    for n in (5, 17, 32):
        drawn = bigbird_pattern(n, BLOCK, HEADS, 3, 7, 2, "seeded", 0, True, 0).random_blocks
        assert torch.equal(table[n, :, :n - 2].long(), drawn)
        assert (table[n, :, n - 2:] == -1).all()


def _kobigbird():
    model = longbird.convert(make_source("bert"), preset="kobigbird", max_length=256, block_size=BLOCK)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def test_a_compiled_kobigbird_takes_the_device_plan_and_equals_eager_with_its_gradients(monkeypatch):
    """LONGBIRD_ROW_PLAN=device (opt-in: the op is the default) on CPU: a padded batch, forward and one training step
    (ITC with random blocks; the other pattern variants are checked at the kernel above, compiling each costs about a
    minute)."""
    monkeypatch.setenv("LONGBIRD_ROW_PLAN", "device")
    seen = []
    monkeypatch.setattr(dispatch, "bigbird_rows_on_device",
                        lambda *args, **kwargs: seen.append(1) or bigbird_rows_on_device(*args, **kwargs))
    model = _kobigbird().train()
    input_ids, attention_mask = make_batch(200, batch=3, padded_rows=2)  # sparse rows of other block counts
    attention_mask[2, 30:] = 0  # and a row short enough for full attention
    real = attention_mask.bool()

    def step(run):
        model.zero_grad(set_to_none=True)
        out = run(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        (out[real] ** 2).mean().backward()
        return out.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    eager_out, eager = step(model)
    torch._dynamo.reset()
    compiled_out, compiled = step(torch.compile(model, fullgraph=True, dynamic=False))
    assert seen  # traced through the device plan, not the op
    assert (compiled_out - eager_out)[real].abs().max() <= TOLERANCE
    scale = max(grad.abs().max().item() for grad in eager.values())
    for name, grad in eager.items():  # as tests/test_compile_reading.py: Inductor reorders fp32 sums
        assert (compiled[name] - grad).abs().max().item() <= 1e-5 * scale + 1e-4 * grad.abs().max().item(), name


def test_the_compiled_row_plan_is_the_op_by_default_and_chosen_by_the_environment(monkeypatch):
    monkeypatch.delenv("LONGBIRD_ROW_PLAN", raising=False)
    assert dispatch.compiled_row_plan() == "op"  # on every device: the device plan fails Inductor on CUDA, torch 2.11
    monkeypatch.setenv("LONGBIRD_ROW_PLAN", "device")
    assert dispatch.compiled_row_plan() == "device"
    monkeypatch.setenv("LONGBIRD_ROW_PLAN", "host")
    with pytest.raises(ValueError, match="LONGBIRD_ROW_PLAN must be one of .'device', 'op'."):
        dispatch.compiled_row_plan()


def test_the_op_plan_refuses_attention_dropout_and_names_the_device_plan(monkeypatch):
    monkeypatch.setenv("LONGBIRD_ROW_PLAN", "op")
    plan = _plan("itc")
    query, key, value, key_mask = _inputs([200], plan.block_size)
    with pytest.raises(ValueError, match="LONGBIRD_ROW_PLAN=device"):
        dispatch.bigbird_rows(query, key, value, key_mask, plan, dropout_p=0.1)
