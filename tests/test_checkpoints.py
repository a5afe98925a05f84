"""Issue 22: a process killed while it saves a checkpoint must not break `--resume`.

Checkpoints are written under a hidden temporary name and renamed into place when complete; `--resume` skips (and
reports) incomplete ones, says where it resumes, records it in the run's summary and ends at the uninterrupted run's
weights; `--save-total-limit N` keeps the newest N checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from longbird.cli import app
from test_qa_cli import PAGES, tiny_source  # noqa: F401  (fixture)

runner = CliRunner()
MAX_STEPS, SAVE_STEPS = 6, 2


def _finetune(tiny_source, out: Path, *extra: str) -> list[str]:
    # Loss logged at every step, so the resumed run's log can be compared step by step with the uninterrupted one's.
    return ["finetune-qa", "--model", str(tiny_source), "--preset", "kobigbird", "--max-length", "256",
            "--window-length", "64", "--train", str(PAGES[0]), "--out", str(out), "--max-steps", str(MAX_STEPS),
            "--batch-size", "2", "--learning-rate", "1e-3", "--save-steps", str(SAVE_STEPS), "--logging-steps", "1",
            *extra]


def _checkpoints(out: Path) -> Path:
    return out.parent / f"{out.name}.checkpoints"


def _max_weight_difference(a: Path, b: Path) -> float:
    first, second = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert first.keys() == second.keys()
    return max(float((first[name] - second[name]).abs().max()) for name in first)


def _losses(summary: dict) -> dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in summary["log_history"] if "loss" in entry}


def _summary(out: Path) -> dict:
    return json.loads((out / "longbird_finetune.json").read_text())


@pytest.fixture(scope="module")
def straight(tiny_source, tmp_path_factory):
    """The uninterrupted run: checkpoints 2, 4 and 6 and the final model."""
    out = tmp_path_factory.mktemp("straight") / "qa"
    result = runner.invoke(app, _finetune(tiny_source, out))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in _checkpoints(out).iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert _summary(out)["resume"] is None
    return out


# Runs the CLI with Trainer's `_save_optimizer_and_scheduler` wrapped: at step PAUSE_AT it writes where it is saving
# to SIGNAL and sleeps. Trainer calls it after writing the checkpoint's weights and before its optimiser, RNG and
# trainer states, so the process is killed in the middle of the save, where issue 22's kill landed, every time (a
# tiny model saves in milliseconds: polling for the temporary directory alone would race the save).
DRIVER = """
import sys, time
from pathlib import Path

from longbird.cli import app
from longbird.training.trainer import LongBirdTrainer

PAUSE_AT, SIGNAL = int(sys.argv[1]), Path(sys.argv[2])
save_the_rest = LongBirdTrainer._save_optimizer_and_scheduler


def paused(self, output_dir):
    if self.state.global_step == PAUSE_AT:
        SIGNAL.with_suffix(".tmp").write_text(str(output_dir))
        SIGNAL.with_suffix(".tmp").replace(SIGNAL)  # whole when it appears
        time.sleep(600)
    save_the_rest(self, output_dir)


