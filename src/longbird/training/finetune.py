"""Trainer glue for fine-tuning: QA windows and classification documents through `transformers.Trainer`.

Trainer brings the optimiser, schedule, logging and progress bars, and `accelerate launch` / `torchrun`
turn the same call into multi-GPU training. Padding Insertion (LittleBird §3.4) is applied by the trainer to the
training batches of each optimiser step, keyed by that step, so a resumed run continues it exactly.
"""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import TrainingArguments

from ..data.batching import PaddedBatches
from ..data.features import QAFeature
from ..files import ordinary_permissions
from ..linked_windows import GATES
from ..precision import slow_bf16_warning
from .budget import check_budget_minutes, training_budget
from .padding_insertion import PaddingInsertion, sentence_end_token_ids
from .processes import is_main_process, leave_the_group_at_exit, world_size
from .resume import (
    finished_at_checkpoint,
    load_finished_run,
    prepare_checkpoints,
    publish_checkpoint,
    resume_summary,
)
from .trainer import LongBirdTrainer

logger = logging.getLogger(__name__)


@dataclass
class FinetuneSettings:
    """What a fine-tuning run needs beyond the data; mirrors the CLI options."""

    learning_rate: float = 5e-5
    epochs: float = 1.0
    max_steps: int = -1
    batch_size: int = 4
    gradient_accumulation_steps: int = 1
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    seed: int = 0
    padding_insertion: bool = False
    padding_insertion_probability: float = 0.2
    padding_insertion_max_gap: int = 256
    bf16: bool = False
    fp16: bool = False
    # "auto": CUDA when present (Trainer's own choice), "cpu" or "cuda"; one process sees one GPU, so pick one with
    # CUDA_VISIBLE_DEVICES and several through `accelerate launch` / `torchrun`.
    device: str = "auto"
    # A 250K-piece vocabulary (XLM-R, multilingual-e5-small) makes the dense gradient of the word embeddings
    # (96M of 118M parameters) dominate a CPU step: they are frozen unless asked for.
    train_word_embeddings: bool = False
    logging_steps: int = 20
    # "tape": parameter-efficient fine-tuning of a TAPE model (training/peft.py: TAPE maps + task head only).
    peft: str | None = None
    progress: bool = True
    # Checkpoints every N optimiser steps (0: none) under OUT.checkpoints/, which `resume` continues from; kept after
    # the run (they are what a learning curve is read from).
    save_steps: int = 0
    resume: bool = False
    # Keep only the newest N checkpoints (Trainer's save_total_limit; None: all of them).
    save_total_limit: int | None = None
    # Learning rate of the BiALiBi slopes (α, β, γ; LittleBird §3.1) when set: they start at ALiBi's 0.004-0.63 and
    # move ~lr per Adam step, so at the encoder's 1e-4 a short run leaves them where they started.
    slope_learning_rate: float | None = None
    # Learning rate of the TAPE maps (every `tape_*` parameter: W_post, the feed-forward side's maps, the phase clock
    # and gate; positions/tape.py) when set. W_post, W1 and the phase gate start at zero (a converted model equals its
    # source), and at the encoder's 5e-5 an update moves them ~5e-5: a short run leaves the position states at e = 1.
    tape_learning_rate: float | None = None
    # Learning rate of the link gates of a model with linked windows (linked_windows.py: one scalar per layer, zero at
    # init) and of its window selector (window_selector.py, zero at init) when set; at the encoder's 5e-5 a short run
    # leaves them near zero, i.e. the windows unlinked.
    link_learning_rate: float | None = None
    # Batches of windows of similar length (Trainer's "group_by_length" sampling: random megabatches of 50 batches,
    # sorted by length within): a batch is padded to its longest window, so random batches of KorQuAD paragraphs
    # (median 295 of 512 tokens) spend a third of their tokens on padding. The lengths come from the dataset's own
    # `lengths()` where it has one (data/windows.py), so no item is built to measure it.
    group_by_length: bool = False
    # torch.compile the model in training (Trainer's `torch_compile`): forward and backward as Inductor graphs; the
    # first step of each batch shape compiles. Gradients equal eager ones (tests/test_compile_reading.py).
    compile: bool = False
    # "linear" decay to 0 at the run's last step (after warmup): max_steps, or where a time budget is projected to run
    # out if that comes first (training/budget.py); or "constant" after warmup.
    lr_scheduler: str = "linear"
    # Stop after this many minutes of the process's CPU time in training (all its threads: 2 threads for 1 wall
    # minute use 2 CPU minutes), checked after every optimiser step: equal budgets for methods whose steps cost
    # differently (experiments/e7_long_reading.py). None: no budget.
    cpu_minutes: float | None = None
    # Stop after this many minutes of wall-clock time in training, checked after every optimiser step: a recipe that
    # must fit an hour on whatever machine runs it (`make qa-model`). None: no budget.
    wall_minutes: float | None = None

    def __post_init__(self):
        if self.lr_scheduler not in ("linear", "constant"):
            raise ValueError(f"the learning-rate schedule must be 'linear' or 'constant'; got {self.lr_scheduler!r}")
        check_budget_minutes(self.cpu_minutes, self.wall_minutes)
        if self.peft not in (None, "tape"):
            raise ValueError(f"--peft must be 'tape' (or left out); got {self.peft!r}")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise ValueError(save_total_limit_error(self.save_total_limit))
        # Trainer reads any max_steps <= 0 as "train --epochs", so a typo such as --max-steps -5 would silently train
        # a whole epoch: -1 (the default) is the only "not set".
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"--max-steps must be at least 1; got {self.max_steps} (leave it out for the command's "
                             "default: --epochs where it has them)")
        checks = (("--learning-rate", self.learning_rate, self.learning_rate > 0, "a positive number such as 5e-5"),
                  ("--epochs", self.epochs, self.epochs > 0, "a positive number of passes over the data"),
                  ("--batch-size", self.batch_size, self.batch_size >= 1, "at least 1"),
                  ("--gradient-accumulation-steps", self.gradient_accumulation_steps,
                   self.gradient_accumulation_steps >= 1, "at least 1"),
                  ("--save-steps", self.save_steps, self.save_steps >= 0, "0 (no checkpoints) or more"),
                  ("--logging-steps", self.logging_steps, self.logging_steps >= 1, "at least 1"),
                  ("--warmup-ratio", self.warmup_ratio, 0 <= self.warmup_ratio < 1, "in [0, 1)"),
                  *((option, rate, rate > 0, "a positive number (leave it out for --learning-rate)")
                    for option, rate in (("--slope-learning-rate", self.slope_learning_rate),
                                         ("--tape-learning-rate", self.tape_learning_rate),
                                         ("--link-learning-rate", self.link_learning_rate)) if rate is not None))
        for option, value, valid, expected in checks:
            if not valid:
                raise ValueError(f"{option} must be {expected}; got {value}")


