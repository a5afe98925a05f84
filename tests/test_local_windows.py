"""`local_windows="source-chunks"` (issue 24, E7 round 5): the middle blocks are tiled from block 1 into chunks of
c = source length / block - 1 blocks, and every block reads block 0 and its whole chunk instead of its neighbours.
The blocked kernel, the flex path and the model compute the dense reference with that pattern; without random blocks
the first source-length tokens of a long input are exactly the source's window (every layer); rows stay
batch-independent; the patterns this cannot serve are refused with the fix. `torch.compile(fullgraph=True)` of such
a model is in tests/test_compile_graph.py (preset "kobigbird-source-chunks")."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    BLOCK,
    SOURCE_LENGTH,
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

CHUNK = SOURCE_LENGTH // BLOCK - 1  # blocks per chunk in the models below (7)


def _pattern(n, chunk, random_blocks=0, itc=False, layer=0):
    reach, last_global = (0, True) if itc else (chunk + 1, False)
    return bigbird_pattern(n, BLOCK, 4, random_blocks, 1, layer, "seeded", reach, last_global, chunk)


@pytest.mark.parametrize("blocks", [1, 2, 4, 7, 12])
@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("random_blocks", [0, 2])
@pytest.mark.parametrize("itc", [False, True])
def test_kernel_equals_dense_reference_outputs_and_gradients(blocks, chunk, random_blocks, itc):
    assert_bigbird_kernel_equals_reference(_pattern(blocks, chunk, random_blocks, itc))


@pytest.mark.parametrize("itc", [False, True])
def test_every_middle_block_reads_block_0_and_exactly_its_chunk(itc):
    n, chunk, r = 14, 3, 2
    local = _pattern(n, chunk, 0, itc).block_table()[0].int()  # (n, n); every head alike without random blocks
    end = n - 1 if itc else n
    for i in range(1, end):
        start = 1 + (i - 1) // chunk * chunk
        expected = torch.zeros(n, dtype=torch.int32)
        expected[0] = 1
        expected[start:min(start + chunk, end)] = 1
        if itc:
            expected[n - 1] = 1
        assert torch.equal(local[i], expected), i
    dense = _pattern(n, chunk, r, itc).materialize_counts()  # random blocks: r more blocks, never one counted twice
    assert dense.max() == 1
    table = _pattern(n, chunk, r, itc).block_table()
    for i in range(1, end):
        start = 1 + (i - 1) // chunk * chunk
        window = min(start + chunk, end) - start
        assert (table[:, i].sum(-1) == 1 + window + r + int(itc)).all(), i
    sliding = bigbird_pattern(n, BLOCK, 4, 0, 1, 0, "seeded", chunk + 1, False, 0).block_table()[0]
    assert sliding[5, 4] and sliding[5, 6] and not sliding[5, 7]  # the default is still BigBird's sliding window


def test_flex_path_equals_the_blocked_kernel():
    """Flex reads the pattern's block table (eager flex_attention on CPU: outputs only)."""
    assert_flex_equals_blocked(_pattern(10, 3, 2))


def _model(**overrides):
    settings = dict(max_length=256, block_size=BLOCK, num_random_blocks=2, global_blocks="first-reads-source",
                    local_windows="source-chunks")
    settings.update(overrides)
    return longbird.convert(make_source("bert"), **settings)


@pytest.mark.parametrize("length", [17, 63, 113, 256])
@pytest.mark.parametrize("global_blocks", ["first-reads-source", "itc"])
def test_model_equals_reference_implementation(length, global_blocks):
    assert_same_outputs_and_gradients(_model(global_blocks=global_blocks),
                                      _model(global_blocks=global_blocks, attn_implementation="reference"),
                                      *make_batch(length))


def test_first_window_is_the_source_window_in_every_layer():
    """Without random blocks, blocks 0..c read exactly blocks 0..c: the first SOURCE_LENGTH tokens of a 200-token
    input are the source model's states on those tokens alone, in every layer (fp32 rounding of sums over 64 keys,
    ~1e-7 at unit scale; the sliding pattern differs by far more, shown as the control)."""
    source = make_source("bert").eval()
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)
    with torch.no_grad():
        expected = source(input_ids=input_ids[:, :SOURCE_LENGTH], output_hidden_states=True).hidden_states
        for windows, matches in (("source-chunks", True), ("sliding", False)):
            model = _model(num_random_blocks=0, local_windows=windows).eval()
            states = model(input_ids=input_ids, output_hidden_states=True).hidden_states
            assert len(states) == len(expected)
            gaps = [(ours[:, :SOURCE_LENGTH] - theirs).abs().max().item() for ours, theirs in zip(states, expected)]
            if matches:
                assert max(gaps) < 1e-5, gaps
            else:
                assert max(gaps) > 1e-3, gaps


def test_a_chunk_does_not_read_the_next_chunk_and_reads_the_question():
    """One layer, no random blocks: the last token of a chunk does not move when the next chunk changes (a sliding
    window's would), and moves when a token of block 0 changes."""
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)
    chunk_end = (1 + 2 * CHUNK) * BLOCK  # one past the second chunk (blocks 8..14)
    next_chunk, question_token = slice(chunk_end, chunk_end + BLOCK), slice(2, 3)
    for windows in ("source-chunks", "sliding"):
        model = one_layer(_model(num_random_blocks=0, local_windows=windows).eval())
        with torch.no_grad():
            base, after, question = (model(input_ids=ids).last_hidden_state[0, chunk_end - 1] for ids in (
                input_ids, changed_tokens(input_ids, next_chunk), changed_tokens(input_ids, question_token)))
        assert (question - base).abs().max() > 1e-5  # every token reads the question
        if windows == "source-chunks":
            assert (after - base).abs().max() == 0  # the same keys and values, the same sums
        else:
            assert (after - base).abs().max() > 1e-5


def test_rows_equal_each_row_alone():
    assert_rows_equal_each_row_alone(_model().eval())


def test_refusals_name_the_fix():
    with pytest.raises(ValueError, match="local_windows must be one of"):
        _model(local_windows="chunks")
    with pytest.raises(ValueError, match="local_windows='sliding' for a transformers export"):
        _model(global_blocks="itc", random_blocks="transformers")
    with pytest.raises(ValueError, match="multiple of block_size"):
        _model(global_blocks="itc", full_attention_max_length=20)
    with pytest.raises(ValueError, match="attention='littlebird'; use local_windows='sliding'"):
        longbird.convert(make_source("bert"), preset="littlebird", max_length=256, local_windows="source-chunks")
    with pytest.raises(ValueError, match="Reconvert it with local_windows='sliding'"):
        to_bigbird(_model(global_blocks="itc"))


def test_reconvert_switches_the_windows_and_keeps_every_weight():
    sliding = _model(num_random_blocks=0, local_windows="sliding")
    switched = reconvert(sliding, local_windows="source-chunks")
    assert switched.config.local_windows == "source-chunks"
    for (name, a), (_, b) in zip(sliding.state_dict().items(), switched.state_dict().items()):
        assert torch.equal(a, b), name
    fresh = _model(num_random_blocks=0)
    input_ids, attention_mask = make_batch(200)
    with torch.no_grad():
        torch.testing.assert_close(switched(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state,
                                   fresh(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state,
                                   atol=0, rtol=0)
