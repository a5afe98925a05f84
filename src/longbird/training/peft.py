"""TAPE as parameter-efficient fine-tuning (TAPE §4; issue 13 item 4): train only the position-state maps.

`tape_peft(model)` freezes every parameter except the TAPE ones (names with `tape_`: the attention side's W_post
and the feed-forward side's W_x, W1, W2, so both updates train — the official PEFT script leaves the attention side
frozen through a name mismatch), optionally the LayerNorms, and the task head (QA, classification, span selection,
MLM transform) — never a parameter the head shares with the base model, such as tied word embeddings.
"""

from __future__ import annotations

from torch import nn


def tape_peft(model: nn.Module, layer_norms: bool = False) -> list[str]:
    """Freeze all but the TAPE parameters (+ LayerNorms if `layer_norms`) and the task head; returns the names of
    the parameters left trainable. Raises if the model has no TAPE parameters (position != "tape")."""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, model) if prefix else model  # a bare LongBirdModel is all base
    base_parameters = {id(p) for p in base.parameters()}
    trainable = []
    for name, parameter in model.named_parameters():
        in_base = id(parameter) in base_parameters
        keep = "tape_" in name or (layer_norms and "LayerNorm" in name) or not in_base
        parameter.requires_grad_(keep)
        if keep:
            trainable.append(name)
    if not any("tape_" in name for name in trainable):
        position = getattr(getattr(model, "config", None), "position", None)
        raise ValueError(f"TAPE fine-tuning (tape_peft, --peft tape) needs a model with TAPE position states "
                         f"(position='tape'); this model has position={position!r}: convert with preset='tape' "
                         f"(--preset tape)")
    return trainable
