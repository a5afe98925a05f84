"""CLI commands end to end on a tiny model in a temp dir (accelerate-style: commands are plain functions)."""

import json

import pytest
import torch
from typer.testing import CliRunner
from transformers import AutoModel, AutoTokenizer, BertTokenizerFast, BigBirdModel

from longbird.cli import app
from conftest import VOCAB, make_batch, make_source

runner = CliRunner()


def _tiny_source_dir(path):
    make_source("bert").save_pretrained(path)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(VOCAB - 5)]
    (path / "vocab.txt").write_text("\n".join(vocab))
    BertTokenizerFast(vocab_file=str(path / "vocab.txt")).save_pretrained(path)
    return path


def test_convert_then_export_end_to_end(tmp_path):
    source = _tiny_source_dir(tmp_path / "source")
    result = runner.invoke(app, ["convert", str(source), "--preset", "kobigbird", "--max-length", "256",
                                 "--out", str(tmp_path / "lb"), "--set", "block_size=8", "--set", "taper_schedule=power"])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "lb" / "config.json").read_text())
    assert config["model_type"] == "longbird" and config["taper_schedule"] == "power" and config["block_size"] == 8
    assert (tmp_path / "lb" / "tokenizer.json").is_file()
    model = AutoModel.from_pretrained(tmp_path / "lb")
    assert model.embeddings.position_embeddings.weight.shape == (256, 32)

    result = runner.invoke(app, ["export", str(tmp_path / "lb"), "--format", "hf-bigbird", "--out", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    hf = BigBirdModel.from_pretrained(tmp_path / "hf", attention_type="original_full").eval()
    input_ids, attention_mask = make_batch(50)
    with torch.no_grad():
        diff = (hf(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
                - model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state)
    assert diff[attention_mask.bool()].abs().max() <= 1e-5
    # Saved tokenizers know the model's length; the exported config carries the tokenizer's special ids.
    for directory in ("lb", "hf"):
        tokenizer = AutoTokenizer.from_pretrained(tmp_path / directory)
        assert tokenizer.model_max_length == 256
        long_input = tokenizer(" ".join(["w7"] * 400), truncation=True)["input_ids"]
        assert len(long_input) == 256
    assert (hf.config.sep_token_id, hf.config.bos_token_id, hf.config.eos_token_id, hf.config.pad_token_id) == (
        tokenizer.sep_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id) == (3, 2, 3, 0)


def test_convert_refuses_to_overwrite_and_reports_bad_options(tmp_path):
    source = _tiny_source_dir(tmp_path / "source")
    (tmp_path / "lb").mkdir()
    (tmp_path / "lb" / ".longbird-output").write_text("")  # an earlier conversion
    result = runner.invoke(app, ["convert", str(source), "--max-length", "256", "--out", str(tmp_path / "lb"),
                                 "--set", "block_size=8"])
    assert result.exit_code == 1 and "already exists" in result.output and len(result.output.strip().splitlines()) == 1
    result = runner.invoke(app, ["convert", str(source), "--out", str(tmp_path / "x"), "--set", "block_size"])
    assert result.exit_code != 0 and "KEY=VALUE" in result.output


def test_env_lists_versions_presets_and_kernels():
    result = runner.invoke(app, ["env"])
    assert result.exit_code == 0, result.output
    for expected in ("torch", "transformers", "kobigbird", "bigbird (blocked ITC)", "electra"):
        assert expected in result.output


def test_demo_refuses_a_model_it_did_not_write_before_any_work(tmp_path):
    """A fine-tuned model given as --out was replaced silently at the end of the demo."""
    from longbird.demo import run_demo
    from longbird.files import OUTPUT_MARKER

    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / OUTPUT_MARKER).write_text("")
    (trained / "longbird_finetune.json").write_text("{}")
    steps = []
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        run_demo(trained, source="minilm", max_length=1024, repeats=1, step=steps.append)
    assert steps == [] and (trained / "longbird_finetune.json").is_file()
    result = runner.invoke(app, ["demo", "--out", str(trained), "--source", "minilm"])
    assert result.exit_code == 1 and "--overwrite" in result.output and (trained / "longbird_finetune.json").is_file()


def test_demo_job_on_the_embedded_model(tmp_path):
    from longbird.demo import DEMO_RECORD, run_demo

    results = run_demo(tmp_path / "demo", source="minilm", max_length=1024, repeats=1)
    assert (tmp_path / "demo" / DEMO_RECORD).is_file()  # a demo's own output: the next demo may replace it
    assert results["max_abs_diff_vs_source"] <= 1e-5
    assert results["encoded_tokens"] == 1024 and results["document_tokens"] > 4096
    assert results["reload_identical"] is True
    from longbird.precision import native_bf16

    if native_bf16("cpu"):
        assert results["bf16_skipped"] is None and results["bf16_min_cosine_vs_fp32"] > 0.99
    else:  # emulated bf16 is not timed; the reason is reported (bf16 accuracy is tested in test_bigbird/littlebird)
        assert "no bf16 arithmetic" in results["bf16_skipped"] and "bf16_seconds" not in results