def save_total_limit_error(limit: int) -> str:
    return (f"--save-total-limit must be at least 1 (the number of newest checkpoints kept; leave it out to keep them "
            f"all); got {limit}")


def qa_training_items(features: list[QAFeature], negative_fraction: float = 1.0, seed: int = 0) -> list[dict]:
    """Model inputs with start/end labels. Windows without the answer (labelled [CLS]) are kept with
    probability `negative_fraction`, so long documents do not drown the signal in empty windows."""
    rng = random.Random(seed)
    items = []
    for feature in features:
        if feature.start_position == 0 and rng.random() >= negative_fraction:
            continue
        items.append({**feature.model_inputs(), "start_positions": feature.start_position,
                      "end_positions": feature.end_position})
    return items


def make_padding_insertion(model, tokenizer, settings: FinetuneSettings) -> PaddingInsertion | None:
    """Padding Insertion when the settings ask for it, seeded by the run's seed; with a learned position table
    (`config.uses_position_table`: absolute positions, and TAPE over a converted source) gaps are capped so every id
    stays inside the table."""
    if not settings.padding_insertion:
        return None
    config = model.config
    max_positions = config.max_position_embeddings if config.uses_position_table else None
    return PaddingInsertion(sentence_end_token_ids(tokenizer), settings.padding_insertion_probability,
                            settings.padding_insertion_max_gap, seed=settings.seed, max_positions=max_positions)


TINY_TRAINING_SET_PASSES = 10  # more passes over the same windows than this is memorising, not fine-tuning


def repeated_passes(windows: int, settings: FinetuneSettings) -> float:
    """How many times `settings.max_steps` read each of `windows` training windows (0 when training by --epochs,
    whose count the user chose in passes already)."""
    if settings.max_steps < 1:
        return 0.0
    return settings.max_steps * settings.batch_size * settings.gradient_accumulation_steps * world_size() / windows