LongBirdTrainer._save_optimizer_and_scheduler = paused
app(sys.argv[3:], prog_name="longbird")
"""


def _wait_for(path: Path, process: subprocess.Popen, log: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"the run ended before its save paused:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"the save did not pause within {timeout:.0f} s"
        time.sleep(0.05)


def test_a_run_killed_mid_save_resumes_from_the_last_complete_checkpoint(tiny_source, straight, tmp_path):
    out = tmp_path / "qa"
    checkpoints = _checkpoints(out)
    signal_file, log = tmp_path / "paused", tmp_path / "killed.log"
    with log.open("w") as stream:
        process = subprocess.Popen([sys.executable, "-c", DRIVER, "4", str(signal_file),
                                    *_finetune(tiny_source, out)], stdout=stream, stderr=subprocess.STDOUT)
    try:
        _wait_for(signal_file, process, log)
        # Mid-save: the weights of step 4 are written, its trainer state is not, and all of it is in the temporary
        # directory; the only checkpoint a resume can see is the complete checkpoint-2.
        staging = checkpoints / ".checkpoint-4.partial" / "checkpoint-4"
        assert Path(signal_file.read_text()) == staging
        assert (staging / "model.safetensors").is_file() and not (staging / "trainer_state.json").exists()
        assert sorted(p.name for p in checkpoints.iterdir()) == [".checkpoint-4.partial", "checkpoint-2"]
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(timeout=60) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not out.exists()

    resumed = subprocess.run([sys.executable, "-m", "longbird.cli", *_finetune(tiny_source, out, "--resume")],
                             capture_output=True, text=True, timeout=600,
                             env={**os.environ, "COLUMNS": "300"})  # the metrics table whole, not cut at 80
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    lines = resumed.stderr.splitlines()
    assert ("skipping incomplete checkpoint-4 (its save was interrupted; removed the temporary .checkpoint-4.partial)"
            in lines), resumed.stderr
    assert "resuming from checkpoint-2, step 2 of 6" in lines, resumed.stderr
    assert "from checkpoint-2: train_loss covers steps 3-6 only" in resumed.stdout

    difference = _max_weight_difference(straight, out)
    assert difference <= 1e-6, f"resumed weights differ from the uninterrupted run's by {difference:.3g}"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert all((checkpoints / name / "trainer_state.json").is_file() for name in ("checkpoint-4", "checkpoint-6"))

    summary, reference = _summary(out), _summary(straight)
    resume = summary["resume"]
    assert resume["resumed"] and resume["from_checkpoint"] == "checkpoint-2" and resume["from_step"] == 2
    assert resume["steps_trained_by_this_run"] == [3, 6]
    assert resume["skipped_incomplete"] == [
        "checkpoint-4 (its save was interrupted; removed the temporary .checkpoint-4.partial)"]
    # What the summary says the metrics cover is what Trainer computed: train_loss is the mean loss of steps 3-6 (the
    # uninterrupted run's losses there, the resume being exact), not of 1-6 like the uninterrupted run's.
    losses, reference_losses = _losses(summary), _losses(reference)
    assert sorted(losses) == list(range(1, MAX_STEPS + 1))  # steps 1-2 restored from checkpoint-2, 3-6 this run's
    for step, loss in reference_losses.items():
        assert losses[step] == pytest.approx(loss, rel=1e-5), step
    resumed_mean = sum(reference_losses[step] for step in range(3, MAX_STEPS + 1)) / (MAX_STEPS - 2)
    assert summary["metrics"]["train_loss"] == pytest.approx(resumed_mean, rel=1e-5)
    assert summary["metrics"]["train_loss"] != pytest.approx(reference["metrics"]["train_loss"], rel=1e-3)


def test_an_old_style_incomplete_checkpoint_is_skipped_and_saved_over(tiny_source, straight, tmp_path, caplog):
    """Before atomic saves, a kill mid-save left `checkpoint-N` with its weights and no trainer_state.json: --resume
    skips it with a warning, resumes from the one before, and the resumed run's save of step N replaces it."""
    out = tmp_path / "qa"
    checkpoints = _checkpoints(out)
    checkpoints.mkdir()
    shutil.copytree(_checkpoints(straight) / "checkpoint-4", checkpoints / "checkpoint-4")
    (checkpoints / "checkpoint-4" / "trainer_state.json").unlink()

    with caplog.at_level("WARNING", logger="longbird.training.finetune"):
        alone = runner.invoke(app, _finetune(tiny_source, out, "--resume"))
    assert alone.exit_code == 1 and not out.exists()
    assert (f"error: --resume: no complete checkpoint under {checkpoints} (skipped: checkpoint-4 (no "
            "trainer_state.json)); start without --resume") in " ".join(alone.output.split())

    shutil.copytree(_checkpoints(straight) / "checkpoint-2", checkpoints / "checkpoint-2")
    caplog.clear()
    with caplog.at_level("WARNING", logger="longbird.training.finetune"):
        result = runner.invoke(app, _finetune(tiny_source, out, "--resume"))
    assert result.exit_code == 0, result.output
    assert [r.getMessage() for r in caplog.records if r.name == "longbird.training.finetune"] == [
        "skipping incomplete checkpoint-4 (no trainer_state.json)", "resuming from checkpoint-2, step 2 of 6"]
    assert _max_weight_difference(straight, out) <= 1e-6
    assert (checkpoints / "checkpoint-4" / "trainer_state.json").is_file()  # saved over by the resumed run
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert _summary(out)["resume"]["skipped_incomplete"] == ["checkpoint-4 (no trainer_state.json)"]


