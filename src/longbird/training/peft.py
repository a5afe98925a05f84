"""TAPE as parameter-efficient fine-tuning (TAPE §4; issue 13 item 4): train only the position-state maps.

`tape_peft(model)` freezes every parameter except the TAPE ones (names with `tape_`: the attention side's W_post
and the feed-forward side's W_x, W1, W2, so both updates train — the official PEFT script leaves the attention side
frozen through a name mismatch), optionally the LayerNorms, and the task head (QA, classification, span selection,
MLM transform) — never a parameter the head shares with the base model, such as tied word embeddings.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
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
        raise ValueError(f"--peft tape needs a model with TAPE position states (position='tape'); this model has "
                         f"position={position!r}: convert with --preset tape")
    return trainable


PEFT_RECORD = "longbird_peft.json"
PEFT_WEIGHTS = "tape_peft.safetensors"


def base_record(model_path, preset: str, max_length: int) -> dict:
    """How to rebuild the frozen base: a named embedded source by name (found again on any machine), a directory by
    its absolute path; with the conversion that turned it into the model (used when it is not a longbird model)."""
    from ..sources import NAMED_SOURCES

    name = "minilm" if model_path is None else str(model_path)
    model = name if name in NAMED_SOURCES else str(Path(name).resolve())
    return {"model": model, "preset": preset, "max_length": max_length}


def conversion_settings(config) -> dict:
    """The model's values of every LongBirdConfig field of longbird's own (attention, position, TAPER, blocks, TAPE,
    sizes, heads; not the generic PreTrainedConfig ones such as labels) but `vocab_size`, which adding tokens grows
    after conversion: given to `convert` (or to `from_pretrained` of a longbird base) as overrides they rebuild the
    base the model was trained on, with every override (`--set`, `**overrides`) its conversion had."""
    from transformers import PreTrainedConfig

    from ..config import LongBirdConfig

    generic = {field.name for field in dataclasses.fields(PreTrainedConfig)}
    return {field.name: getattr(config, field.name) for field in dataclasses.fields(LongBirdConfig)
            if field.name not in generic and field.name != "vocab_size"}


def save_tape_peft(model: nn.Module, directory: str | Path, base: dict) -> None:
    """Write only what PEFT trained (every parameter with requires_grad) and the word-embedding rows from the first
    token added to the base's vocabulary on (tag tokens, [QUESTION]), with the config and a reference to the base
    (`base_record`) that keeps the model's conversion settings (`conversion_settings`)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    trained = {name: parameter.detach().contiguous().cpu() for name, parameter in model.named_parameters()
               if parameter.requires_grad}
    first_added = _first_added_row(base)
    embeddings = model.get_input_embeddings().weight
    if embeddings.shape[0] > first_added:
        trained["added_word_embeddings"] = embeddings[first_added:].detach().contiguous().cpu()
    save_file(trained, str(directory / PEFT_WEIGHTS))
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(directory)
    record = {"peft": "tape", "base": {**base, "conversion": conversion_settings(model.config),
                                       "added_rows_from": first_added}, "trained": sorted(trained)}
    (directory / PEFT_RECORD).write_text(json.dumps(record, indent=2), encoding="utf-8")


def is_tape_peft(directory: str | Path) -> bool:
    return (Path(directory) / PEFT_RECORD).is_file()


