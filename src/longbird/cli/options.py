"""The options more than one command shares, each help text written once: typer `Annotated` aliases, whose default
each command gives after `=` (`learning_rate: LearningRate = 5e-5`). Where two commands say different things about an
option of the same name, each wording has its own alias. Importing this module loads neither torch nor transformers."""

from pathlib import Path
from typing import Annotated

import typer

PRESET_HELP = ("kobigbird (BigBird ITC + TAPER), littlebird (BiALiBi + USW + pack), tape (full attention + TAPE "
               "position states), full (dense, for comparison)")
MODEL_HELP = ("longbird model directory, a HF encoder directory to convert, or a named embedded source to convert: "
              "minilm (default) or multilingual-e5-small")
DEVICE_HELP = "cpu, cuda or cuda:N (default auto: CUDA when present)"
TRAIN_DEVICE_HELP = "auto (CUDA when present), cpu or cuda; pick a GPU with CUDA_VISIBLE_DEVICES"
CORPUS_HELP = ("Text/JSONL files or directories (repeatable; default: the repository's Korean text: KorQuAD, TyDi QA "
               "Korean, laws and bills, with the KorQuAD 1.0 dev-split articles held out)")
SLOPE_LR_HELP = ("Learning rate of the BiALiBi slopes (littlebird; default: --learning-rate, which barely moves them "
                 "in a short run)")
TAPE_LR_HELP = ("Learning rate of the TAPE maps (every tape_* parameter of a TAPE model; default: --learning-rate, "
                "which barely moves them from their zero start in a short run)")
PEFT_HELP = "tape: train only the TAPE maps (+ the task head) of a TAPE model; saves only what was trained"
TASK_PEFT_HELP = ("tape: train only the TAPE maps and the task head of a TAPE model (--preset tape); OUT then holds "
                  "only what was trained")
SAVE_STEPS_HELP = ("Checkpoint every N steps into OUT.checkpoints/ (distill, pretrain: OUTPUT_DIR/checkpoints/; 0: "
                   "none; Ctrl-C then keeps the model too)")
RESUME_HELP = ("Continue from the last complete checkpoint in OUT.checkpoints/ (distill, pretrain: "
               "OUTPUT_DIR/checkpoints/; same options as the interrupted run; incomplete ones are skipped and "
               "reported)")
SAVE_TOTAL_LIMIT_HELP = "Keep only the newest N checkpoints (default: all of them)"
WORD_EMBEDDINGS_HELP = ("Also train the word embeddings (frozen by default: with a 250K vocabulary they dominate a "
                        "CPU step)")
READ_WINDOW_HELP = "Window in tokens (default: the window the model was fine-tuned at, else the model length)"
MAX_ANSWER_HELP = ("Longest answer span in tokens (default: the model's qa_max_answer_tokens: 64 unless fine-tuning "
                   "set it)")
# The default is spelt out here (importing longbird.qa for DEFAULT_SCORING would load torch on `--help`);
# tests/test_qa_cli.py checks that it stays the library's.
SCORING_HELP = ("How spans of different windows are compared: null-relative (default: start logit minus the window's "
                "[CLS] start logit, plus log P(end | start)), log-probability (log P(start) + log P(end | start) "
                "within the window) or logit (raw start logit + log P(end | start))")
FORMAT_HELP = ("korquad2 (HTML pages), korquad1-articles (KorQuAD 1.0 joined per article), korquad1 (its paragraphs) "
               "or squad (SQuAD 1.1 paragraphs)")

# Outputs and models
Out = Annotated[Path, typer.Option(help="Output directory")]
Overwrite = Annotated[bool, typer.Option(help="Replace OUT if longbird wrote it")]
OverwriteRun = Annotated[bool, typer.Option(help="Replace OUTPUT_DIR/model if longbird wrote it")]
Model = Annotated[str | None, typer.Option(help=MODEL_HELP)]
Preset = Annotated[str, typer.Option(help=PRESET_HELP)]
ConvertPreset = Annotated[str, typer.Option(help="Preset when MODEL is converted: " + PRESET_HELP)]
ConvertLength = Annotated[int, typer.Option(help="Model length when MODEL is converted")]
Corpus = Annotated[list[Path], typer.Option("--corpus", help=CORPUS_HELP)]

