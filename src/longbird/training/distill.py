"""Distillation from the short source model (LittleBird §3.4, step 2; following Sun et al. 2020, MobileBERT).

Loss = α · T² · KL(teacher soft targets ‖ student) over real tokens, when both have an MLM head,
     + β · mean over layers of KL(teacher attention ‖ student attention) per real query row and head.
Inputs are short (≤ the teacher's L tokens), so the teacher reads them with full attention.

Comparing the distributions: a LittleBird student's token queries see packed keys and a window of token keys, the
teacher's see every token. Both are restricted to the token keys the student may attend and renormalised there; the
probability mass the student puts on packed keys is reported (`pack_mass`), not penalised. With a student that is
the teacher (preset "full", absolute positions) both sides are the same distribution and the loss is 0.
The student runs its dense reference path (the only one that materialises attention probabilities; exact, and cheap
at ≤ 512 tokens).

Padding Insertion (LittleBird §3.4 uses it in this step too) is a change of the student's position ids only
(`padding_insertion.py`): both read the same tokens, the teacher at its own positions 0..l−1, the student as if the
text were longer, so the maps stay comparable token by token.

With the RSS objective (LittleBird §4.1 pretrains with it in both steps) the student is a span-selection model and its
RSS loss is added; the teacher, whose vocabulary has no `[QUESTION]`, reads its mask token there (`teacher_ids`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention.reference import AttentionRecord, recording_attention
from ..modeling import REFERENCE, enable_checkpointing
from .trainer import LongBirdTrainer


def attention_kl(teacher: tuple[torch.Tensor, ...], student: list[AttentionRecord], key_mask: torch.Tensor):
    """(mean KL over layers, heads and real query rows; mean packed-key mass) of teacher maps (B, H, l, l) against the
    student's records (probabilities over [pack keys | token keys], possibly padded to a block multiple)."""
    if len(teacher) != len(student):
        raise ValueError(f"teacher has {len(teacher)} attention layers, student {len(student)}; distillation needs "
                         "the same depth")
    length = key_mask.shape[1]
    rows = key_mask[:, None, :].float()  # (B, 1, l) real query rows
    losses, pack_mass = [], []
    for target, record in zip(teacher, student):
        s = record.pack_keys
        probs = record.probs[:, :, :length].float()
        allowed = record.allowed[..., :length, s:s + length].expand(*probs.shape[:3], length)
        allowed = allowed & key_mask[:, None, None, :]
        tokens = probs[..., s:s + length] * allowed
        restricted = target.float() * allowed
        restricted = restricted / restricted.sum(-1, keepdim=True).clamp_min(1e-30)
        student_part = tokens / tokens.sum(-1, keepdim=True).clamp_min(1e-30)
        kl = (torch.xlogy(restricted, restricted) - restricted * student_part.clamp_min(1e-30).log()).sum(-1)
        losses.append((kl * rows).sum() / (rows.sum() * kl.shape[1]))
        if s:
            pack_mass.append((probs[..., :s].sum(-1) * rows).sum() / (rows.sum() * probs.shape[1]))
    mass = torch.stack(pack_mass).mean() if pack_mass else torch.zeros(())
    return torch.stack(losses).mean(), mass


def soft_target_kl(teacher_logits, student_logits, key_mask, temperature: float) -> torch.Tensor:
    """T² · KL(softmax(t/T) ‖ softmax(s/T)) averaged over real tokens (Hinton et al. 2015)."""
    teacher_log = F.log_softmax(teacher_logits.float() / temperature, -1)
    student_log = F.log_softmax(student_logits.float() / temperature, -1)
    kl = (teacher_log.exp() * (teacher_log - student_log)).sum(-1)
    real = key_mask.float()
    return temperature ** 2 * (kl * real).sum() / real.sum()


