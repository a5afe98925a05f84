"""Time budgets for training (`training/budget.py`): `--cpu-minutes` / `--wall-minutes` stop a run, the linear
schedule decays to 0 where the budget will run out, and a resumed run continues the budget it had spent.

The integration tests replace the budget's clocks with one that advances one second per optimiser step, so where the
budget ends, and so every learning rate, is fixed in advance and compared exactly with Trainer's own schedule."""

from __future__ import annotations

import json
import shutil
import types

import pytest
import torch
from transformers import get_linear_schedule_with_warmup
from typer.testing import CliRunner

import longbird.training.budget as budget_module
from longbird.cli import app
from longbird.training.budget import TrainingBudget, budgeted_linear_factor
from longbird.training.processes import agreed_across_processes
from test_qa_cli import PAGES, tiny_source  # noqa: F401  (fixture)

runner = CliRunner()


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _begun(budget: TrainingBudget, step: int = 0, saved: dict | None = None) -> TrainingBudget:
    state = types.SimpleNamespace(global_step=step, stateful_callbacks=saved or {})
    budget.on_train_begin(None, state, None)
    return budget


def _updated(budget: TrainingBudget) -> TrainingBudget:
    budget.on_optimizer_step(None, None, None)  # where Trainer has the budget read its clocks, once per update
    return budget


def _trainer_factors(warmup: int, total: int, steps: int) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = get_linear_schedule_with_warmup(optimizer, warmup, total)
    return [schedule.lr_lambdas[0](step) for step in range(steps)]


def test_without_a_binding_budget_the_schedule_is_trainers_linear_one():
    for warmup, total in ((0, 10), (3, 10), (60, 600)):
        ours = [budgeted_linear_factor(step, warmup, total, float("inf")) for step in range(total + 2)]
        assert ours == _trainer_factors(warmup, total, total + 2)
        # a projection past max_steps changes nothing either
        assert [budgeted_linear_factor(step, warmup, total, 2.5 * total) for step in range(total + 2)] == ours


def test_a_binding_budget_ends_the_decay_at_the_projected_step():
    # 600 steps asked for, the budget projected to run out at step 350: the decay is Trainer's to 350
    assert [budgeted_linear_factor(step, 60, 600, 350.0) for step in range(352)] == _trainer_factors(60, 350, 352)
    assert budgeted_linear_factor(350, 60, 600, 350.0) == 0.0
    assert budgeted_linear_factor(400, 60, 600, 350.0) == 0.0  # past the projection: 0, never negative
    assert budgeted_linear_factor(2, 4, 600, 1.0) == 0.5  # warmup is warmup, whatever the projection


def test_the_larger_share_of_two_budgets_counts_and_the_last_step_is_projected_from_the_pace():
    cpu, wall = FakeClock(), FakeClock()
    budget = _begun(TrainingBudget(cpu_minutes=2.0, wall_minutes=1.0, clocks=(cpu, wall)))
    assert budget.fraction_used() == 0.0 and budget.projected_last_step(0) == float("inf")
    cpu.now, wall.now = 60.0, 15.0  # half the CPU budget, a quarter of the wall budget
    assert budget.fraction_used() == 0.5
    assert budget.projected_last_step(10) == float("inf")  # the clocks are read at an update, not in between
    assert _updated(budget).projected_last_step(10) == 20.0
    wall.now = 45.0
    assert _updated(budget).fraction_used() == 0.75
    control = types.SimpleNamespace(should_training_stop=False)
    budget.on_step_end(None, types.SimpleNamespace(global_step=15), control)
    assert not control.should_training_stop
    wall.now = 60.0
    _updated(budget).on_step_end(None, types.SimpleNamespace(global_step=20, max_steps=100), control)
    assert control.should_training_stop
    assert budget.summary() == {"cpu_budget": {"minutes": 2.0, "cpu_seconds": 60.0, "steps": 20},
                                "wall_budget": {"minutes": 1.0, "wall_seconds": 60.0, "steps": 20}}


def test_a_resumed_budget_counts_what_was_spent_before_the_checkpoint():
    cpu, wall = FakeClock(), FakeClock()
    first = _begun(TrainingBudget(wall_minutes=1.0, clocks=(cpu, wall)))
    wall.now = 24.0
    saved = json.loads(json.dumps(first.state()))  # as trainer_state.json keeps it
    assert saved == {"args": {"cpu_minutes": None, "wall_minutes": 1.0},
                     "attributes": {"before": {"cpu_seconds": 0.0, "wall_seconds": 24.0}}}
    later = FakeClock()
    later.now = 1000.0  # another process: its clock reads anything
    resumed = _begun(TrainingBudget(wall_minutes=1.0, clocks=(later, later)), step=8,
                     saved={"TrainingBudget": saved})
    assert resumed.fraction_used() == pytest.approx(0.4)
    later.now += 6.0
    assert _updated(resumed).share == pytest.approx(0.5) and resumed.projected_last_step(10) == pytest.approx(20.0)
    assert resumed.summary()["wall_budget"]["steps"] == 8


