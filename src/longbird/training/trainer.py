"""`LongBirdTrainer`: `transformers.Trainer` as longbird trains with it (fine-tuning, distillation, pretraining).

What it adds to Trainer: Padding Insertion on the training batches of each optimiser step, keyed by that step (a
resumed run continues it exactly); parameter groups of their own for the BiALiBi slopes and the TAPE maps; a time
budget that stops the run, with the linear schedule ending where the budget does; length-grouped batches from a
dataset's own lengths; checkpoints written whole or not at all; and a quiet progress bar.
"""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import ProgressCallback, Trainer
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from ..files import ordinary_permissions
from ..linked_windows import GATES
from ..quiet import verbose
from ..window_selector import SELECTOR
from .budget import TrainingBudget, budgeted_linear_factor
from .padding_insertion import PaddingInsertion
from .resume import publish_checkpoint


class QuietProgressCallback(ProgressCallback):
    """The progress bar without the raw metrics dicts under it (the command prints its own summary); the loss history
    is kept in the run's summary file. `longbird --verbose` (LONGBIRD_VERBOSE=1) keeps transformers' printing."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if verbose():
            super().on_log(args, state, control, logs=logs, **kwargs)


class LongBirdTrainer(Trainer):
    """Trainer with Padding Insertion on training batches (`padding_insertion`), the BiALiBi slopes' and the TAPE
    maps' own learning rates, a time budget (`budget`: it stops the run, and the linear schedule decays to 0 where it
    ends), atomic checkpoints and a quiet progress bar; a Padding Insertion collator passed as `data_collator` is
    switched off for evaluation and prediction."""

    def __init__(self, *args, slope_learning_rate: float | None = None, tape_learning_rate: float | None = None,
                 padding_insertion: PaddingInsertion | None = None, budget: TrainingBudget | None = None,
                 link_learning_rate: float | None = None, checkpoint_record: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        # written into every checkpoint as longbird_finetune.json, so that `evaluate`/`answer`/`serve` read a
        # checkpoint at the window it is being trained at, not at the model's full length
        self.checkpoint_record = checkpoint_record
        self.slope_learning_rate = slope_learning_rate
        self.tape_learning_rate = tape_learning_rate
        self.link_learning_rate = link_learning_rate
        self.padding_insertion = padding_insertion
        self.budget = budget
        if budget is not None:
            self.add_callback(budget)
        if self.pop_callback(ProgressCallback) is not None:
            self.add_callback(QuietProgressCallback)

    def train(self, *args, **kwargs):
        """Trainer.train; a run that stops on an error first closes its progress bar, so that the error is printed on
        a line of its own (transformers closes the bar only in on_train_end, which an exception skips)."""
        try:
            return super().train(*args, **kwargs)
        except BaseException:
            for callback in self.callback_handler.callbacks:
                if isinstance(callback, ProgressCallback) and callback.training_bar is not None:
                    callback.training_bar.close()
                    callback.training_bar = None
            raise

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """Trainer's schedule, except that with a budget the linear one ends where the run is projected to end
        (`training/budget.py`)."""
        if self.lr_scheduler is not None or self.budget is None or self.args.lr_scheduler_type != "linear":
            return super().create_scheduler(num_training_steps, optimizer)
        warmup, budget = self.args.get_warmup_steps(num_training_steps), self.budget
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer or self.optimizer,
            lambda step: budgeted_linear_factor(step, warmup, num_training_steps, budget.projected_last_step(step)))
        self._created_lr_scheduler = True
        return self.lr_scheduler

    def create_optimizer(self, model=None):
        """Trainer's optimiser, with the BiALiBi slopes at `slope_learning_rate`, the TAPE maps at
        `tape_learning_rate` and the link gates and the window selector at `link_learning_rate` in groups of their own
        where set (no weight decay; the schedule scales those groups like the others)."""
        fresh = self.optimizer is None
        optimizer = super().create_optimizer(model)
        if not fresh:
            return optimizer
        named = [(n, p) for n, p in (model or self.model).named_parameters() if p.requires_grad]
        for marker, rate in ((".bialibi.", self.slope_learning_rate), ("tape_", self.tape_learning_rate),
                             (GATES, self.link_learning_rate), (SELECTOR + ".", self.link_learning_rate)):
            own = [p for n, p in named if marker in n]
            if rate is None or not own:
                continue
            chosen = {id(p) for p in own}
            for group in optimizer.param_groups:
                group["params"] = [p for p in group["params"] if id(p) not in chosen]
            optimizer.add_param_group({"params": own, "weight_decay": 0.0, "lr": rate})
        return optimizer

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """The micro-batches of the next optimiser step, with Padding Insertion's gaps keyed by (global step,
        micro-batch index, process): `state.global_step` counts the updates done, so it names the step these batches
        train, and a run resumed from checkpoint N draws at step N what the uninterrupted run drew there. Drawing in
        the collator instead would tie the gaps to the generator's history, which a checkpoint does not hold (and the
        data loader prefetches a batch ahead of the step). Evaluation never passes through here."""
        batches, items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self.padding_insertion is not None:
            step, process = self.state.global_step, self.args.process_index
            batches = [self.padding_insertion(batch, key=(step, index, process)) for index, batch in enumerate(batches)]
        return batches, items

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if self.args.train_sampling_strategy == "group_by_length" and hasattr(dataset, "lengths"):
            return LengthGroupedSampler(self.args.train_batch_size * self.args.gradient_accumulation_steps,
                                        lengths=dataset.lengths())
        return super()._get_train_sampler(train_dataset)

    def _get_output_dir(self, trial):
        # While `_save_checkpoint` runs, Trainer's run directory is the checkpoint's staging directory.
        staging = getattr(self, "_checkpoint_staging", None)
        return str(staging) if staging is not None else super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        """Trainer's own checkpoint (same files, so `resume_from_checkpoint` reads it), written whole into the hidden
        `.checkpoint-N.partial/` and renamed to `checkpoint-N` only when complete. A process killed mid-save (the
        weights written, the trainer state not yet: issue 22) used to leave a `checkpoint-N` that `--resume` picked
        and died on; now it leaves only the hidden directory, which the next run removes and reports. Trainer's
        rotation (`save_total_limit`) then runs over the real directory."""
        run_dir = Path(super()._get_output_dir(trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging = run_dir / f".{name}.partial"
        if self.args.should_save:
            shutil.rmtree(staging, ignore_errors=True)  # a killed save of this step must not mix into this one
        # Under torchrun every process writes into the checkpoint (its RNG state): all use the same staging name, it
        # is emptied before any of them writes and renamed after all of them have.
        self.accelerator.wait_for_everyone()
        self._checkpoint_staging = staging
        try:
            super()._save_checkpoint(model, trial)  # its rotation sees only this checkpoint: it removes nothing
        finally:
            self._checkpoint_staging = None
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            self.write_checkpoint_record(staging / name)
            ordinary_permissions(staging / name)  # safetensors writes its weights 0600
            publish_checkpoint(staging / name, run_dir / name)
            staging.rmdir()
            rotate_checkpoints(output_dir=str(run_dir), save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)

    def write_checkpoint_record(self, directory: Path) -> None:
        if self.checkpoint_record is not None:
            record = {**self.checkpoint_record, "checkpoint_step": self.state.global_step,
                      "note": "a checkpoint of an unfinished run: the run's own record is written with its model"}
            (Path(directory) / "longbird_finetune.json").write_text(json.dumps(record, indent=2), encoding="utf-8")

    @contextmanager
    def _evaluation_collator(self):
        collator = self.data_collator
        was_training = getattr(collator, "training", None)
        if was_training is not None:
            collator.eval()
        try:
            yield
        finally:
            if was_training is not None:
                collator.train(was_training)

    def evaluate(self, *args, **kwargs):
        with self._evaluation_collator():
            return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        with self._evaluation_collator():
            return super().predict(*args, **kwargs)
