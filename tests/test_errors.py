"""Bad input gets an error that names the value and the fix."""

import pytest
import torch
from transformers import GPT2Config, GPT2Model

import longbird
from conftest import BLOCK, make_source


def test_unknown_family_lists_supported_ones():
    source = GPT2Model(GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=50))
    with pytest.raises(ValueError, match="unsupported source model_type 'gpt2'; longbird converts bert, roberta, "
                                         "xlm-roberta, camembert, electra"):
        longbird.convert(source)


def test_max_length_not_a_block_multiple():
    with pytest.raises(ValueError, match=r"max_length \(100\) must be a multiple of block_size \(8\); use max_length=104"):
        longbird.convert(make_source("bert"), max_length=100, block_size=BLOCK)


def test_max_length_below_source_length():
    with pytest.raises(ValueError, match=r"max_position_embeddings \(32\) is below the source length \(64\); "
                                         r"use max_length >= 64"):
        longbird.convert(make_source("bert"), max_length=32, block_size=BLOCK)


def test_input_longer_than_max_positions():
    model = longbird.convert(make_source("bert"), max_length=128, block_size=BLOCK)
    with pytest.raises(ValueError, match=r"input length 129 exceeds max_position_embeddings \(128\)"):
        model(input_ids=torch.ones(1, 129, dtype=torch.long))


def test_token_type_out_of_range():
    model = longbird.convert(make_source("bert"), max_length=128, block_size=BLOCK)
    with pytest.raises(ValueError, match=r"token_type_ids contains 2, outside 0..1 \(type_vocab_size=2\)"):
        model(input_ids=torch.ones(1, 10, dtype=torch.long), token_type_ids=torch.full((1, 10), 2))


def test_unknown_preset_and_option():
    with pytest.raises(ValueError, match="unknown preset 'bigbard'"):
        longbird.convert(make_source("bert"), preset="bigbard")
    with pytest.raises(ValueError, match=r"unknown conversion option\(s\) \['blok_size'\]"):
        longbird.convert(make_source("bert"), blok_size=8)


def test_position_and_attention_that_do_not_combine_are_named():
    # TAPE with LittleBird is implemented now (tests/test_tape.py); BiALiBi outside the USW kernel is not a method.
    with pytest.raises(ValueError, match="position='bialibi' needs attention='littlebird'"):
        longbird.convert(make_source("bert"), preset="full", max_length=128, position="bialibi")


def test_source_path_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a longbird or transformers model directory: .* \\(has no config.json\\)"):
        longbird.convert(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a longbird or transformers model directory: .* \\(does not exist\\)"):
        longbird.convert(tmp_path / "missing")


@pytest.mark.parametrize("overrides, message", [
    ({"block_size": 48}, r"max_length \(128\) must be a multiple of block_size \(48\); use max_length=144"),
    ({"block_size": 0}, r"block_size must be >= 1; got 0"),
    ({"num_random_blocks": -2}, r"num_random_blocks must be >= 0; got -2"),
    ({"attention": "bogus"}, r"attention must be one of \('full', 'bigbird', 'littlebird'\); got 'bogus'"),
    ({"qa_head": "bogus"}, r"qa_head must be one of \('conditional', 'linear'\); got 'bogus'"),
    ({"block_size": "64"}, r"block_size must be an integer; got '64'"),
])
def test_config_values_given_to_from_pretrained_are_checked_when_the_model_is_built(tmp_path, overrides, message):
    """transformers applies from_pretrained's config values with setattr after the config is built, past @strict's
    checks: the model checks them again, so that nothing runs that save_pretrained would then refuse to write."""
    from transformers import AutoModel, AutoModelForQuestionAnswering

    longbird.convert(make_source("bert"), max_length=128, block_size=BLOCK).save_pretrained(tmp_path)
    for auto in (AutoModel, AutoModelForQuestionAnswering):
        with pytest.raises(ValueError, match=message):
            auto.from_pretrained(tmp_path, **overrides)
    assert AutoModel.from_pretrained(tmp_path, block_size=16).config.block_size == 16  # a valid value is taken


@pytest.mark.parametrize("overrides, message", [
    ({"num_hidden_layers": 1}, r"convert cannot change \['num_hidden_layers'\]: they describe the source's"),
    ({"max_position_embeddings": 256}, r"convert cannot change \['max_position_embeddings'\].*give the length as "
                                       r"max_length"),
    ({"max_length": "128"}, r"max_length must be an integer .* got '128'"),
    ({"qa_ranking_weight": "0.5"}, r"qa_ranking_weight must be a number; got '0.5'"),
])
def test_conversion_options_that_contradict_the_source_or_are_text_are_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        longbird.convert(make_source("bert"), **{"max_length": 128, "block_size": BLOCK, **overrides})
    # the source's own values pass: a TAPE PEFT record's base conversion carries the whole config
    source = make_source("bert")
    same = {"num_hidden_layers": source.config.num_hidden_layers, "max_position_embeddings": 128}
    assert longbird.convert(source, max_length=128, block_size=BLOCK, **same).config.num_hidden_layers == 2


def test_converting_a_longbird_model_points_to_reconvert(tmp_path):
    model = longbird.convert(make_source("bert"), max_length=128, block_size=BLOCK)
    model.save_pretrained(tmp_path)
    for source in (model, tmp_path):
        with pytest.raises(ValueError, match=r"already a longbird model: longbird.reconvert\(model, \.\.\.\)"):
            longbird.convert(source)


def test_submodules_and_convert_to_directory_are_reached_from_the_package(tmp_path):
    """`longbird.malloc.keep_freed_memory()` as the docs write it (a submodule was an AttributeError until imported),
    and the model-plus-tokenizer conversion of the command line, whose tokenizer reads at the new length."""
    import subprocess
    import sys

    probe = ("import longbird, sys; assert callable(longbird.malloc.keep_freed_memory); "
             "assert 'torch' not in sys.modules; print('ok')")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout == "ok\n"
    with pytest.raises(AttributeError, match="no attribute 'nothere'"):
        longbird.nothere  # noqa: B018
    from test_qa_cli import write_tiny_source
    from transformers import AutoTokenizer

    source = write_tiny_source(tmp_path / "source")
    model, has_tokenizer = longbird.convert_to_directory(source, tmp_path / "long", max_length=256)
    assert has_tokenizer and model.config.max_position_embeddings == 256
    assert AutoTokenizer.from_pretrained(tmp_path / "long").model_max_length == 256


def test_a_json_document_given_as_corpus_is_refused(tmp_path):
    """A KorQuAD/SQuAD .json given to --corpus was trained on as its raw JSON text."""
    from longbird.data.corpus import corpus_documents

    squad = tmp_path / "squad.json"
    squad.write_text('{"data": [{"title": "t", "paragraphs": []}]}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"squad.json is a JSON document, not text: .*JSON Lines \(\.jsonl\)"):
        corpus_documents([squad])
    text = tmp_path / "notes.txt"
    text.write_text("plain text", encoding="utf-8")
    assert corpus_documents([text]) == ["plain text"]
