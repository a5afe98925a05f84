"""BigBird ITC kernel against its dense oracle (flash-attention style: outputs and gradients, awkward lengths)."""

import pytest
import torch
from conftest import (
    AWKWARD_LENGTHS,
    BLOCK,
    assert_bigbird_kernel_equals_reference,
    assert_same_outputs_and_gradients,
    make_batch,
    make_source,
)

import longbird
from longbird.attention import bigbird_pattern


@pytest.mark.parametrize("length", [8, 16, 24, 64, 120, 256])
@pytest.mark.parametrize("random_blocks", [0, 3])
def test_kernel_equals_dense_reference_outputs_and_gradients(length, random_blocks):
    assert_bigbird_kernel_equals_reference(bigbird_pattern(length // BLOCK, BLOCK, 4, random_blocks, seed=1, layer=0))


def test_pattern_has_itc_structure():
    n, r = 12, 3
    pattern = bigbird_pattern(n, 1, 2, r, seed=0, layer=0)
    dense = pattern.materialize()
    assert dense[:, 0].all() and dense[:, -1].all()  # global rows
    assert dense[:, :, 0].all() and dense[:, :, -1].all()  # global columns
    for i in range(1, n - 1):
        for j in (i - 1, i, i + 1):
            assert dense[:, i, j].all()
        # window (3) + 2 global + r random, with no duplicates for interior blocks
        if 2 <= i <= n - 3:
            assert (dense[:, i].sum(-1) == 5 + r).all()
    randoms = pattern.random_blocks
    assert ((randoms == 0) | (randoms == n - 1)).sum() == 0


def test_random_plan_is_deterministic_per_seed_and_differs_by_layer():
    first = bigbird_pattern.__wrapped__(20, BLOCK, 4, 3, 7, 0).random_blocks
    again = bigbird_pattern.__wrapped__(20, BLOCK, 4, 3, 7, 0).random_blocks
    other_layer = bigbird_pattern.__wrapped__(20, BLOCK, 4, 3, 7, 1).random_blocks
    other_seed = bigbird_pattern.__wrapped__(20, BLOCK, 4, 3, 8, 0).random_blocks
    assert torch.equal(first, again)
    assert not torch.equal(first, other_layer) and not torch.equal(first, other_seed)


def _sparse_model(name="bert", **overrides):
    # full_attention_max_length=8 forces the sparse kernel even at the awkward short lengths.
    return longbird.convert(make_source(name), max_length=320, block_size=BLOCK, num_random_blocks=2,
                            full_attention_max_length=8, **overrides)


@pytest.mark.parametrize("length", AWKWARD_LENGTHS)
def test_model_sparse_path_equals_reference_implementation(length):
    model = _sparse_model()
    reference = _sparse_model(attn_implementation="reference")
    assert_same_outputs_and_gradients(model, reference, *make_batch(length))


@pytest.mark.parametrize("length", [65, 113, 250])
def test_padding_never_changes_real_token_outputs(length):
    """Explicit pads up to the block multiple, and garbage ids under the mask, leave real tokens unchanged.
    (Padding that adds whole blocks is covered row by row in test_batch_independence.py.)"""
    model = _sparse_model()
    input_ids, attention_mask = make_batch(length, batch=1, padded_rows=0)
    extra = (-length) % BLOCK
    assert extra > 0
    with torch.no_grad():
        alone = model(input_ids=input_ids).last_hidden_state  # padded internally
        garbage = torch.randint(5, 90, (1, extra), generator=torch.Generator().manual_seed(length))
        padded_ids = torch.cat([input_ids, garbage], 1)
        padded_mask = torch.cat([attention_mask, torch.zeros(1, extra, dtype=torch.long)], 1)
        padded = model(input_ids=padded_ids, attention_mask=padded_mask).last_hidden_state
        # The same row inside a batch next to a longer unpadded row.
        other = torch.randint(5, 90, (1, length + extra), generator=torch.Generator().manual_seed(1))
        batched = model(input_ids=torch.cat([padded_ids, other]),
                        attention_mask=torch.cat([padded_mask, torch.ones_like(padded_mask)])).last_hidden_state
    assert padded.shape[1] == length + extra and alone.shape[1] == length
    torch.testing.assert_close(padded[:, :length], alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batched[:1, :length], alone, atol=1e-5, rtol=1e-5)


def test_same_outputs_in_train_and_eval_without_dropout():
    model = _sparse_model()
    input_ids, attention_mask = make_batch(113)
    with torch.no_grad():
        evaluated = model.eval()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        model.config.hidden_dropout_prob = 0.0
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        trained = model.train()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    torch.testing.assert_close(trained, evaluated)


def test_full_attention_decided_per_call():
    model = longbird.convert(make_source("bert"), max_length=256, block_size=BLOCK)
    assert not model.encoder.uses_sparse_attention(64) and model.encoder.uses_sparse_attention(65)
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)
    with torch.no_grad():
        model(input_ids=input_ids)
        short = model(input_ids=input_ids[:, :40]).last_hidden_state
        source = make_source("bert")(input_ids=input_ids[:, :40]).last_hidden_state
    torch.testing.assert_close(short, source, atol=1e-5, rtol=1e-5)  # a long call did not switch the model


@pytest.mark.parametrize("mode", ["pure-bf16", "autocast"])
def test_bf16_runs_and_stays_close_to_fp32(mode):
    model = _sparse_model()
    input_ids, attention_mask = make_batch(113)
    with torch.no_grad():
        reference = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if mode == "pure-bf16":
            out = model.to(torch.bfloat16)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            assert out.dtype == torch.bfloat16
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    real = attention_mask.bool()
    cosine = torch.nn.functional.cosine_similarity(out.float()[real], reference[real], dim=-1)
    assert torch.isfinite(out.float()).all() and cosine.min() > 0.99


@pytest.mark.parametrize("length", [9, 63, 64])
def test_full_attention_path_equals_reference_implementation(length):
    model = longbird.convert(make_source("roberta"), max_length=128, block_size=BLOCK)
    reference = longbird.convert(make_source("roberta"), max_length=128, block_size=BLOCK,
                                 attn_implementation="reference")
    assert_same_outputs_and_gradients(model, reference, *make_batch(length, pad_id=1))
