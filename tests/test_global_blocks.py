"""`global_blocks="first-reads-source"` (issue 24, E7 round 3): block 0 stays global as keys but its queries read only
the first full_attention_max_length tokens, and there is no last global block. The blocked kernel, the flex path and
the compiled per-row op compute the dense reference with that pattern; rows stay batch-independent; configurations the
pattern cannot serve are refused with the fix. `torch.compile(fullgraph=True)` of such a model is in
tests/test_compile_graph.py (preset "kobigbird-first-reads-source")."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    BLOCK,
    assert_bigbird_kernel_equals_reference,
    assert_flex_equals_blocked,
    assert_rows_equal_each_row_alone,
    assert_same_outputs_and_gradients,
    changed_tokens,
    make_batch,
    make_source,
    one_layer,
)

import longbird
from longbird.attention import bigbird_pattern
from longbird.conversion import reconvert
from longbird.export import to_bigbird


def _pattern(n, reach, random_blocks=0, layer=0):
    return bigbird_pattern(n, BLOCK, 4, random_blocks, seed=1, layer=layer, first_block_reach=reach, last_global=False)


@pytest.mark.parametrize("blocks", [1, 2, 3, 5, 12])
@pytest.mark.parametrize("reach", [1, 2, 4])
@pytest.mark.parametrize("random_blocks", [0, 2])
def test_kernel_equals_dense_reference_outputs_and_gradients(blocks, reach, random_blocks):
    assert_bigbird_kernel_equals_reference(_pattern(blocks, reach, random_blocks))


def test_pattern_first_block_reads_its_reach_every_block_reads_block_0_and_no_last_global():
    n, reach, r = 12, 4, 2
    dense = _pattern(n, reach, r).block_table()  # (H, n, n)
    assert dense[:, 0, :reach].all() and not dense[:, 0, reach:].any()  # the question reads the source's span
    assert dense[:, :, 0].all()  # every block reads the question
    local = _pattern(n, reach, 0).block_table()
    assert not local[:, -1, 1 : n - 2].any()  # no global last row
    assert not local[:, 1 : n - 2, -1].any()  # and no global last column
    for i in range(1, n):
        for j in range(max(i - 1, 0), min(i + 2, n)):
            assert dense[:, i, j].all()  # the window
        # interior blocks: block 0, the window and r random blocks, none counted twice
        if 2 <= i <= n - 2:
            assert (dense[:, i].sum(-1) == 4 + r).all()
    assert (dense[:, -1].sum(-1) == 3 + r).all()  # the last block: block 0, its left neighbour, itself, r random
    itc = bigbird_pattern(n, BLOCK, 4, r, seed=1, layer=0)
    assert itc.block_table()[:, 0].all() and itc.block_table()[:, -1].all()  # the default is still ITC


def test_flex_path_equals_the_blocked_kernel():
    """Flex reads the pattern's block table (eager flex_attention on CPU: outputs only)."""
    assert_flex_equals_blocked(_pattern(10, 3, 2))


def _model(**overrides):
    # full_attention_max_length 16 = two blocks: the question block reads blocks 0 and 1 only.
    settings = dict(max_length=256, block_size=BLOCK, num_random_blocks=2, full_attention_max_length=2 * BLOCK,
                    global_blocks="first-reads-source")
    settings.update(overrides)
    return longbird.convert(make_source("bert"), **settings)


@pytest.mark.parametrize("length", [17, 63, 113, 256])
def test_model_equals_reference_implementation(length):
    assert_same_outputs_and_gradients(_model(), _model(attn_implementation="reference"), *make_batch(length))


def test_question_block_does_not_read_past_its_reach_and_every_token_reads_the_question():
    """One layer, no random blocks: block 0's outputs do not move at all when tokens past its reach change (under ITC
    they do), and the last token's output moves when a question token changes but not when a token outside its
    window does. Moved means far above fp32 rounding of these unit-scale states (~1e-7)."""
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)
    past_reach, question_token, middle = slice(3 * BLOCK, None), slice(2, 3), slice(10 * BLOCK, 11 * BLOCK)
    for name, overrides in (("first-reads-source", {}), ("itc", {"global_blocks": "itc"})):
        model = one_layer(_model(num_random_blocks=0, **overrides))
        with torch.no_grad():
            base, far, question, mid = (model(input_ids=ids).last_hidden_state[0] for ids in (
                input_ids, changed_tokens(input_ids, past_reach), changed_tokens(input_ids, question_token),
                changed_tokens(input_ids, middle)))
        block_0_moved = (far[:BLOCK] - base[:BLOCK]).abs().max()
        if name == "itc":
            assert block_0_moved > 1e-5
            continue
        assert block_0_moved == 0  # the same keys and values, the same sums
        assert (question[-1] - base[-1]).abs().max() > 1e-5  # every token reads the question
        assert (mid[-1] - base[-1]).abs().max() == 0  # and not a block outside its window


def test_rows_equal_each_row_alone():
    assert_rows_equal_each_row_alone(_model().eval())


def test_refusals_name_the_fix():
    with pytest.raises(ValueError, match="global_blocks must be one of"):
        _model(global_blocks="middle")
    with pytest.raises(ValueError, match="random_blocks='seeded'"):
        _model(random_blocks="transformers")
    with pytest.raises(ValueError, match="multiple of block_size"):
        _model(full_attention_max_length=20)
    with pytest.raises(ValueError, match="global_blocks='itc'"):
        to_bigbird(_model())


def test_reconvert_switches_the_global_blocks_and_keeps_every_weight():
    itc = longbird.convert(make_source("bert"), max_length=256, block_size=BLOCK, num_random_blocks=0)
    switched = reconvert(itc, global_blocks="first-reads-source")
    assert switched.config.global_blocks == "first-reads-source"
    for (name, a), (_, b) in zip(itc.state_dict().items(), switched.state_dict().items()):
        assert torch.equal(a, b), name
    fresh = longbird.convert(make_source("bert"), max_length=256, block_size=BLOCK, num_random_blocks=0,
                             global_blocks="first-reads-source")
    input_ids, attention_mask = make_batch(200)
    with torch.no_grad():
        torch.testing.assert_close(switched(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state,
                                   fresh(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state,
                                   atol=0, rtol=0)
