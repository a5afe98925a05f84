"""Long-input pretraining: `distill` and `pretrain` (longbird.tasks.pretraining); `longbird pretrain` trains with
Recurring Span Selection."""

from pathlib import Path
from typing import Annotated

import typer

from .common import print_metrics, training_settings
from .options import (
    BatchSize,
    ConvertLength,
    ConvertPreset,
    Corpus,
    GradientAccumulationSteps,
    GradientCheckpointing,
    LearningRate,
    MaxSteps,
    MixedBf16,
    OverwriteRun,
    PaddingInsertion,
    Peft,
    Resume,
    SaveSteps,
    SaveTotalLimit,
    Seed,
    SlopeLearningRate,
    TrainDevice,
)

Teacher = Annotated[str, typer.Option(help="The short source model: a directory or a named embedded source")]
Student = Annotated[Path | None, typer.Option(help="A longbird directory (default: the teacher converted with "
                                                   "--preset and --max-length)")]
StudentPreset = Annotated[str, typer.Option(help="Preset when the student is converted: littlebird, kobigbird, full, "
                                                "tape")]
StudentLength = Annotated[int, typer.Option(help="Student length when converted")]
TeacherWindow = Annotated[int | None, typer.Option(help="Training window in tokens (default and maximum: the "
                                                        "teacher's)")]
Rss = Annotated[bool, typer.Option(help="Learn Recurring Span Selection at the same time (loss = RSS + beta * "
                                        "attention KL; the student is saved as a span-selection model)")]
StudentPaddingInsertion = Annotated[bool, typer.Option(help="Padding Insertion on the student's position ids "
                                                            "(LittleBird 3.4); the teacher reads the same tokens at "
                                                            "its own positions")]
Alpha = Annotated[float, typer.Option(help="Weight of the soft-target KL (teachers with an MLM head)")]
Beta = Annotated[float, typer.Option(help="Weight of the attention KL")]
Temperature = Annotated[float, typer.Option(help="Soft-target temperature")]
EverySteps = Annotated[int, typer.Option(help="Checkpoint every N steps")]
LossesEvery = Annotated[int, typer.Option(help="Log the losses every N steps")]
RunResume = Annotated[bool, typer.Option(help="Continue from the last complete checkpoint in OUTPUT_DIR/checkpoints "
                                              "(incomplete ones are skipped and reported)")]

RunDirectory = Annotated[Path, typer.Option("--output-dir", help="Run directory: model/ and checkpoints/")]
StartModel = Annotated[str | None, typer.Option(help="A longbird directory (e.g. distill's model) or a source to "
                                                     "convert with --preset")]
Window = Annotated[int, typer.Option(help="Training window in tokens (long inputs: 2048, 4096)")]
LossEvery = Annotated[int, typer.Option(help="Log the loss every N steps")]


def distill(
    output_dir: Annotated[Path, typer.Option("--output-dir", help="Run directory: model/ (the student), checkpoints/")],
    teacher: Teacher = "multilingual-e5-small", student: Student = None, preset: StudentPreset = "littlebird",
    max_length: StudentLength = 4096, corpus: Corpus = (), length: TeacherWindow = None, rss: Rss = False,
    padding_insertion: StudentPaddingInsertion = False, alpha: Alpha = 1.0, beta: Beta = 1.0,
    temperature: Temperature = 1.0, learning_rate: LearningRate = 1e-4, max_steps: MaxSteps = 100,
    batch_size: BatchSize = 4, seed: Seed = 0, save_steps: EverySteps = 50, save_total_limit: SaveTotalLimit = None,
    logging_steps: LossesEvery = 10, resume: RunResume = False, bf16: MixedBf16 = False,
    gradient_checkpointing: GradientCheckpointing = False, slope_learning_rate: SlopeLearningRate = None,
    gradient_accumulation_steps: GradientAccumulationSteps = 1, peft: Peft = None, device: TrainDevice = "auto",
    overwrite: OverwriteRun = False,
):
    """Distil the short source into a long student (LittleBird 3.4): attention KL per layer + soft targets."""
    # --save-steps and --resume are the distillation's own (tasks.pretraining.distill puts them into the settings)
    settings = training_settings(locals(), save_steps=0, resume=False)
    from ..tasks.pretraining import distill as run

    metrics = run(teacher_source=teacher, output_dir=output_dir, student_path=student, preset=preset,
                  max_length=max_length, corpus=list(corpus) or None, length=length, settings=settings, alpha=alpha,
                  beta=beta, temperature=temperature, save_steps=save_steps, resume=resume,
                  gradient_checkpointing=gradient_checkpointing, overwrite=overwrite, rss=rss)
    print_metrics(f"distilled student saved to {metrics['model_dir']}", metrics)


def pretrain(
    output_dir: RunDirectory, model: StartModel = "multilingual-e5-small", preset: ConvertPreset = "littlebird",
    max_length: ConvertLength = 4096, corpus: Corpus = (), length: Window = 2048,
    learning_rate: LearningRate = 1e-4, max_steps: MaxSteps = 100, batch_size: BatchSize = 1, seed: Seed = 0,
    padding_insertion: PaddingInsertion = False, save_steps: SaveSteps = 50, save_total_limit: SaveTotalLimit = None,
    logging_steps: LossEvery = 10, resume: Resume = False, bf16: MixedBf16 = False,
    gradient_checkpointing: GradientCheckpointing = False, slope_learning_rate: SlopeLearningRate = None,
    gradient_accumulation_steps: GradientAccumulationSteps = 1, peft: Peft = None, device: TrainDevice = "auto",
    overwrite: OverwriteRun = False,
):
    """Continued long training with Recurring Span Selection (LittleBird 3.4 step 3); reports held-out RSS accuracy."""
    settings = training_settings(locals())
    from ..tasks.pretraining import pretrain as run

    metrics = run(model_path=model, output_dir=output_dir, corpus=list(corpus) or None, length=length, preset=preset,
                  max_length=max_length, settings=settings, overwrite=overwrite,
                  gradient_checkpointing=gradient_checkpointing)
    print_metrics(f"pretrained model saved to {metrics['model_dir']}", metrics)
