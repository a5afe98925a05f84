"""Issue 12 item 3: the training commands run under `torchrun --nproc_per_node 2` on this CPU (gloo), through
Trainer/accelerate, and two processes with batch 1 each reach what one process reaches with batch 2: the same
logged losses and the same final weights. Only the first process writes the output directory.

Dropout is off in the tiny source (each process would draw its own masks); the data order is the same because
accelerate shards one seeded sampler: step k of both runs sees the same two windows.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from longbird.heads import LongBirdForSequenceClassification
from test_qa_cli import _law_and_bill_documents, write_tiny_source

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or shutil.which("torchrun", path=os.path.dirname(
    sys.executable)) is None, reason="torch.distributed / torchrun not available")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def source_without_dropout(tmp_path_factory):
    return write_tiny_source(tmp_path_factory.mktemp("source"), hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0)


def _finetune(command_prefix, source, data, out, batch_size, *extra, stderr: list | None = None,
              stdout: list | None = None):
    args = ["finetune-cls", "--model", str(source), "--max-length", "128", "--window-length", "128", "--stride", "32", "--train",
            str(data), "--out", str(out), "--max-steps", "3", "--batch-size", str(batch_size), "--learning-rate",
            "1e-3", "--device", "cpu", "--logging-steps", "1", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([*command_prefix, *args], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    if stderr is not None:
        stderr.append(result.stderr)
    if stdout is not None:
        stdout.append(result.stdout)
    return json.loads((out / "longbird_finetune.json").read_text())


def _torchrun() -> list[str]:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    return [torchrun, "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "-m",
            "longbird.cli"]


SAVING = ("--max-steps", "4", "--save-steps", "2")


@pytest.fixture(scope="module")
def straight_torchrun(source_without_dropout, tmp_path_factory):
    """One uninterrupted torchrun run (2 processes, batch 1 each, 4 steps, a checkpoint every 2), shared by both tests:
    each torchrun start costs two interpreters importing torch and transformers (about 20 s on 2 cores)."""
    root = tmp_path_factory.mktemp("torchrun")
    data = _law_and_bill_documents(root / "docs.jsonl")
    stdout: list[str] = []
    summary = _finetune(_torchrun(), source_without_dropout, data, root / "straight", 1, *SAVING, stdout=stdout)
    return root, data, summary, stdout[0]


def test_two_processes_equal_one_process_with_twice_the_batch(source_without_dropout, straight_torchrun):
    root, data, two, printed = straight_torchrun
    assert printed.count("fine-tuned classifier saved to") == 1  # the first process prints; each trained
    one = _finetune([sys.executable, "-m", "longbird.cli"], source_without_dropout, data, root / "one", 2, *SAVING)
    losses = lambda summary: [entry["loss"] for entry in summary["log_history"] if "loss" in entry]  # noqa: E731
    assert one["processes"] == 1 and two["processes"] == 2
    assert len(losses(one)) == 4 and len(losses(two)) == 4
    assert losses(two) == pytest.approx(losses(one), rel=1e-4)
    assert two["metrics"]["train_loss"] == pytest.approx(one["metrics"]["train_loss"], rel=1e-4)
    a, b = (LongBirdForSequenceClassification.from_pretrained(root / name) for name in ("one", "straight"))
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    assert sorted(p.name for p in root.iterdir() if p.name.startswith((".one", ".straight"))) == []  # no leftovers


def test_checkpoints_under_torchrun_hold_every_process_and_resume(source_without_dropout, straight_torchrun):
    """Issue 22 under torchrun: every process writes its RNG state into a checkpoint, all into the same temporary
    directory, which is renamed once all have written. A resume removes a killed save's leftover and says where it
    resumes once (not once per process), and ends at the uninterrupted run's weights."""
    root, data, _, _ = straight_torchrun
    checkpoints = root / "straight.checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    for step in (2, 4):
        assert {"rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"} <= {
            p.name for p in (checkpoints / f"checkpoint-{step}").iterdir()}

    resumed = root / "resumed.checkpoints"
    shutil.copytree(checkpoints / "checkpoint-2", resumed / "checkpoint-2")
    leftover = resumed / ".checkpoint-4.partial" / "checkpoint-4"  # what a kill during the save of step 4 leaves
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"")
    stderr: list[str] = []
    summary = _finetune(_torchrun(), source_without_dropout, data, root / "resumed", 1, *SAVING, "--resume",
                        stderr=stderr)
    lines = stderr[0].splitlines()
    assert lines.count("resuming from checkpoint-2, step 2 of 4") == 1, stderr[0]
    skipped = "checkpoint-4 (its save was interrupted; removed the temporary .checkpoint-4.partial)"
    assert lines.count(f"skipping incomplete {skipped}") == 1, stderr[0]
    assert summary["resume"]["from_step"] == 2 and summary["resume"]["skipped_incomplete"] == [skipped]
    assert sorted(p.name for p in resumed.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    a, b = (LongBirdForSequenceClassification.from_pretrained(root / name) for name in ("straight", "resumed"))
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0, msg=lambda m: f"{name}: {m}")

