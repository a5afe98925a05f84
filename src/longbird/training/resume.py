"""Atomic Trainer checkpoints and exact resume: each checkpoint is renamed into place only when complete, and a resumed
run starts from the last complete one, reporting what it skipped and what its metrics cover."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .processes import is_main_process

logger = logging.getLogger("longbird.training.finetune")  # the logger these messages always had (tests read it)


# Checkpoints are written as `.checkpoint-N.partial/checkpoint-N` and renamed to `checkpoint-N` when complete; a
# `checkpoint-N` saved again (a resumed run passing a step it had saved) is first moved to `.checkpoint-N.replaced`.
# The leading dot keeps both out of Trainer's `checkpoint-*` globs (resume, rotation) and experiments' listings.
CHECKPOINT_NAME = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
LEFTOVER_NAME = re.compile(rf"^\.((?:{PREFIX_CHECKPOINT_DIR}|interrupted-step)-\d+)\.(partial|replaced)$")
TRAINER_STATE = "trainer_state.json"  # Trainer writes it last: a checkpoint without it is incomplete
# What makes a resumed run the run it continues: a checkpoint saved with other values would go on on another schedule,
# batch or seed while the summary records the new settings as if they covered every step.
RUN_ARGUMENTS = ("per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "lr_scheduler_type",
                 "warmup_steps", "weight_decay", "max_steps", "num_train_epochs", "seed", "train_sampling_strategy",
                 "bf16", "fp16")
RUN_CONFIG = ("model_type", "attention", "position", "hidden_size", "num_hidden_layers", "max_position_embeddings",
              "vocab_size", "block_size")


def publish_checkpoint(written: Path, target: Path) -> None:
    """Rename the complete checkpoint `written` to `target`. An existing `target` (saved at the same step by an
    earlier run, or an incomplete one an older longbird left) is moved aside first and removed once `written` is in
    place: a kill at any point leaves either checkpoint whole, never a mixture of the two."""
    if not target.exists():
        os.replace(written, target)
        return
    aside = target.parent / f".{target.name}.replaced"
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(target, aside)
    os.replace(written, target)
    shutil.rmtree(aside, ignore_errors=True)


def _wait_for(path: Path, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the first process did not restore {path} within {seconds:.0f} s")
        time.sleep(0.1)


def _step_of(path: Path) -> int:
    return int(CHECKPOINT_NAME.match(path.name).group(1))


def prepare_checkpoints(checkpoint_dir: str | Path, resume: bool, max_steps: int = -1, arguments=None,
                        config=None, run_settings: dict | None = None) -> dict | None:
    """Before a run that keeps checkpoints in `checkpoint_dir`: remove the hidden leftovers of saves that were killed
    (each reported), and with `resume` choose the last complete checkpoint, skipping (and reporting) any
    `checkpoint-N` without trainer_state.json (what a kill mid-save left before saves were atomic). Says in one line
    where it resumes. Returns the resume record for the run's summary (None without `resume`); its "checkpoint" is
    the directory to pass to Trainer. `max_steps` (-1: from the checkpoint) is only for the report. A run without
    `resume` is refused where complete checkpoints of an earlier run are there (a fresh run would save its own among
    them, and a later --resume would pick whichever is newest); with `resume`, the chosen checkpoint must have been
    saved with the same `arguments` (TrainingArguments, `RUN_ARGUMENTS`), a model of the same `config` (`RUN_CONFIG`)
    and the same `run_settings` (the command's own, recorded in the checkpoint by `finetune.train`)."""
    checkpoint_dir = Path(checkpoint_dir)
    entries = sorted(checkpoint_dir.iterdir()) if checkpoint_dir.is_dir() else []
    skipped = []
    for path in entries:
        leftover = LEFTOVER_NAME.match(path.name)
        if leftover and path.is_dir():
            what, target = leftover.group(1), checkpoint_dir / leftover.group(1)
            if leftover.group(2) == "replaced" and not target.exists():
                # killed between publish_checkpoint's two renames: the checkpoint moved aside is whole, put it back
                if is_main_process():
                    os.replace(path, target)
                    logger.warning("restored %s (a save of the same step was interrupted; it was set aside as %s)",
                                   what, path.name)
                else:  # the first process puts it back (no process group yet to wait on): see it there
                    _wait_for(target)
                continue
            skipped.append(f"{what} (its save was interrupted; removed the temporary {path.name})")
            if is_main_process():  # the others see the same directory; one process removes
                shutil.rmtree(path, ignore_errors=True)
                logger.warning("skipping incomplete %s", skipped[-1])
    entries = sorted(checkpoint_dir.iterdir()) if checkpoint_dir.is_dir() else []
    candidates = sorted((p for p in entries if CHECKPOINT_NAME.match(p.name) and p.is_dir()), key=_step_of)
    complete = [p for p in candidates if (p / TRAINER_STATE).is_file()]
    if not resume:
        if complete:
            names = ", ".join(path.name for path in complete)
            raise FileExistsError(f"{checkpoint_dir} holds checkpoints of an earlier run ({names}): --resume "
                                  "continues that run; for a fresh one remove that directory (--overwrite replaces "
                                  "the model, not them) or choose another --out (distill, pretrain: --output-dir)")
        return None
    for path in candidates:
        if path not in complete:
            skipped.append(f"{path.name} (no {TRAINER_STATE})")
            if is_main_process():
                logger.warning("skipping incomplete %s", skipped[-1])
    if not complete:
        found = f"no complete checkpoint under {checkpoint_dir} (skipped: {'; '.join(skipped)})" if skipped else \
            f"no checkpoint under {checkpoint_dir}"
        raise FileNotFoundError(f"--resume: {found}; start without --resume")
    chosen = complete[-1]
    check_same_run(chosen, arguments, config, run_settings)
    state = json.loads((chosen / TRAINER_STATE).read_text(encoding="utf-8"))
    step = int(state["global_step"])
    total = max_steps if max_steps > 0 else state.get("max_steps")
    if is_main_process():
        logger.warning("resuming from %s, step %d of %s", chosen.name, step, total)
    return {"checkpoint": str(chosen), "from_step": step, "skipped": skipped, "total_steps": total}


def check_same_run(checkpoint: Path, arguments=None, config=None, run_settings: dict | None = None) -> None:
    """ValueError naming every difference between the run being resumed and the one that saved `checkpoint`: its
    TrainingArguments (`training_args.bin`, `RUN_ARGUMENTS`), its model's config (`config.json`, `RUN_CONFIG`) and
    the command's own settings (`run` in its `longbird_finetune.json`; checkpoints written before 2026-12-06 have
    none)."""
    import torch

    differences = []
    saved_arguments = checkpoint / "training_args.bin"
    if arguments is not None and saved_arguments.is_file():
        saved = torch.load(saved_arguments, weights_only=False)  # written by Trainer in this run's directory
        differences += [f"{name} {_plain(getattr(saved, name, None))} -> {_plain(getattr(arguments, name, None))}"
                        for name in RUN_ARGUMENTS
                        if _plain(getattr(saved, name, None)) != _plain(getattr(arguments, name, None))]
    saved_config = checkpoint / "config.json"
    if config is not None and saved_config.is_file():
        saved = json.loads(saved_config.read_text(encoding="utf-8"))
        differences += [f"{name} {saved.get(name)} -> {getattr(config, name, None)}" for name in RUN_CONFIG
                        if name in saved and saved[name] != getattr(config, name, None)]
    saved_record = checkpoint / "longbird_finetune.json"
    if run_settings and saved_record.is_file():
        saved = json.loads(saved_record.read_text(encoding="utf-8")).get("run") or {}
        differences += [f"{name} {saved[name]} -> {value}" for name, value in run_settings.items()
                        if name in saved and saved[name] != value]
    if differences:
        raise ValueError(f"--resume: {checkpoint} was saved by a run with other settings ({'; '.join(differences)}); "
                         f"resume with the options that run was started with, or start a fresh run into another --out "
                         "(distill, pretrain: --output-dir)")


def _plain(value):
    return getattr(value, "value", value)  # enums (lr_scheduler_type, train_sampling_strategy) by their value


def finished_at_checkpoint(resume: dict | None) -> bool:
    """Whether the checkpoint a run resumes from is its last step already (killed after its last save, before its
    model was written): Trainer would then train one step more (transformers 5 checks max_steps only after a step)."""
    return bool(resume) and bool(resume.get("total_steps")) and resume["from_step"] >= resume["total_steps"]


def load_finished_run(trainer, checkpoint: str):
    """The run a checkpoint of its last step holds, as `trainer.train` would leave it had it not stepped again: the
    weights (Trainer's own loading, for every format it saves) and the trainer state with its log history; no
    metrics, since no step was trained."""
    from transformers.trainer_callback import TrainerState
    from transformers.trainer_utils import TrainOutput

    trainer._load_from_checkpoint(checkpoint)
    trainer.state = TrainerState.load_from_json(str(Path(checkpoint) / TRAINER_STATE))
    return TrainOutput(trainer.state.global_step, None, {})


def resume_summary(resume: dict, final_step: int) -> dict:
    """What the summary says of a resumed run. The coverage is Trainer's (transformers 5): train_loss is the loss summed
    over the steps trained since the resume divided by their number, and the restored TrainerState brings the log
    history of the steps before it."""
    first = resume["from_step"] + 1
    trained = [first, final_step] if final_step >= first else []  # resumed from the last step: nothing left to train
    return {"resumed": True, "from_checkpoint": Path(resume["checkpoint"]).name, "from_step": resume["from_step"],
            "skipped_incomplete": resume["skipped"], "steps_trained_by_this_run": trained,
            "metrics_cover": (f"steps {first}-{final_step} only: train_loss is the mean loss of the steps this run "
                              "trained, train_runtime and the speeds are this run's") if trained else
                             "no steps: the run resumed from its last step",
            "log_history_covers": f"all steps: the entries up to step {resume['from_step']} are the interrupted "
                                  f"run's (restored from the checkpoint), the first one after it averages steps "
                                  f"from {first} only"}