def memorisation_warning(windows: int, settings: FinetuneSettings) -> str | None:
    """The warning for a run whose --max-steps read each training window more than `TINY_TRAINING_SET_PASSES` times,
    or None. A run stopped by --cpu-minutes or --wall-minutes treats --max-steps as a bound it may not reach: no
    warning from it."""
    passes = repeated_passes(windows, settings)
    if passes <= TINY_TRAINING_SET_PASSES or settings.cpu_minutes is not None or settings.wall_minutes is not None:
        return None
    return (f"the training set has {windows:,} window(s) and {settings.max_steps:,} steps of "
            f"{settings.batch_size * settings.gradient_accumulation_steps} windows read each about {passes:.0f} times: "
            "the model will learn these windows by heart; give more data or fewer --max-steps")


def check_training_device(settings: FinetuneSettings) -> None:
    """Clear errors for devices and precisions Trainer cannot honour here."""
    if settings.device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"training device must be auto, cpu or cuda; got {settings.device!r} (choose the GPU with "
                         "CUDA_VISIBLE_DEVICES, several with `accelerate launch` or `torchrun`)")
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device cuda: CUDA is not available on this machine (torch {torch.__version__}); "
                         "use --device cpu")
    on_gpu = settings.device != "cpu" and torch.cuda.is_available()
    if settings.fp16 and settings.bf16:  # first: the CPU's advice below would be to keep one of the two
        raise ValueError("--fp16 and --bf16 exclude each other; pick one")
    if settings.fp16 and not on_gpu:
        raise ValueError("--fp16 mixed precision needs a CUDA GPU; use --bf16 on CPU")
    slow = slow_bf16_warning("cuda" if on_gpu else "cpu") if settings.bf16 else None
    if slow:
        warnings.warn(slow, stacklevel=2)