def test_save_total_limit_keeps_the_newest_checkpoints(tiny_source, tmp_path):
    out = tmp_path / "qa"
    result = runner.invoke(app, _finetune(tiny_source, out, "--save-steps", "1", "--save-total-limit", "2"))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in _checkpoints(out).iterdir()) == ["checkpoint-5", "checkpoint-6"]
    assert _summary(out)["settings"]["save_total_limit"] == 2
    unsaved = [a for a in _finetune(tiny_source, tmp_path / "none", "--save-total-limit", "2")]
    at = unsaved.index("--save-steps")
    with pytest.warns(UserWarning, match="--save-total-limit 2 keeps nothing: no checkpoint is saved without"):
        result = runner.invoke(app, unsaved[:at] + unsaved[at + 2:], catch_exceptions=False)  # no --save-steps
    assert result.exit_code == 0 and not _checkpoints(tmp_path / "none").exists()


@pytest.mark.parametrize("command", [["finetune-qa", "--train", "x.json", "--out", "{out}"],
                                     ["finetune-cls", "--train", "x.jsonl", "--out", "{out}"],
                                     ["distill", "--output-dir", "{out}"], ["pretrain", "--output-dir", "{out}"]])
def test_save_total_limit_below_one_is_refused_in_one_line(command, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, [str(out) if a == "{out}" else a for a in command] + ["--save-total-limit", "0"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("error: --save-total-limit must be at least 1") and lines[0].endswith("got 0")
    assert not out.exists()


def test_a_checkpoint_of_another_run_is_refused_and_a_fresh_run_never_mixes_with_one(tiny_source, tmp_path):
    """A fresh run into an output whose checkpoint directory holds an earlier run's checkpoints saved its own among
    them, and a later --resume took the newest, whatever run it came from; --resume with other settings went on on a
    mixed schedule while the summary recorded the new settings. Both are refused in one line, nothing written."""
    out = tmp_path / "qa"
    assert runner.invoke(app, _finetune(tiny_source, out)).exit_code == 0
    saved = sorted(p.name for p in _checkpoints(out).iterdir())
    weights = (out / "model.safetensors").read_bytes()
    result = runner.invoke(app, _finetune(tiny_source, out, "--overwrite"))
    assert result.exit_code == 1 and "holds checkpoints of an earlier run" in result.output, result.output
    assert "checkpoint-6" in result.output and "--resume continues that run" in result.output
    other = [a if a != "1e-3" else "5e-4" for a in _finetune(tiny_source, out, "--overwrite", "--resume")]
    result = runner.invoke(app, other)
    assert result.exit_code == 1, result.output
    assert "was saved by a run with other settings (learning_rate 0.001 -> 0.0005)" in result.output
    longer = [a if a != str(MAX_STEPS) else str(MAX_STEPS + 2) for a in _finetune(tiny_source, out, "--overwrite",
                                                                                    "--resume")]
    result = runner.invoke(app, longer)
    assert result.exit_code == 1 and f"max_steps {MAX_STEPS} -> {MAX_STEPS + 2}" in result.output, result.output
    wider = [a if a != "256" else "512" for a in _finetune(tiny_source, out, "--overwrite", "--resume")]
    result = runner.invoke(app, wider)
    assert result.exit_code == 1 and "max_position_embeddings 256 -> 512" in result.output, result.output
    windows = [a if a != "64" else "128" for a in _finetune(tiny_source, out, "--overwrite", "--resume")]
    result = runner.invoke(app, windows)  # the windows the run reads (it resumed and recorded the new window)
    assert result.exit_code == 1 and "window_length 64 -> 128" in " ".join(result.output.split()), result.output
    assert sorted(p.name for p in _checkpoints(out).iterdir()) == saved  # nothing saved among them
    assert (out / "model.safetensors").read_bytes() == weights
    same = runner.invoke(app, _finetune(tiny_source, out, "--overwrite", "--resume"))
    assert same.exit_code == 0, same.output  # the same settings resume (here: at its last step, nothing left to do)


def test_a_checkpoint_is_read_at_the_window_its_run_trains_at(tiny_source, tmp_path):
    """Checkpoints had no window record, so `evaluate`/`answer`/`serve` read them at the model's full length (256 here
    against the 64 trained; 4096 against 512 for `make qa-model`'s checkpoints)."""
    from longbird.reader import trained_windows

    out = tmp_path / "qa"
    assert runner.invoke(app, _finetune(tiny_source, out)).exit_code == 0
    for checkpoint in sorted(_checkpoints(out).iterdir()):
        assert trained_windows(checkpoint) == trained_windows(out) == (64, _summary(out)["doc_stride"])
        record = json.loads((checkpoint / "longbird_finetune.json").read_text())
        assert record["checkpoint_step"] == int(checkpoint.name.split("-")[1])
        umask = os.umask(0)
        os.umask(umask)
        assert (checkpoint / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask  # not safetensors' 0600
    evaluated = tmp_path / "eval"
    result = runner.invoke(app, ["evaluate", "--model", str(_checkpoints(out) / f"checkpoint-{SAVE_STEPS}"), "--data",
                                 str(PAGES[0]), "--out", str(evaluated)])
    assert result.exit_code == 0, result.output
    metrics = json.loads((evaluated / "metrics.json").read_text())
    assert (metrics["window_length"], metrics["window_source"]) == (64, "trained")


def test_ctrl_c_keeps_the_model_whole_with_ordinary_permissions(tiny_source, tmp_path, monkeypatch):
    """Ctrl-C during training saves `interrupted-step-N` through a hidden sibling renamed into place (a kill mid-save
    leaves no half-written model, and the next run reports and removes the hidden one), with the permissions every
    output gets (safetensors writes 0600), and the run's record, so that evaluate reads it at the trained window."""
    from longbird.training.trainer import LongBirdTrainer

    steps, step = [], LongBirdTrainer.training_step

    def interrupted(self, *args, **kwargs):
        steps.append(1)
        if len(steps) == 3:
            raise KeyboardInterrupt
        return step(self, *args, **kwargs)

    monkeypatch.setattr(LongBirdTrainer, "training_step", interrupted)
    out = tmp_path / "qa"
    result = runner.invoke(app, _finetune(tiny_source, out))
    assert result.exit_code != 0 and not out.exists()
    saved = _checkpoints(out) / "interrupted-step-2"
    assert sorted(p.name for p in _checkpoints(out).iterdir()) == ["checkpoint-2", "interrupted-step-2"]
    umask = os.umask(0)
    os.umask(umask)
    assert (saved / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
    record = json.loads((saved / "longbird_finetune.json").read_text())
    assert record["window_length"] == 64 and record["checkpoint_step"] == 2


def test_a_checkpoint_set_aside_by_a_killed_second_save_is_restored(tmp_path, caplog):
    """A save of a step already saved moves the old checkpoint aside, then renames the new one in; a kill between the
    two renames left both hidden, and the next run removed both as interrupted (checkpoint-4 lost). The whole one set
    aside is put back and resumed from; the other copy is removed as before."""
    from longbird.training.resume import prepare_checkpoints

    for name, step in (("checkpoint-2", 2), (".checkpoint-4.replaced", 4), (".checkpoint-4.partial/checkpoint-4", 4)):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 6}))
    with caplog.at_level("WARNING", logger="longbird.training.finetune"):
        resume = prepare_checkpoints(tmp_path, resume=True)
    assert resume["checkpoint"] == str(tmp_path / "checkpoint-4") and resume["from_step"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    assert resume["skipped"] == ["checkpoint-4 (its save was interrupted; removed the temporary .checkpoint-4.partial)"]
    assert "restored checkpoint-4 (a save of the same step was interrupted; it was set aside as .checkpoint-4.replaced)" \
        in caplog.text


def test_a_run_resumed_from_its_last_checkpoint_trains_no_further_step(tiny_source, straight, tmp_path):
    """Killed after its last checkpoint, before its model was written: --resume trained a step past --max-steps
    (transformers checks it only after a step; a checkpoint-7, its loss and its tokens in the summary). Now it writes
    the model of that checkpoint and says that no step was trained."""
    out = tmp_path / "qa"
    shutil.copytree(_checkpoints(straight), _checkpoints(out))
    result = runner.invoke(app, _finetune(tiny_source, out, "--resume"))
    assert result.exit_code == 0, result.output
    assert "from checkpoint-6, its last step: nothing left to train" in " ".join(result.output.split())
    assert sorted(p.name for p in _checkpoints(out).iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert _max_weight_difference(straight, out) == 0.0
    summary, reference = _summary(out), _summary(straight)
    assert summary["resume"]["steps_trained_by_this_run"] == []
    assert summary["resume"]["metrics_cover"] == "no steps: the run resumed from its last step"
    assert _losses(summary) == pytest.approx(_losses(reference), rel=1e-6) and max(_losses(summary)) == MAX_STEPS
    assert summary["metrics"]["tokens_seen"] == reference["metrics"]["tokens_seen"]
    # a budgeted run keeps what it spent (the budget read it at Trainer's start, which a finished run skips)
    budgeted, again = tmp_path / "budgeted", tmp_path / "again"
    assert runner.invoke(app, _finetune(tiny_source, budgeted, "--cpu-minutes", "100")).exit_code == 0
    shutil.copytree(_checkpoints(budgeted), _checkpoints(again))
    result = runner.invoke(app, _finetune(tiny_source, again, "--cpu-minutes", "100", "--resume"))
    assert result.exit_code == 0, result.output
    spent, first = _summary(again)["metrics"]["cpu_budget"], _summary(budgeted)["metrics"]["cpu_budget"]
    assert spent["steps"] == MAX_STEPS and 0 < spent["cpu_seconds"] <= first["cpu_seconds"] + 1.0


def test_the_other_processes_wait_for_the_first_to_restore_a_checkpoint_set_aside(tmp_path, monkeypatch):
    """Under torchrun every process prepares the checkpoints before a process group exists: the others must resume
    from the checkpoint the first puts back, not from the one before it."""
    import threading

    import longbird.training.resume as resume_module

    for name, step in (("checkpoint-2", 2), (".checkpoint-4.replaced", 4)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 6}))
    monkeypatch.setattr(resume_module, "is_main_process", lambda: False)
    first = threading.Timer(0.3, os.replace, (tmp_path / ".checkpoint-4.replaced", tmp_path / "checkpoint-4"))
    first.start()  # the first process, a moment later
    try:
        resume = resume_module.prepare_checkpoints(tmp_path, resume=True)
    finally:
        first.join()
    assert resume["checkpoint"] == str(tmp_path / "checkpoint-4") and resume["from_step"] == 4
