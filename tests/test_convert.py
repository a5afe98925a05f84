"""The headline test: a converted model equals its source at every length <= L (minGPT-style)."""

import pytest
import torch

import longbird
from longbird.conversion import default_source
from conftest import BLOCK, SOURCE_LENGTH, make_batch, make_source

LENGTHS_UP_TO_L = range(1, SOURCE_LENGTH + 1)  # every length <= L


def _source_hidden(source, input_ids, attention_mask):
    with torch.no_grad():
        return source.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


@pytest.mark.parametrize("preset", ["kobigbird", "full"])
def test_converted_equals_source_at_every_length_up_to_L(source_name, preset):
    source = make_source(source_name)
    model = longbird.convert(source, preset=preset, max_length=256, block_size=BLOCK)
    base = getattr(model, "longbird", model)
    pad = source.config.pad_token_id
    for length in LENGTHS_UP_TO_L:
        input_ids, attention_mask = make_batch(length, pad_id=pad, padded_rows=1 if length > 2 else 0)
        expected = _source_hidden(source, input_ids, attention_mask)
        with torch.no_grad():
            actual = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        real = attention_mask.bool()
        assert (expected - actual)[real].abs().max() <= 1e-5, (source_name, length)


def test_mlm_head_matches_source_logits():
    for name in ("bert-mlm", "roberta-mlm", "camembert-mlm", "electra-mlm"):
        source = make_source(name)
        model = longbird.convert(source, max_length=128, block_size=BLOCK)
        assert isinstance(model, longbird.LongBirdForMaskedLM)
        input_ids, attention_mask = make_batch(40, pad_id=source.config.pad_token_id)
        with torch.no_grad():
            expected = source(input_ids=input_ids, attention_mask=attention_mask).logits
            actual = model(input_ids=input_ids, attention_mask=attention_mask).logits
        real = attention_mask.bool()
        assert (expected - actual)[real].abs().max() <= 1e-4, name


def test_roberta_offset_and_second_token_type():
    source = make_source("roberta")
    model = longbird.convert(source, max_length=256, block_size=BLOCK)
    table = model.embeddings.position_embeddings.weight
    source_table = source.embeddings.position_embeddings.weight
    # Row p of longbird = usable RoBERTa row p + padding_idx + 1 (RoBERTa reserves rows 0..padding_idx).
    assert torch.equal(table[:SOURCE_LENGTH], source_table[2: 2 + SOURCE_LENGTH])
    types = model.embeddings.token_type_embeddings.weight
    assert types.shape[0] == 2 and torch.equal(types[1], types[0])  # kobigbird uses two segments


def test_taper_start_keeps_the_question_rows_out_of_the_repetitions():
    """taper_start = s: the converted table's rows beyond the source length cycle over the source rows s..L-1 (a
    RoBERTa source, so the usable rows are found past its padding offset first)."""
    source = make_source("roberta")
    model = longbird.convert(source, max_length=256, block_size=BLOCK, taper_schedule="copy", taper_start=16)
    table, usable = model.embeddings.position_embeddings.weight, source.embeddings.position_embeddings.weight[2:]
    period = SOURCE_LENGTH - 16
    for row in range(SOURCE_LENGTH, 256):
        assert torch.equal(table[row], usable[16 + (row - SOURCE_LENGTH) % period])
    assert model.config.taper_start == 16


def test_electra_projection_is_kept():
    source = make_source("electra")
    model = longbird.convert(source, max_length=128, block_size=BLOCK)
    assert model.config.embedding_size == 16
    assert torch.equal(model.embeddings_project.weight, source.embeddings_project.weight)
    assert model.pooler is None  # ELECTRA has no pooler; none is invented


def test_real_minilm_equals_source_at_512():
    from transformers import AutoTokenizer, BertModel

    path = default_source()
    source = BertModel.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = longbird.convert(source, max_length=1024)
    from longbird.demo import DEFAULT_DOCUMENT

    text = DEFAULT_DOCUMENT.read_text(encoding="utf-8")
    batch = tokenizer([text, text[:300]], truncation=True, max_length=512, padding=True, return_tensors="pt")
    assert batch["input_ids"].shape[1] == 512
    expected = _source_hidden(source, batch["input_ids"], batch["attention_mask"])
    with torch.no_grad():
        actual = model(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    assert (expected - actual)[real].abs().max() <= 1e-5


def test_sparse_attention_beyond_L_runs_forward_and_backward(source_name):
    source = make_source(source_name)
    model = longbird.convert(source, max_length=256, block_size=BLOCK).train()
    input_ids, attention_mask = make_batch(4 * SOURCE_LENGTH, pad_id=source.config.pad_token_id)
    out = model(input_ids=input_ids, attention_mask=attention_mask)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits
    hidden.float().pow(2).mean().backward()
    assert torch.isfinite(hidden).all()
    word = model.get_input_embeddings().weight
    assert word.grad is not None and word.grad.abs().sum() > 0


@pytest.mark.parametrize("preset", ["littlebird", "tape"])
def test_conversion_is_deterministic_and_leaves_the_callers_random_state_alone(preset):
    """Parameters conversion creates (pack vectors, TAPE maps, BiALiBi slopes) come from a fixed seed: two conversions
    under different global random states are identical, and the caller's random stream continues as if none ran."""
    source = make_source("bert")
    torch.manual_seed(1)
    first = longbird.convert(source, preset=preset, max_length=256, block_size=BLOCK, pack_size=4).state_dict()
    after_first = torch.rand(3)
    torch.manual_seed(2)
    second = longbird.convert(source, preset=preset, max_length=256, block_size=BLOCK, pack_size=4).state_dict()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    torch.manual_seed(1)
    assert torch.equal(torch.rand(3), after_first)  # conversion drew nothing from the global generator
