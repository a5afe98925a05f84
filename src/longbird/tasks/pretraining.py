"""Long-input pretraining as tasks: distillation from the short source (LittleBird §3.4 step 2), continued training
on long inputs with Recurring Span Selection (§3.4 step 3, §4.1), and RSS accuracy on held-out windows."""

from __future__ import annotations

import dataclasses
import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer, set_seed

from ..checkpoints import has_lm_head, load_task_model
from ..conversion import convert
from ..modeling import enable_checkpointing
from ..runs import check_output, corpus_record, training_record, write_trained_model
from ..sources import resolve_model_directory
from ..training.finetune import FinetuneSettings, train
from ..training.processes import world_size

logger = logging.getLogger(__name__)


def distill(teacher_source, output_dir: str | Path, *, student_path=None, preset: str = "littlebird",
            max_length: int = 4096, corpus=None, length: int | None = None, settings: FinetuneSettings | None = None,
            alpha: float = 1.0, beta: float = 1.0, temperature: float = 1.0, save_steps: int = 50,
            resume: bool = False, gradient_checkpointing: bool = False, overwrite: bool = False, rss: bool = False,
            **overrides: Any) -> dict:
    """Distil the short `teacher_source` into a long student (LittleBird §3.4, step 2) on short corpus windows.

    The student is `student_path` (a longbird directory) or the teacher converted with `preset`, `max_length` and
    config `overrides` (e.g. pack_size=0). With `rss` the student learns Recurring Span Selection at the same time
    (the paper's pretraining objective; loss = RSS + β·attention KL) and is saved as a span-selection model that
    `longbird pretrain` continues. Writes `output_dir`/model (student + tokenizer, atomically) and
    `output_dir`/model/longbird_distill.json; Trainer checkpoints go to `output_dir`/checkpoints, from which `resume`
    continues."""
    from ..data.corpus import corpus_split, corpus_windows, text_hash
    from ..heads import LongBirdForSpanSelection
    from ..training.distill import load_teacher, run_distillation
    from ..training.rss import QUESTION_TOKEN, RSSCollator, add_question_token, rss_examples

    # distillation's own checkpoint settings (its default differs from fine-tuning's), recorded as the run's
    settings = dataclasses.replace(settings or FinetuneSettings(), save_steps=save_steps, resume=resume)
    output_dir = Path(output_dir)
    model_dir = output_dir / "model"
    check_output(model_dir, overwrite, reads=(teacher_source, student_path))
    teacher_dir = resolve_model_directory(teacher_source)
    teacher = load_teacher(teacher_dir)
    set_seed(settings.seed)
    if rss:
        student, tokenizer = load_task_model(student_path or teacher_dir, LongBirdForSpanSelection, preset,
                                             max_length, **overrides)
    else:
        tokenizer = AutoTokenizer.from_pretrained(student_path or teacher_dir, local_files_only=True)
        student = (AutoModelForMaskedLM.from_pretrained(student_path) if student_path and has_lm_head(student_path)
                   else AutoModel.from_pretrained(student_path) if student_path
                   else convert(teacher, preset=preset, max_length=max_length, **overrides))
    source_length = student.config.source_max_positions
    length = length or source_length
    if length > source_length:
        raise ValueError(f"--length {length} is above the teacher's {source_length} tokens: distillation reads short "
                         f"inputs the teacher sees whole; use at most {source_length}")
    documents, held_out = corpus_split(corpus)  # the documents pretrain scores RSS on are not distilled on either
    collator, teacher_ids = None, None
    if rss:
        new = QUESTION_TOKEN not in tokenizer.get_vocab()
        question_id = add_question_token(tokenizer, student)
        stand_in = tokenizer.mask_token_id if tokenizer.mask_token_id is not None else tokenizer.unk_token_id
        if new:  # [QUESTION] starts as what the teacher reads in its place (a trained row is kept)
            with torch.no_grad():
                student.get_input_embeddings().weight[question_id] = student.get_input_embeddings().weight[stand_in]
        windows = rss_examples(documents, tokenizer, length, settings.seed)
        collator, teacher_ids = RSSCollator(tokenizer.pad_token_id or 0), {question_id: stand_in}
    else:
        windows = corpus_windows(documents, tokenizer, length)
    tokenizer.model_max_length = student.config.max_position_embeddings
    # soft targets compare the two MLM heads' word distributions (training/distill.py): without both, only attention
    without_head = [name for name, model in (("teacher", teacher), ("student", student))
                    if model.get_output_embeddings() is None]
    soft_targets = not rss and alpha > 0 and not without_head
    changed = [f"--{name} {value:g}" for name, value in (("alpha", alpha), ("temperature", temperature))
               if value != 1.0]
    if not rss and without_head and changed:  # the defaults say nothing: only what the user chose is warned about
        warnings.warn(f"{' and '.join(changed)} {'change' if len(changed) > 1 else 'changes'} nothing here: soft "
                      f"targets need an MLM head on teacher and student, and the {' and the '.join(without_head)} "
                      f"{'have' if len(without_head) > 1 else 'has'} none; the student learns the attention maps "
                      "alone (--beta)", stacklevel=2)
    objective = ("rss + attention" if rss else "attention + soft targets" if soft_targets else
                 "attention only (--alpha 0)" if not without_head else
                 f"attention only (no MLM head on the {' and the '.join(without_head)})")
    metrics = run_distillation(student.train(), teacher, tokenizer, windows, output_dir, settings, alpha, beta,
                               temperature, gradient_checkpointing, collator, teacher_ids,
                               run_settings={"length": length})
    summary = {"teacher": str(teacher_source), "teacher_directory": str(teacher_dir),
               "student": str(student_path) if student_path else f"{preset}-{max_length}",
               "overrides": overrides, "objective": objective,
               "corpus": corpus_record(corpus), "training_document_sha256": [text_hash(d) for d in documents],
               "held_out_documents": len(held_out), "windows": len(windows), "length": length, "alpha": alpha,
               "beta": beta, "temperature": temperature, "settings": vars(settings), "processes": world_size(),
               **training_record(metrics)}

    write_trained_model(model_dir, student, tokenizer, "longbird_distill.json", summary, overwrite, settings,
                         (student_path or teacher_source, preset, max_length))
    return {**metrics, "windows": len(windows), "model_dir": str(model_dir)}