def distillation_loss(teacher, student, batch: dict, alpha: float = 1.0, beta: float = 1.0,
                      temperature: float = 1.0, teacher_ids: dict[int, int] | None = None) -> tuple[torch.Tensor, dict]:
    """The loss of one batch and its parts (attention KL, soft-target KL, pack mass, the student's own task loss such
    as RSS when the batch carries its labels). `teacher_ids` maps student-only token ids to what the teacher reads."""
    key_mask = batch["attention_mask"].bool()
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    teacher_inputs = dict(inputs)
    for student_id, teacher_id in (teacher_ids or {}).items():
        teacher_inputs["input_ids"] = teacher_inputs["input_ids"].masked_fill(inputs["input_ids"] == student_id,
                                                                              teacher_id)
    with torch.no_grad():
        taught = teacher(**teacher_inputs, output_attentions=True, return_dict=True)
    implementation = student.config._attn_implementation
    student.config._attn_implementation = REFERENCE
    try:
        with recording_attention() as records:
            learnt = student(**batch, return_dict=True)
    finally:
        student.config._attn_implementation = implementation
    attention, pack_mass = attention_kl(taught.attentions, records, key_mask)
    loss = beta * attention
    parts = {"attention_kl": attention.detach(), "pack_mass": pack_mass.detach()}
    task_loss = getattr(learnt, "loss", None)
    if task_loss is not None:
        loss = loss + task_loss
        parts["task_loss"] = task_loss.detach()
    teacher_logits, student_logits = getattr(taught, "logits", None), getattr(learnt, "logits", None)
    if alpha and teacher_logits is not None and student_logits is not None:
        soft = soft_target_kl(teacher_logits, student_logits, key_mask, temperature)
        loss = loss + alpha * soft
        parts["soft_target_kl"] = soft.detach()
    return loss, parts


class DistillationTrainer(LongBirdTrainer):
    """Trainer whose loss is `distillation_loss` against a frozen teacher; logs the loss parts."""

    def __init__(self, *args, teacher=None, alpha: float = 1.0, beta: float = 1.0, temperature: float = 1.0,
                 teacher_ids: dict[int, int] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if teacher is None:
            raise ValueError("DistillationTrainer needs a teacher model")
        self.teacher = teacher.eval().requires_grad_(False)
        self.alpha, self.beta, self.temperature, self.teacher_ids = alpha, beta, temperature, teacher_ids
        self._parts: dict[str, list[float]] = {}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.teacher.to(next(model.parameters()).device)
        loss, parts = distillation_loss(self.teacher, model, inputs, self.alpha, self.beta, self.temperature,
                                        self.teacher_ids)
        for name, value in parts.items():
            self._parts.setdefault(name, []).append(float(value))
        return (loss, None) if return_outputs else loss

    def log(self, logs: dict, *args, **kwargs):
        for name, values in self._parts.items():
            if values:
                logs[name] = sum(values) / len(values)
        self._parts = {}
        super().log(logs, *args, **kwargs)


def load_teacher(source):
    """The short source model (with its MLM head when it has one), fp32, eager attention (the maps are needed)."""
    from ..conversion import load_source

    teacher = load_source(source)
    if hasattr(teacher, "set_attn_implementation"):
        teacher.set_attn_implementation("eager")
    else:  # pragma: no cover - older transformers
        teacher.config._attn_implementation = "eager"
    return teacher.eval()


def run_distillation(student, teacher, tokenizer, windows: list[dict], output_dir, settings, alpha: float = 1.0,
                     beta: float = 1.0, temperature: float = 1.0, gradient_checkpointing: bool = False, collator=None,
                     teacher_ids: dict[int, int] | None = None, run_settings: dict | None = None) -> dict:
    """Train `student` on corpus windows against `teacher` (`finetune.train` with DistillationTrainer); checkpoints
    every `settings.save_steps` steps under `output_dir`/checkpoints, from which `settings.resume` continues (with the
    same weights, objective and `run_settings`: `finetune.train`). Returns the training metrics; saving the final
    student is the caller's job."""
    from pathlib import Path

    from .finetune import train

    if gradient_checkpointing:
        enable_checkpointing(student)
    return train(student, tokenizer, windows, Path(output_dir) / ".work", settings,
                 checkpoint_dir=Path(output_dir) / "checkpoints", collator=collator, trainer_class=DistillationTrainer,
                 trainer_kwargs={"teacher": teacher, "alpha": alpha, "beta": beta, "temperature": temperature,
                                 "teacher_ids": teacher_ids},
                 run_settings={"alpha": alpha, "beta": beta, "temperature": temperature, "rss": collator is not None,
                               **(run_settings or {})})
