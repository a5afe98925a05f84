"""Time budgets for training: stop after so many minutes of CPU time or of wall-clock time, and a linear learning-rate
schedule that reaches 0 where the run will end, at `--max-steps` or when the budget runs out, whichever comes first.

Why a budget decays the rate too: a linear schedule decays to 0 at a step count fixed in advance, and a run stopped by
a budget does not know its last step. Stopped early, a linear schedule ends at a high rate, its last updates the
noisiest of the run; a constant rate (E7's choice, where every method gets the same minutes) never anneals at all. So
the budgeted schedule projects the last step from the pace so far, steps done over the share of the budget used
(`TrainingBudget.projected_last_step`), and decays linearly to it. Where the budget is ample the projection lies past
`--max-steps` and the schedule is exactly Trainer's linear one (tested), so a recipe such as `make qa-model` trains
as it always did on a fast machine and still anneals in its hour on a slow one. What it gives up: the rate of a step
depends on how long earlier steps took, so a budgeted run is not repeatable step for step across machines or runs.

The budget is saved with every checkpoint (Trainer's `stateful_callbacks` in trainer_state.json) and a resumed run
continues it: the minutes spent before the interruption count. Under `torchrun` / `accelerate launch` every process
reads its own clocks; the share used is agreed once per update (the largest of the processes'), so all of them stop
after the same update and every replica steps with the same learning rate.
"""

from __future__ import annotations

import logging
import math
import time

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from .processes import agreed_across_processes, is_main_process

logger = logging.getLogger("longbird.training.finetune")  # beside the other messages of a training run


def check_budget_minutes(cpu_minutes: float | None, wall_minutes: float | None) -> None:
    """A clear error for a budget that is not a positive number of minutes (None: no such budget)."""
    for name, minutes in (("CPU", cpu_minutes), ("wall-clock", wall_minutes)):
        if minutes is not None and not minutes > 0:
            raise ValueError(f"the {name} budget must be a positive number of minutes; got {minutes}")


def training_budget(cpu_minutes: float | None, wall_minutes: float | None) -> TrainingBudget | None:
    """The budget of a run with these limits, or None when it has neither."""
    if cpu_minutes is None and wall_minutes is None:
        return None
    return TrainingBudget(cpu_minutes=cpu_minutes, wall_minutes=wall_minutes)


class TrainingBudget(TrainerCallback, ExportableState):
    """Stops training after the first optimiser step at which the process has used `cpu_minutes` of CPU time
    (`time.process_time`: every thread of the process, so 2 busy threads spend 2 CPU minutes per wall minute; the
    model, the data loader at 0 workers and a distillation teacher alike) or `wall_minutes` of elapsed time
    (`time.perf_counter`) since training began, whichever comes first. Either may be None. `clocks` replaces the two
    clocks (for tests)."""

    def __init__(self, cpu_minutes: float | None = None, wall_minutes: float | None = None, clocks=None):
        check_budget_minutes(cpu_minutes, wall_minutes)
        if cpu_minutes is None and wall_minutes is None:
            raise ValueError("a training budget needs CPU minutes, wall-clock minutes or both")
        self.cpu_minutes, self.wall_minutes = cpu_minutes, wall_minutes
        self.clocks = clocks or (time.process_time, time.perf_counter)
        self.begun = None  # (cpu, wall) clock readings when this process began training
        self.before = {"cpu_seconds": 0.0, "wall_seconds": 0.0}  # spent before a resume, from the checkpoint
        self.steps = 0
        self.share = 0.0  # the share of the budget used at the last update, agreed by all processes

    def spent(self) -> dict:
        """CPU and wall seconds spent in training so far, a resumed run's earlier share included."""
        if self.begun is None:
            return dict(self.before)
        cpu, wall = (clock() - begun for clock, begun in zip(self.clocks, self.begun))
        return {"cpu_seconds": self.before["cpu_seconds"] + cpu, "wall_seconds": self.before["wall_seconds"] + wall}

    def fraction_used(self) -> float:
        """The larger share of the two budgets used so far (0 before training begins)."""
        spent = self.spent()
        shares = [spent[key] / (60 * minutes) for key, minutes in (("cpu_seconds", self.cpu_minutes),
                                                                  ("wall_seconds", self.wall_minutes))
                  if minutes is not None]
        return max(shares)

    def projected_last_step(self, step: int) -> float:
        """The step at which the budget runs out if the steps to come take as long as the `step` done so far took:
        step / the share used at the last update (infinite before the first update or with nothing spent)."""
        return step / self.share if step > 0 and self.share > 0 else math.inf

    def on_train_begin(self, args, state, control, **kwargs):
        # On resume Trainer has loaded the checkpoint's trainer_state.json, whose `stateful_callbacks` holds what
        # `state()` returned at that checkpoint (on a fresh run: this callback's zeros).
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        if isinstance(saved, dict) and saved.get("attributes", {}).get("before"):
            self.before = dict(saved["attributes"]["before"])
        self.steps = state.global_step
        self.begun = tuple(clock() for clock in self.clocks)

    def on_optimizer_step(self, args, state, control, **kwargs):
        # Trainer calls this after each update and before the schedule's step, which reads the share
        self.share = agreed_across_processes(self.fraction_used())

    def on_step_end(self, args, state, control, **kwargs):
        self.steps = state.global_step
        if self.share >= 1.0:
            control.should_training_stop = True
            if is_main_process() and not 0 < state.max_steps <= state.global_step:
                # said once: the progress bar stops short with an estimate for steps that will not run
                budgets = " and ".join(f"--{name}-minutes {minutes:g}" for name, minutes in
                                       (("cpu", self.cpu_minutes), ("wall", self.wall_minutes)) if minutes is not None)
                logger.warning("the budget (%s) is spent: training stops at step %d of %d", budgets,
                               state.global_step, state.max_steps)

    def state(self) -> dict:
        # "before" here is everything spent up to this checkpoint: what a run resumed from it starts with.
        return {"args": {"cpu_minutes": self.cpu_minutes, "wall_minutes": self.wall_minutes},
                "attributes": {"before": self.spent()}}

    def summary(self) -> dict:
        """The run record's budget entries: `cpu_budget` and/or `wall_budget`, each {minutes, seconds used, steps}."""
        spent, record = self.spent(), {}
        if self.cpu_minutes is not None:
            record["cpu_budget"] = {"minutes": self.cpu_minutes, "cpu_seconds": spent["cpu_seconds"],
                                    "steps": self.steps}
        if self.wall_minutes is not None:
            record["wall_budget"] = {"minutes": self.wall_minutes, "wall_seconds": spent["wall_seconds"],
                                     "steps": self.steps}
        return record


def budgeted_linear_factor(step: int, warmup_steps: int, max_steps: int, projected_last_step: float) -> float:
    """The learning-rate factor at `step`: Trainer's linear schedule (`get_linear_schedule_with_warmup`: up from 0
    over `warmup_steps`, then down to 0 at the last step) with the last step the earlier of `max_steps` and
    `projected_last_step`. With the projection past `max_steps` it is exactly Trainer's schedule."""
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    last = min(float(max_steps), projected_last_step)
    return max(0.0, (last - step) / max(1.0, last - warmup_steps))