def load_tape_peft(directory: str | Path, task_class):
    """The full model of a PEFT directory: its base rebuilt with the conversion settings it was trained with
    (converted again when it is a source model, loaded when it is a longbird one), then the trained parameters and
    added embedding rows put back."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from ..workflows import load_task_model  # the same load-or-convert as the fine-tuning run that made the base

    directory = Path(directory)
    record = json.loads((directory / PEFT_RECORD).read_text(encoding="utf-8"))
    base = record["base"]
    conversion = base.get("conversion")
    if conversion is None:
        conversion = _settings_of_a_record_without_them(directory, base)
    model = task_class(AutoConfig.from_pretrained(directory, local_files_only=True))
    state = load_task_model(base["model"], task_class, base["preset"], base["max_length"],
                            **conversion)[0].longbird.state_dict()
    word = "embeddings.word_embeddings.weight"
    table = model.longbird.state_dict()[word].clone()
    if table.shape[0] < state[word].shape[0]:  # written when adding tokens cut the table to the tokenizer's length
        raise ValueError(f"{directory}: its word embeddings have {table.shape[0]} rows, fewer than the "
                         f"{state[word].shape[0]} of its base {base['model']}: a PEFT checkpoint of a longbird before "
                         "2026-11-23 on a base with rows past its tokenizer (multilingual-e5-small); fine-tune again")
    first_added = base.get("added_rows_from", base.get("vocab_size"))  # "vocab_size": records before 2026-11-23
    if first_added is None:
        raise ValueError(f"{directory}/{PEFT_RECORD}: its base has neither 'added_rows_from' nor 'vocab_size'; "
                         "the record is damaged: fine-tune again")
    table[: state[word].shape[0]] = state[word]
    state[word] = table
    missing, unexpected = model.longbird.load_state_dict(state, strict=False)
    saved = load_file(str(directory / PEFT_WEIGHTS))
    added = saved.pop("added_word_embeddings", None)
    with torch.no_grad():
        if added is not None:
            model.get_input_embeddings().weight[first_added:] = added
        for name, parameter in model.named_parameters():
            if name in saved:
                parameter.copy_(saved.pop(name))
    not_restored = {f"longbird.{name}" for name in missing} - set(record["trained"])
    if unexpected or saved or not_restored:
        raise ValueError(f"{directory}: the PEFT checkpoint does not fit its base {base['model']} (not restored: "
                         f"{sorted(not_restored)[:5]}, unexpected: {sorted(unexpected)[:5]}, unused: {sorted(saved)[:5]})")
    return model.eval()


def _settings_of_a_record_without_them(directory: Path, base: dict) -> dict:
    """Records written before 2026-11-24 keep only the preset and length of the base's conversion, not its config
    overrides (taper_schedule, block_size, ...): a longbird base is loaded as it was saved (overrides there change
    its config, which the PEFT directory keeps, not its saved weights); a converted one may not be rebuilt as it was
    trained and is refused."""
    from transformers import AutoConfig

    from ..sources import resolve_model_directory

    path = resolve_model_directory(base["model"])
    if AutoConfig.from_pretrained(path, local_files_only=True).model_type == "longbird":
        return {}
    raise ValueError(
        f"{directory}/{PEFT_RECORD} was written by an older longbird that kept only the preset "
        f"({base.get('preset')!r}) and max_length ({base.get('max_length')}) of its base's conversion, not the config "
        f"overrides {base['model']} was converted with (taper_schedule, block_size, ...: --set or **overrides), so "
        "the base rebuilt from it may differ from the one trained (e.g. position rows past the source length extended "
        "by another schedule). Re-run the --peft tape training with this longbird, whose record keeps them "
        "(base.conversion); or, if the base was converted with no overrides, add \"conversion\": {} to the record's "
        "\"base\"")


def _first_added_row(base: dict) -> int:
    """The first embedding row a fine-tuning run may have filled with a token of its own: the base's tokenizer length,
    or its table's size where that is smaller (rows past the tokenizer, such as multilingual-e5-small's 35 spare
    ones, are where added tokens land)."""
    from transformers import AutoConfig, AutoTokenizer

    from ..sources import resolve_model_directory

    directory = resolve_model_directory(base["model"])
    rows = AutoConfig.from_pretrained(directory, local_files_only=True).vocab_size
    # Fine-tuning always reads the base's tokenizer (load_task_model), so it is there.
    return min(rows, len(AutoTokenizer.from_pretrained(directory, local_files_only=True)))
