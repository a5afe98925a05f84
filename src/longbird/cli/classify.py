"""Document classification: `finetune-cls` (longbird.tasks.classification); `evaluate --task classification` is in
`cli.qa`."""

from pathlib import Path
from typing import Annotated

import typer

from .common import print_metrics, training_settings
from .options import (
    BatchSize,
    Compile,
    ConvertLength,
    ConvertPreset,
    Epochs,
    FinetuneLoggingSteps,
    Fp16,
    LabelField,
    LearningRate,
    MaxStepsOverEpochs,
    MixedBf16,
    Model,
    Out,
    Overwrite,
    PaddingInsertion,
    Resume,
    SaveSteps,
    SaveTotalLimit,
    Seed,
    TapeLearningRate,
    TaskPeft,
    TextField,
    TrainDevice,
    TrainWordEmbeddings,
)

Documents = Annotated[Path, typer.Option("--train", help="JSONL/CSV with a text and a label per document")]
Window = Annotated[int | None, typer.Option(help="Window in tokens (default: the model length)")]
Stride = Annotated[int | None, typer.Option(min=0, help="Tokens shared by neighbouring windows (default: 128, a "
                                                        "quarter of a shorter window)")]


def finetune_cls(
    train: Documents, out: Out, model: Model = None, preset: ConvertPreset = "kobigbird",
    max_length: ConvertLength = 4096, window_length: Window = None, stride: Stride = None,
    text_field: TextField = "text", label_field: LabelField = "label", learning_rate: LearningRate = 5e-5,
    epochs: Epochs = 1.0, max_steps: MaxStepsOverEpochs = -1,
    batch_size: BatchSize = 4, seed: Seed = 0, padding_insertion: PaddingInsertion = False,
    bf16: MixedBf16 = False, fp16: Fp16 = False,
    device: TrainDevice = "auto", train_word_embeddings: TrainWordEmbeddings = False, save_steps: SaveSteps = 0,
    save_total_limit: SaveTotalLimit = None, logging_steps: FinetuneLoggingSteps = 20, peft: TaskPeft = None,
    tape_learning_rate: TapeLearningRate = None,
    compile: Compile = False, resume: Resume = False, overwrite: Overwrite = False,
):
    """Fine-tune long-document classification (windows of a long document share its label)."""
    settings = training_settings(locals())
    from ..tasks.classification import finetune_cls as run

    metrics = run(model_path=model, train_data=train, out=out, preset=preset, max_length=max_length,
                  window_length=window_length, stride=stride, text_field=text_field, label_field=label_field,
                  settings=settings, overwrite=overwrite)
    print_metrics(f"fine-tuned classifier saved to {out}", metrics)
