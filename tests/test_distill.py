"""Distillation from the short model (issue 12, step 2 of LittleBird §3.4): the attention KL and soft-target losses,
training lowers them, and `longbird distill` runs and resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import longbird
from longbird.cli import app
from longbird.training.distill import distillation_loss
from conftest import BLOCK, make_batch, make_source
from test_qa_cli import tiny_source  # noqa: F401  (fixture)

runner = CliRunner()


def _teacher():
    teacher = make_source("bert")
    teacher.set_attn_implementation("eager")
    return teacher


@pytest.mark.parametrize("preset", ["full", "kobigbird"])
def test_loss_is_zero_when_the_student_is_the_teacher(preset):
    """At <= L tokens a full or kobigbird conversion computes exactly the source: nothing to distil."""
    teacher = _teacher()
    student = longbird.convert(teacher, preset=preset, max_length=256, block_size=BLOCK)
    input_ids, attention_mask = make_batch(60, batch=2)
    loss, parts = distillation_loss(teacher, student, {"input_ids": input_ids, "attention_mask": attention_mask})
    assert abs(loss.item()) < 1e-6 and float(parts["pack_mass"]) == 0.0


def test_littlebird_loss_is_positive_and_one_step_lowers_it():
    teacher = _teacher()
    student = longbird.convert(teacher, preset="littlebird", max_length=256, block_size=BLOCK, pack_size=4).train()
    for module in student.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    batch = dict(zip(("input_ids", "attention_mask"), make_batch(64, batch=2)))
    before, parts = distillation_loss(teacher, student, batch)
    assert float(before) > 0.01 and 0.0 < float(parts["pack_mass"]) < 1.0
    optimizer = torch.optim.SGD(student.parameters(), lr=0.05)
    before.backward()
    assert student.encoder.layer[0].bialibi.beta.grad.abs().sum() > 0  # the slopes learn from the attention maps
    optimizer.step()
    after, _ = distillation_loss(teacher, student, batch)
    assert float(after) < float(before)


def _antiberty():
    """AntiBERTy (package antiberty==0.1.3): an 8-layer BERT with a trained MLM head over 25 amino-acid tokens."""
    antiberty = pytest.importorskip("antiberty")
    from transformers import BertConfig, BertForMaskedLM

    directory = Path(antiberty.__file__).parent / "trained_models" / "AntiBERTy_md_smooth"
    config = BertConfig.from_pretrained(directory)
    model = BertForMaskedLM(config)
    state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    missing, _ = model.load_state_dict({k: v for k, v in state.items() if not k.startswith(("cls.species",
                                        "cls.chain", "cls.graft"))}, strict=False)
    assert not [name for name in missing if "position_ids" not in name]
    model.set_attn_implementation("eager")
    return model.eval()


def test_soft_targets_on_a_real_mlm_head():
    teacher = _antiberty()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 25, (2, 48), generator=generator)
    input_ids[:, 0], input_ids[:, -1] = 2, 3
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    same = longbird.convert(teacher, preset="full", max_length=512)
    loss, parts = distillation_loss(teacher, same, batch)
    assert abs(float(parts["soft_target_kl"])) < 1e-5 and abs(float(loss)) < 1e-5
    student = longbird.convert(teacher, preset="littlebird", max_length=512, block_size=16, pack_size=8)
    loss, parts = distillation_loss(teacher, student, batch, alpha=1.0, beta=0.0)
    assert float(parts["soft_target_kl"]) > 1e-3 and float(loss) == pytest.approx(float(parts["soft_target_kl"]))


def test_distill_command_runs_checkpoints_and_resumes_to_the_same_losses(tiny_source, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(f"the law number {i} says that the state shall protect rights." for i in range(80)))
    common = ["distill", "--teacher", str(tiny_source), "--preset", "littlebird", "--max-length", "256", "--corpus",
              str(corpus), "--length", "64", "--batch-size", "2", "--save-steps", "2", "--learning-rate", "1e-3", "--logging-steps", "1"]

    def losses(directory):
        summary = json.loads((directory / "model" / "longbird_distill.json").read_text())
        return [entry["loss"] for entry in summary["log_history"] if "loss" in entry]

    straight = tmp_path / "straight"
    result = runner.invoke(app, common + ["--output-dir", str(straight), "--max-steps", "4"])
    assert result.exit_code == 0, result.output
    assert "{'loss'" not in result.output  # Trainer's raw metrics dicts are not printed (longbird --verbose does)
    model = longbird.LongBirdModel.from_pretrained(straight / "model")
    assert model.config.attention == "littlebird" and (straight / "checkpoints" / "checkpoint-4").is_dir()
    # A run killed after step 2 (kill -9: only its checkpoint-2 survives) resumes to the uninterrupted losses.
    import shutil

    resumed = tmp_path / "resumed"
    shutil.copytree(straight / "checkpoints" / "checkpoint-2", resumed / "checkpoints" / "checkpoint-2")
    result = runner.invoke(app, common + ["--output-dir", str(resumed), "--max-steps", "4", "--resume"])
    assert result.exit_code == 0, result.output
    assert len(losses(straight)) == 4 and losses(straight)[0] != losses(straight)[-1]
    assert losses(resumed) == pytest.approx(losses(straight), rel=1e-5)
    result = runner.invoke(app, common + ["--output-dir", str(tmp_path / "none"), "--resume"])
    assert result.exit_code == 1 and "no checkpoint" in result.output
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\x00\x01")
    result = runner.invoke(app, common + ["--output-dir", str(tmp_path / "x"), "--corpus", str(bad)])
    assert result.exit_code == 1 and "corpus file" in result.output and "binary" in result.output