def test_a_budget_needs_a_positive_number_of_minutes():
    with pytest.raises(ValueError, match="wall-clock budget must be a positive number of minutes; got 0"):
        TrainingBudget(wall_minutes=0)
    with pytest.raises(ValueError, match="needs CPU minutes, wall-clock minutes or both"):
        TrainingBudget()
    result = runner.invoke(app, ["finetune-qa", "--train", str(PAGES[0]), "--out", "unused", "--wall-minutes", "0"])
    assert result.exit_code != 0 and "--wall-minutes" in result.output


@pytest.fixture
def stepped_budget(monkeypatch):
    """The run's budget, with both clocks advancing exactly one second per optimiser step (ticked when the optimiser
    steps, before the schedule reads it)."""

    class SteppedBudget(TrainingBudget):
        def __init__(self, **minutes):
            self.clock = FakeClock()
            super().__init__(**minutes, clocks=(self.clock, self.clock))

        def on_optimizer_step(self, args, state, control, **kwargs):
            self.clock.now += 1.0
            super().on_optimizer_step(args, state, control, **kwargs)

    monkeypatch.setattr(budget_module, "TrainingBudget", SteppedBudget)  # what `training_budget` builds


def _finetune(tiny_source, out, *extra: str) -> list[str]:
    return ["finetune-qa", "--model", str(tiny_source), "--preset", "kobigbird", "--max-length", "256",
            "--window-length", "64", "--train", str(PAGES[0]), "--out", str(out), "--batch-size", "2",
            "--learning-rate", "1e-3", "--logging-steps", "1", "--warmup-ratio", "0", *extra]


def _rates(out) -> dict[int, float]:
    summary = json.loads((out / "longbird_finetune.json").read_text())
    return {entry["step"]: entry["learning_rate"] for entry in summary["log_history"] if "learning_rate" in entry}


def test_a_wall_budget_stops_the_run_where_the_linear_decay_ends(tiny_source, stepped_budget, tmp_path):
    """15 seconds of budget at one second a step: the run asked for 1,000 steps stops at step 15, and every rate is
    what Trainer's linear schedule gives a 15-step run (the projection is 15 from the first step on)."""
    budgeted, plain = tmp_path / "budgeted", tmp_path / "plain"
    result = runner.invoke(app, _finetune(tiny_source, budgeted, "--max-steps", "1000", "--wall-minutes", "0.25",
                                          "--save-steps", "5"))
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, _finetune(tiny_source, plain, "--max-steps", "15"))
    assert result.exit_code == 0, result.output
    rates, reference = _rates(budgeted), _rates(plain)
    # Trainer logs the rate each update used: the last of 15 takes 1/15 of the peak, the next would take 0
    assert sorted(rates) == list(range(1, 16)) and rates[15] == pytest.approx(1e-3 / 15, rel=1e-12)
    # two roundings apart: the projection step / (step / 15) against 15 exactly
    assert all(rates[step] == pytest.approx(reference[step], rel=1e-12, abs=1e-18) for step in rates)
    summary = json.loads((budgeted / "longbird_finetune.json").read_text())["metrics"]
    assert summary["wall_budget"] == {"minutes": 0.25, "wall_seconds": 15.0, "steps": 15}
    assert summary["cpu_budget"] is None
    # what a checkpoint keeps of the budget: the seconds spent up to it
    state = json.loads((tmp_path / "budgeted.checkpoints" / "checkpoint-5" / "trainer_state.json").read_text())
    assert state["stateful_callbacks"]["SteppedBudget"]["attributes"]["before"]["wall_seconds"] == 5.0

    # Resumed from step 5, the budget continues from its 5 spent seconds: the same rates, the same last step.
    checkpoints = tmp_path / "budgeted.checkpoints"
    for name in ("checkpoint-10", "checkpoint-15"):
        shutil.rmtree(checkpoints / name)
    result = runner.invoke(app, _finetune(tiny_source, budgeted, "--max-steps", "1000", "--wall-minutes", "0.25",
                                          "--save-steps", "5", "--resume", "--overwrite"))
    assert result.exit_code == 0, result.output
    resumed = _rates(budgeted)
    assert sorted(resumed) == list(range(1, 16))  # the history carries the checkpoint's steps 1-5
    assert all(resumed[step] == pytest.approx(reference[step], rel=1e-12, abs=1e-18) for step in resumed)


AGREE = """
import torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank={rank}, world_size=2)
try:
    from longbird.training.processes import agreed_across_processes
    print(agreed_across_processes({share}))
finally:
    dist.destroy_process_group()
"""


def test_processes_of_a_distributed_run_agree_on_the_share_used():
    """Two gloo processes whose budgets are 0.3 and 0.7 used both take 0.7 (the larger share, what `TrainingBudget`
    keeps at each update): the same projected last step, so the same learning rate on every replica and the same
    update to stop after. The children import torch and longbird's process helpers only."""
    from fresh_process import run_together
    from test_distributed import _free_port

    port = _free_port()
    printed = run_together([AGREE.format(port=port, rank=rank, share=share) for rank, share in ((0, 0.3), (1, 0.7))])
    assert printed == ["0.7", "0.7"]
    assert agreed_across_processes(0.3) == 0.3  # a single process: its own share