# Devices and precision
Device = Annotated[str, typer.Option(help=DEVICE_HELP)]
TrainDevice = Annotated[str, typer.Option(help=TRAIN_DEVICE_HELP)]
AutocastBf16 = Annotated[bool, typer.Option(help="bf16 autocast, the encoder's Linear weights stored in bf16 (about 2x "
                                                  "faster on CPUs with AVX-512 bf16)")]
MixedBf16 = Annotated[bool, typer.Option(help="bf16 mixed precision")]
Fp16 = Annotated[bool, typer.Option(help="fp16 mixed precision (CUDA only)")]
Compile = Annotated[bool, typer.Option(help="Compile the encoder with torch.compile (faster calls after the first of "
                                            "each input shape, which compiles; docs/benchmarks.md)")]

# Training (FinetuneSettings fields; `common.training_settings` gathers them)
LearningRate = Annotated[float, typer.Option(help="Peak learning rate (AdamW)")]
Epochs = Annotated[float, typer.Option(help="Passes over the training windows (--max-steps overrides)")]
MaxSteps = Annotated[int, typer.Option(help="Optimiser steps to train")]
MaxStepsOverEpochs = Annotated[int, typer.Option(help="Stop after N optimiser steps (overrides --epochs)")]
BatchSize = Annotated[int, typer.Option(help="Training windows per optimiser step in each process (before gradient "
                                             "accumulation)")]
ReadBatchSize = Annotated[int, typer.Option(help="Windows per model pass")]
Seed = Annotated[int, typer.Option(help="Random seed of new weights, data order, dropout and sampling: the same seed "
                                        "repeats the run")]
PaddingInsertion = Annotated[bool, typer.Option(help="Padding Insertion on training batches (LittleBird 3.4)")]
TrainWordEmbeddings = Annotated[bool, typer.Option(help=WORD_EMBEDDINGS_HELP)]
GroupByLength = Annotated[bool, typer.Option(help="Batch windows of similar length together (less padding; Trainer's "
                                                  "group_by_length sampling)")]
SaveSteps = Annotated[int, typer.Option(help=SAVE_STEPS_HELP)]
SaveTotalLimit = Annotated[int | None, typer.Option(help=SAVE_TOTAL_LIMIT_HELP)]
Resume = Annotated[bool, typer.Option(help=RESUME_HELP)]
FinetuneLoggingSteps = Annotated[int, typer.Option(
    help="Log the training loss every N steps (kept in longbird_finetune.json)")]
Peft = Annotated[str | None, typer.Option(help=PEFT_HELP)]
TaskPeft = Annotated[str | None, typer.Option(help=TASK_PEFT_HELP)]
SlopeLearningRate = Annotated[float | None, typer.Option(help=SLOPE_LR_HELP)]
TapeLearningRate = Annotated[float | None, typer.Option(help=TAPE_LR_HELP)]
GradientAccumulationSteps = Annotated[int, typer.Option(help="Batches summed per optimiser update")]
GradientCheckpointing = Annotated[bool, typer.Option(help="Recompute layers in backward")]

# Reading QA windows
MaxWindows = Annotated[int | None, typer.Option(min=1, help="Use only the first N windows (1 = truncation)")]
Split = Annotated[str | None, typer.Option(help="train or dev: one side of the fixed by-article split")]
MaxAnswerTokens = Annotated[int | None, typer.Option(min=1, help=MAX_ANSWER_HELP)]
# A default-style option, not an alias: tests/test_qa_cli.py reads its default and help from the signature.
SCORING = typer.Option("null-relative", help=SCORING_HELP)
# The lexical prior (longbird.lexical_prior), its defaults spelt out for the same reason; the same test checks them.
LexicalWeight = Annotated[float, typer.Option(min=0.0, help="Weight of the lexical prior: this times BM25 of the "
                                                            "question against the tokens around a span is added to "
                                                            "its score (0 turns it off)")]
LexicalRadius = Annotated[int, typer.Option(min=1, help="Tokens on either side of a span's start that the lexical "
                                                        "prior matches against the question")]
LEXICAL_WEIGHT, LEXICAL_RADIUS = 0.3, 64
TextField = Annotated[str, typer.Option(help="The text field of the classification records (JSON Lines, JSON, CSV or "
                                             "TSV)")]
LabelField = Annotated[str, typer.Option(help="The label field of the classification records: one class per "
                                              "document, text or a whole number")]