def rss_accuracy(model, items: list[dict], batch_size: int = 4) -> float:
    """Exact match (%) of the selected span (start, then end given it) over every `[QUESTION]` of `items`."""
    from ..training.rss import IGNORE_INDEX, RSSCollator

    collate = RSSCollator(model.config.pad_token_id or 0)
    model.eval()
    hits = total = 0
    with torch.no_grad():
        for first in range(0, len(items), batch_size):
            batch = collate(items[first:first + batch_size])
            out = model(input_ids=batch["input_ids"].to(model.device),
                        attention_mask=batch["attention_mask"].to(model.device),
                        question_positions=batch["question_positions"].to(model.device))
            real = batch["start_positions"] != IGNORE_INDEX
            hit = ((out.predicted_start.cpu() == batch["start_positions"])
                   & (out.predicted_end.cpu() == batch["end_positions"]))
            hits += int((hit & real).sum())
            total += int(real.sum())
    return 100.0 * hits / max(total, 1)

def pretrain(model_path, output_dir: str | Path, *, corpus=None, length: int = 512, preset: str = "littlebird",
             max_length: int = 4096, settings: FinetuneSettings | None = None, held_out: float = 0.1,
             overwrite: bool = False, gradient_checkpointing: bool = False, **overrides: Any) -> dict:
    """Continued training on long inputs with Recurring Span Selection (LittleBird §3.4 step 3, §4.1).

    `model_path`: a longbird directory (e.g. `longbird distill`'s model) or a source converted with `preset`. Corpus
    documents are split into training and held-out ones (`held_out`; the default corpus has its own held-out articles);
    RSS accuracy on the held-out windows is reported before and after. `overrides` are config fields used when
    `model_path` is converted. Writes `output_dir`/model atomically; checkpoints go to `output_dir`/checkpoints."""
    from ..data.corpus import corpus_split, text_hash
    from ..heads import LongBirdForSpanSelection
    from ..training.rss import RSSCollator, add_question_token, rss_examples

    settings = settings or FinetuneSettings()
    output_dir = Path(output_dir)
    model_dir = output_dir / "model"
    check_output(model_dir, overwrite, reads=(model_path,))
    set_seed(settings.seed)
    model, tokenizer = load_task_model(model_path, LongBirdForSpanSelection, preset, max_length, **overrides)
    if gradient_checkpointing:
        enable_checkpointing(model)
    if length > model.config.max_position_embeddings:
        raise ValueError(f"--length {length} is above the model's {model.config.max_position_embeddings} tokens; "
                         f"give --length {model.config.max_position_embeddings} or less")
    add_question_token(tokenizer, model)
    training, held = corpus_split(corpus, held_out)
    train_items = rss_examples(training, tokenizer, length, settings.seed)
    held_items = rss_examples(held, tokenizer, length, settings.seed) if held else []
    if held_out > 0 and not held_items:
        logger.warning("nothing of the corpus is held out (%d document(s): a corpus of one document is all training), "
                       "so no held-out RSS accuracy is reported; give two or more documents", len(training))
    before = rss_accuracy(model, held_items) if held_items else None
    metrics = train(model.train(), tokenizer, train_items, output_dir / ".work", settings,
                    checkpoint_dir=output_dir / "checkpoints",
                    collator=RSSCollator(tokenizer.pad_token_id or 0), run_settings={"length": length})
    after = rss_accuracy(model, held_items) if held_items else None
    summary = {"model": str(model_path), "corpus": corpus_record(corpus), "length": length,
               "training_document_sha256": [text_hash(d) for d in training],
               "held_out_document_sha256": [text_hash(d) for d in held],
               "train_windows": len(train_items), "held_out_windows": len(held_items),
               "held_out_rss_accuracy_before": before, "held_out_rss_accuracy_after": after,
               "settings": vars(settings), "processes": world_size(), **training_record(metrics)}
    tokenizer.model_max_length = model.config.max_position_embeddings

    write_trained_model(model_dir, model, tokenizer, "longbird_pretrain.json", summary, overwrite, settings,
                         (model_path, preset, max_length))
    return {**{k: v for k, v in metrics.items() if k != "log_history"}, "train_windows": len(train_items),
            "held_out_windows": len(held_items), "rss_accuracy_before": before, "rss_accuracy_after": after,
            "model_dir": str(model_dir)}
