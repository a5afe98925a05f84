"""The training progress bar and errors: a run that stops on an error leaves its bar finished with a line end, so
the command's one-line error is not printed onto the bar's line."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn
from transformers import TrainingArguments

from longbird.training.trainer import LongBirdTrainer


class _FailsOnThirdBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Linear(2, 1)
        self.calls = 0

    def forward(self, x, labels=None):
        self.calls += 1
        if self.calls == 3:
            raise ValueError("the third batch is bad")
        return {"loss": self.weight(x).pow(2).mean()}


def test_an_error_mid_run_is_printed_on_a_line_of_its_own(tmp_path, capsys):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=10, report_to=[],
                             save_strategy="no", use_cpu=True, disable_tqdm=False)
    data = [{"x": torch.ones(2), "labels": torch.zeros(1)} for _ in range(20)]
    trainer = LongBirdTrainer(model=_FailsOnThirdBatch(), args=args, train_dataset=data)
    with pytest.raises(ValueError, match="third batch"):
        trainer.train()
    print("error: the third batch is bad", file=sys.stderr)  # what the CLI prints next
    err = capsys.readouterr().err
    assert "2/10" in err  # the bar showed the two steps that ran
    assert "\nerror: the third batch is bad" in err, repr(err[-200:])
