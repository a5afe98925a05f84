"""Padding Insertion (LittleBird §3.4) inside the training commands: a run interrupted and resumed with --resume
draws the gaps the uninterrupted run drew and ends at the same weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from longbird.cli import app
from longbird.training import PaddingInsertion
from test_qa_cli import PAGES, tiny_source  # noqa: F401  (fixture)

runner = CliRunner()
SENTENCES = " ".join(f"The law number {i} says that the state shall protect rights. Rights of the state number {i} "
                     f"are protected by law!" for i in range(60))


@pytest.fixture
def drawn_positions(monkeypatch):
    """The position ids every Padding Insertion call of the process produced, in call order."""
    seen: list[torch.Tensor] = []
    call = PaddingInsertion.__call__

    def recording(self, batch, *args, **kwargs):
        out = call(self, batch, *args, **kwargs)
        seen.append(out["position_ids"].detach().cpu().clone())
        return out

    monkeypatch.setattr(PaddingInsertion, "__call__", recording)
    return seen


def _corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(SENTENCES)
    return corpus


# command -> (arguments for a run writing to OUT, where its model lands, where its checkpoints go)
COMMANDS = {
    "finetune-qa": (lambda out, tmp: ["finetune-qa", "--preset", "kobigbird", "--max-length", "256",
                                      "--window-length", "64", "--train", str(PAGES[0]), "--out", str(out)],
                    lambda out: out, lambda out: out.parent / f"{out.name}.checkpoints"),
    "distill": (lambda out, tmp: ["distill", "--teacher", "{source}", "--preset", "littlebird", "--max-length", "256",
                                  "--corpus", str(_corpus(tmp)), "--length", "64", "--output-dir", str(out)],
                lambda out: out / "model", lambda out: out / "checkpoints"),
    # two micro-batches per update: the gaps are keyed by the micro-batch within the step too
    "pretrain": (lambda out, tmp: ["pretrain", "--preset", "littlebird", "--max-length", "256", "--corpus",
                                   str(_corpus(tmp)), "--length", "64", "--gradient-accumulation-steps", "2",
                                   "--output-dir", str(out)],
                 lambda out: out / "model", lambda out: out / "checkpoints"),
}


def _max_weight_difference(a: Path, b: Path) -> float:
    first, second = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert first.keys() == second.keys()
    return max(float((first[name] - second[name]).abs().max()) for name in first)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_interrupted_and_resumed_run_equals_the_uninterrupted_one(command, tiny_source, tmp_path, drawn_positions):
    """A run killed after step 2 (only its checkpoint-2 survives) and resumed draws, at steps 3 and 4, exactly the
    position ids the uninterrupted run drew there, and ends at its weights."""
    arguments, model_of, checkpoints_of = COMMANDS[command]
    source = ["--model", str(tiny_source)] if command != "distill" else []

    def run(out, extra):
        line = [str(tiny_source) if a == "{source}" else a for a in arguments(out, tmp_path)]
        result = runner.invoke(app, line + source + ["--max-steps", "4", "--batch-size", "2", "--save-steps", "2",
                                                     "--learning-rate", "1e-3", "--padding-insertion"] + extra)
        assert result.exit_code == 0, result.output

    straight = tmp_path / "straight"
    run(straight, [])
    straight_draws = list(drawn_positions)
    resumed = tmp_path / "resumed"
    shutil.copytree(checkpoints_of(straight) / "checkpoint-2", checkpoints_of(resumed) / "checkpoint-2")
    drawn_positions.clear()
    run(resumed, ["--resume"])
    difference = _max_weight_difference(model_of(straight), model_of(resumed))
    assert difference <= 1e-6, f"{command}: resumed weights differ from the uninterrupted run's by {difference:.3g}"
    # It drew only the last two steps' batches, and the same gaps as the uninterrupted run did there.
    assert len(drawn_positions) == len(straight_draws) // 2
    for mine, theirs in zip(drawn_positions, straight_draws[len(straight_draws) // 2:]):
        assert torch.equal(mine, theirs)
    assert any((positions != torch.arange(positions.shape[1])).any() for positions in straight_draws)  # gaps happened