def train(model, tokenizer, items: list[dict], out_dir: str | Path, settings: FinetuneSettings,
          checkpoint_dir: str | Path | None = None, collator=None, trainer_class=None,
          trainer_kwargs: dict | None = None, checkpoint_record: dict | None = None,
          run_settings: dict | None = None) -> dict:
    """Fine-tune `model` on prepared items with Trainer (scratch space: `out_dir`/trainer, removed after). With
    `settings.save_steps`, checkpoints (model, tokenizer, optimiser, scheduler and RNG states) go to `checkpoint_dir`
    and stay (the newest `settings.save_total_limit` of them, if set), each renamed into place when complete;
    `settings.resume` continues from the last complete one (`prepare_checkpoints`). Returns the training metrics, the
    log history and "resume" (None, or where the run resumed and what its metrics cover). `run_settings`: the
    command's own settings that change what a step computes (a pretraining --length, distillation's weights),
    written into every checkpoint with Padding Insertion's and compared on --resume. Saving the final model is the
    caller's job (atomically)."""
    check_training_device(settings)
    if not items:
        raise ValueError("no training items: every window was filtered out or the dataset is empty")
    memorising = memorisation_warning(len(items), settings)
    if memorising and is_main_process():  # once, not once per process
        warnings.warn(memorising, stacklevel=2)
    keep = settings.save_steps > 0 or settings.resume
    if settings.save_total_limit is not None and settings.save_steps == 0 and is_main_process():
        warnings.warn(f"--save-total-limit {settings.save_total_limit} keeps nothing: no checkpoint is saved without "
                      "--save-steps N", stacklevel=2)
    if keep and checkpoint_dir is None:
        raise ValueError("checkpoints need a checkpoint directory")
    model.get_input_embeddings().weight.requires_grad_(settings.train_word_embeddings)
    if settings.peft == "tape":
        from .peft import tape_peft

        tape_peft(model)
    if settings.tape_learning_rate is not None and not any("tape_" in name for name, _ in model.named_parameters()):
        raise ValueError("--tape-learning-rate sets the rate of a TAPE model's maps, and this model has none: convert "
                         "with --preset tape, or leave --tape-learning-rate out")
    gates = any(name.endswith(GATES) for name, _ in model.named_parameters())
    if settings.link_learning_rate is not None and not gates:
        raise ValueError("--link-learning-rate sets the rate of the link gates, and this model has none: convert with "
                         "--set linked_windows=true, or leave --link-learning-rate out")
    arguments = TrainingArguments(
        output_dir=str(checkpoint_dir if keep else Path(out_dir) / "trainer"),
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        learning_rate=settings.learning_rate,
        num_train_epochs=settings.epochs,
        max_steps=settings.max_steps,
        warmup_steps=settings.warmup_ratio,
        weight_decay=settings.weight_decay,
        seed=settings.seed,
        bf16=settings.bf16,
        fp16=settings.fp16,
        use_cpu=settings.device == "cpu" or not torch.cuda.is_available(),
        # A run shorter than the logging interval would record no loss at all: log at its last step then.
        logging_steps=min(settings.logging_steps, settings.max_steps) if settings.max_steps > 0
        else settings.logging_steps,
        save_strategy="steps" if settings.save_steps > 0 else "no",
        save_steps=max(settings.save_steps, 1),
        save_total_limit=settings.save_total_limit,
        report_to=[],
        train_sampling_strategy="group_by_length" if settings.group_by_length else "random",
        lr_scheduler_type="linear" if settings.lr_scheduler == "linear" else "constant_with_warmup",
        include_num_input_tokens_seen="non_padding",  # real tokens trained on: budgets are stated in tokens too
        remove_unused_columns=False,
        disable_tqdm=not settings.progress,
        dataloader_num_workers=0,
        torch_compile=settings.compile,
    )
    run_settings = {"padding_insertion": settings.padding_insertion, **(run_settings or {})}
    checkpoint_record = {**(checkpoint_record or {}), "run": run_settings}
    resume = (prepare_checkpoints(checkpoint_dir, settings.resume, settings.max_steps, arguments, model.config,
                                  run_settings) if keep else None)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    budget = training_budget(settings.cpu_minutes, settings.wall_minutes)
    trainer = (trainer_class or LongBirdTrainer)(
        model=model, args=arguments, train_dataset=items, processing_class=tokenizer,
        data_collator=collator or PaddedBatches(pad), slope_learning_rate=settings.slope_learning_rate,
        tape_learning_rate=settings.tape_learning_rate, link_learning_rate=settings.link_learning_rate,
        padding_insertion=make_padding_insertion(model, tokenizer, settings), budget=budget,
        checkpoint_record=checkpoint_record, **(trainer_kwargs or {}))
    finished = False
    try:
        if finished_at_checkpoint(resume):  # nothing left to train (Trainer would take one step more)
            result = load_finished_run(trainer, resume["checkpoint"])
            if budget is not None:  # what the run spent, from the checkpoint, as Trainer's start would have read it
                budget.on_train_begin(arguments, trainer.state, trainer.control)
        else:  # the checkpoint chosen above, not Trainer's `True` (the highest-numbered one, complete or not)
            result = trainer.train(resume_from_checkpoint=resume["checkpoint"] if resume else None)
        finished = True
        leave_the_group_at_exit()
    except KeyboardInterrupt:
        if checkpoint_dir is not None:  # Ctrl-C: keep the model as it is and say where
            saved = Path(checkpoint_dir) / f"interrupted-step-{trainer.state.global_step}"
            staging = saved.with_name(f".{saved.name}.partial")  # reported and removed by the next run if left
            if is_main_process():
                shutil.rmtree(staging, ignore_errors=True)
            # every process: Trainer writes from the first only (and gathers the weights first under FSDP / ZeRO-3)
            trainer.save_model(str(staging))
            if is_main_process():  # whole or not at all, with ordinary permissions, as every checkpoint
                trainer.write_checkpoint_record(staging)
                ordinary_permissions(staging)
                publish_checkpoint(staging, saved)
            logger.warning("interrupted at step %d: the model so far is in %s%s", trainer.state.global_step, saved,
                           "; --resume continues from the last periodic checkpoint" if keep else "")
        raise
    finally:
        if not keep:
            # Under torchrun every process trains into the same scratch directory: after a finished run it goes once
            # all processes are out of train() and only from the first (a process that removed it early made another
            # fail writing there: "No such file or directory: .../.work/trainer", seen in CI).
            if finished:
                trainer.accelerator.wait_for_everyone()
            if not finished or is_main_process():
                shutil.rmtree(arguments.output_dir, ignore_errors=True)  # nothing is saved there (save_strategy="no")
                with contextlib.suppress(OSError):
                    Path(arguments.output_dir).parent.rmdir()
    return {**result.metrics, "log_history": trainer.state.log_history,
            "cpu_budget": None, "wall_budget": None, **(budget.summary() if budget is not None else {}),
            "tokens_seen": int(trainer.state.num_input_tokens_seen),
            "resume": resume_summary(resume, trainer.state.global_step) if resume else None}
