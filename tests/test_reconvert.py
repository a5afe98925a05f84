"""Reconversion (conversion.reconvert, `longbird convert LONGBIRD_DIR --set ...`): a converted kobigbird model with
a task head gets another sparse pattern and another extension of its positions, every weight kept. At or below the
source length it computes what it computed; above it, what `convert` makes of the same short model."""

from __future__ import annotations

import json

import pytest
import torch

import longbird
from longbird.checkpoints import reconvert_directory
from longbird.conversion import reconvert
from longbird.heads import LongBirdForQuestionAnswering
from conftest import BLOCK, SOURCE_LENGTH, make_batch, make_source

NEW = {"block_size": 2 * BLOCK, "num_random_blocks": 0, "taper_start": 2 * BLOCK}


def _reader(**overrides):
    """A kobigbird QA model over the tiny BERT with a non-zero head and non-trivial rows beyond L (as training leaves
    them): what reconvert must rebuild from rows 0..L-1."""
    encoder = longbird.convert(make_source("bert"), max_length=256, **{"block_size": BLOCK, **overrides})
    config = encoder.config
    config.architectures = ["LongBirdForQuestionAnswering"]
    torch.manual_seed(3)
    model = LongBirdForQuestionAnswering(config)
    model.longbird.load_state_dict(encoder.state_dict())
    with torch.no_grad():
        model.longbird.embeddings.position_embeddings.weight[SOURCE_LENGTH:] += 1.0  # what reconvert replaces
    return model.eval()


def _logits(model, length):
    input_ids, attention_mask = make_batch(length)
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask)
    return torch.stack([out.start_logits, out.end_logits]), attention_mask.bool()


def test_reconverted_reader_equals_itself_up_to_L_and_a_fresh_conversion_beyond():
    reader = _reader()
    again = reconvert(reader, **NEW)
    assert (again.config.block_size, again.config.num_random_blocks, again.config.taper_start) == (16, 0, 16)
    assert again.config.qa_head == reader.config.qa_head and again.config.architectures == reader.config.architectures
    ours, real = _logits(again, SOURCE_LENGTH - 3)
    theirs, _ = _logits(reader, SOURCE_LENGTH - 3)
    torch.testing.assert_close(ours[:, real], theirs[:, real])  # the same arithmetic at <= L: fp32 rounding alike
    # beyond L: the model convert makes of the same short weights with the new settings, the same head
    fresh = _reader(**NEW)
    fresh.load_state_dict({name: tensor for name, tensor in reader.state_dict().items()
                           if "position_embeddings" not in name}, strict=False)
    table = "longbird.embeddings.position_embeddings.weight"
    assert torch.equal(again.state_dict()[table], longbird.convert(
        make_source("bert"), max_length=256, **NEW).embeddings.position_embeddings.weight)
    fresh.load_state_dict({table: again.state_dict()[table]}, strict=False)
    for name, tensor in again.state_dict().items():
        assert torch.equal(tensor, fresh.state_dict()[name]), name
    ours, real = _logits(again, 150)
    theirs, _ = _logits(fresh, 150)
    torch.testing.assert_close(ours[:, real], theirs[:, real])
    differs, _ = _logits(reader, 150)
    assert (differs - ours)[:, real].abs().max() > 1e-3  # the pattern and the rows beyond L did change


def test_reconvert_refuses_what_it_cannot_change():
    reader = _reader()
    with pytest.raises(ValueError, match=r"cannot change \['hidden_size'\]"):
        reconvert(reader, hidden_size=64)
    littlebird = longbird.convert(make_source("bert"), preset="littlebird", max_length=256, block_size=BLOCK)
    with pytest.raises(ValueError, match="absolute position table .* got longbird with position 'bialibi'"):
        reconvert(littlebird, block_size=16)
    with pytest.raises(ValueError, match="start must be a source row, 0 <= start < 64; got 64"):
        reconvert(reader, taper_start=64)


def test_convert_cli_reconverts_a_reader_directory_with_its_record(tmp_path):
    from transformers import AutoTokenizer

    from longbird.cli import app
    from longbird.conversion import default_source
    from typer.testing import CliRunner

    reader_dir = tmp_path / "reader"
    _reader().save_pretrained(reader_dir)
    AutoTokenizer.from_pretrained(default_source(), local_files_only=True).save_pretrained(reader_dir)
    (reader_dir / "longbird_finetune.json").write_text(json.dumps({"task": "qa", "window_length": 48}))
    out = tmp_path / "long"
    result = CliRunner().invoke(app, ["convert", str(reader_dir), "--max-length", "512", "--out", str(out),
                                      *[f"--set={key}={value}" for key, value in NEW.items()]])
    assert result.exit_code == 0, result.output
    model = LongBirdForQuestionAnswering.from_pretrained(out)
    assert model.config.max_position_embeddings == 512 and model.config.block_size == 16
    assert model.longbird.embeddings.position_embeddings.weight.shape[0] == 512
    record = json.loads((out / "longbird_finetune.json").read_text())
    assert record["window_length"] == 48 and record["reconverted"]["taper_start"] == 16
    assert AutoTokenizer.from_pretrained(out).model_max_length == 512
    with pytest.raises(ValueError, match="reconverted only within its own preset \\(kobigbird\\), not to 'tape'"):
        reconvert_directory(reader_dir, tmp_path / "other", preset="tape")
