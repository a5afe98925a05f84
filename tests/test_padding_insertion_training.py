"""Padding Insertion (LittleBird §3.4) inside the training commands: a run interrupted and resumed with --resume
draws the gaps the uninterrupted run drew and ends at the same weights, and a TAPE model's position ids stay inside
its position table."""

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


def test_tape_model_gaps_stay_inside_its_position_table(tiny_source, tmp_path, drawn_positions):
    """The `tape` preset keeps the source's learned position table (identity states): with --padding-insertion its
    gaps are capped to the table's 128 rows (uncapped, the ids ran past it and the first forward pass raised), while
    a TAPE model with RoPE states has no table and keeps its gaps whole."""
    import longbird
    from longbird.config import LongBirdConfig
    from longbird.training.finetune import FinetuneSettings, make_padding_insertion
    from transformers import AutoTokenizer

    result = runner.invoke(app, ["finetune-qa", "--model", str(tiny_source), "--preset", "tape", "--max-length", "128",
                                 "--window-length", "64", "--train", str(PAGES[0]), "--out", str(tmp_path / "qa"),
                                 "--max-steps", "2", "--batch-size", "2", "--padding-insertion"])
    assert result.exit_code == 0, result.output
    assert longbird.LongBirdModel.from_pretrained(tmp_path / "qa").config.position == "tape"
    assert drawn_positions and max(int(p.max()) for p in drawn_positions) <= 127
    assert max(int(p.max()) for p in drawn_positions) > 63  # gaps survived the cap: windows hold 64 tokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_source)
    settings = FinetuneSettings(padding_insertion=True)
    sizes = dict(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=128, source_max_positions=64)
    tables = {init: LongBirdConfig(**sizes, attention="full", position="tape", tape_init=init)
              for init in ("identity", "rope")}
    models = {init: longbird.LongBirdModel(config).eval() for init, config in tables.items()}
    capped = make_padding_insertion(models["identity"], tokenizer, settings)
    free = make_padding_insertion(models["rope"], tokenizer, settings)
    assert tables["identity"].uses_position_table and capped.max_positions == 128
    assert not tables["rope"].uses_position_table and free.max_positions is None
    far = {"input_ids": torch.full((1, 8), 5), "position_ids": torch.arange(8)[None] * 300}  # ids up to 2,100
    assert torch.isfinite(models["rope"](**far).last_hidden_state).all()  # RoPE angles take any id
    with pytest.raises(ValueError, match=r"position_ids must lie in 0\.\.127 for a learned position table"):
        models["identity"](**far)
