"""A document's output never depends on what it is batched with (issue 10, item 1), for every preset.

Rows of mixed real lengths (below L, just above, several block counts, a single real token) are run in one right-padded
batch and each alone; outputs and parameter gradients must agree to fp32 rounding.
"""

from __future__ import annotations

import pytest
import torch

import longbird
from longbird.attention.rows import plan_rows, real_lengths
from conftest import BLOCK, SOURCE_LENGTH, VOCAB, make_source

MAX_LENGTH = 256
# Below L, at L, just above L (one more block than L's), several block counts, a partial last block, one token.
ROW_LENGTHS = (40, SOURCE_LENGTH, SOURCE_LENGTH + 1, 100, 131, MAX_LENGTH, 1)


def _model(preset: str):
    overrides = {"num_random_blocks": 2} if preset == "kobigbird" else {}
    if preset == "littlebird":
        overrides["pack_size"] = 4
    return longbird.convert(make_source("bert"), preset=preset, max_length=MAX_LENGTH, block_size=BLOCK, **overrides)


def _rows(lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(5, VOCAB, (length,), generator=generator) for length in lengths]


def _batch(rows):
    width = max(len(row) for row in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for index, row in enumerate(rows):
        input_ids[index, :len(row)] = row
        mask[index, :len(row)] = 1
    return input_ids, mask


def _row_loss(hidden, length):
    # A fixed, row-specific function of the real outputs (a plain sum would hide sign errors).
    weights = torch.linspace(-1, 1, hidden.shape[-1])
    return (hidden[:length] * weights).pow(2).sum()


@pytest.mark.parametrize("preset", ["kobigbird", "littlebird", "full"])
def test_each_row_equals_the_row_alone_outputs_and_gradients(preset):
    model = _model(preset).train()
    for module in model.modules():  # dropout off: the comparison is of the function, not of random masks
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    rows = _rows(ROW_LENGTHS)
    input_ids, mask = _batch(rows)
    batched = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    parameters = [p for p in model.parameters() if p.requires_grad]
    for index, row in enumerate(rows):
        length = len(row)
        alone = model(input_ids=row[None]).last_hidden_state[0]
        torch.testing.assert_close(batched[index, :length], alone, atol=1e-6, rtol=1e-5,
                                   msg=lambda m: f"row {index} ({length} tokens): {m}")
        in_batch = torch.autograd.grad(_row_loss(batched[index], length), parameters, retain_graph=True,
                                       allow_unused=True)
        by_itself = torch.autograd.grad(_row_loss(alone, length), parameters, allow_unused=True)
        for a, b in zip(in_batch, by_itself):
            if a is None or b is None:
                assert a is None and b is None or (a if a is not None else b).abs().max() == 0
                continue
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=lambda m: f"gradient, row {index}: {m}")


def test_kobigbird_rows_decide_full_or_sparse_from_their_own_length():
    """The per-row plan: a 40-token row next to a 100-token row stays full; each sparse row has its own block count
    (so its own last global block and random plan)."""
    _, mask = _batch(_rows((40, 100, 131, 1)))
    assert real_lengths(mask.bool()) == [40, 100, 131, 1]
    groups = plan_rows(mask.bool(), BLOCK, SOURCE_LENGTH)
    assert [(g.num_blocks, g.length, g.rows.tolist()) for g in groups] == [(0, 40, [0, 3]), (13, 104, [1]),
                                                                           (17, 136, [2])]
    _, equal = _batch(_rows((100, 100)))
    (group,) = plan_rows(equal.bool(), BLOCK, SOURCE_LENGTH)
    assert group.rows is None and group.num_blocks == 13  # one group, one kernel call, as before the plan


def test_random_blocks_never_point_into_batch_padding():
    """A 100-token row (13 blocks) batched with a 256-token row draws random blocks from its own 13 blocks."""
    model = _model("kobigbird")
    seen = []
    original = longbird.dispatch.bigbird_attention

    def spy(query, key, value, key_mask, pattern, *args, **kwargs):
        seen.append((key_mask.shape[0], pattern.num_blocks, int(pattern.random_blocks.max())))
        return original(query, key, value, key_mask, pattern, *args, **kwargs)

    input_ids, mask = _batch(_rows((100, 256)))
    longbird.dispatch.bigbird_attention = spy
    try:
        with torch.no_grad():
            model(input_ids=input_ids, attention_mask=mask)
    finally:
        longbird.dispatch.bigbird_attention = original
    assert {(rows, blocks) for rows, blocks, _ in seen} == {(1, 13), (1, 32)}
    assert all(highest < blocks - 1 for _, blocks, highest in seen)  # never the global last block, never beyond
