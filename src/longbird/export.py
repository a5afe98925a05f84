"""BigBird+TAPER longbird model -> plain `transformers` BigBird checkpoint (how KoBigBird-large was released)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from transformers import BigBirdConfig, BigBirdForMaskedLM, BigBirdModel

from .config import LongBirdConfig
from .files import write_directory_atomically
from .heads import LongBirdForMaskedLM
from .modeling import LongBirdModel, LongBirdPreTrainedModel

EXPORT_FORMATS = ("hf-bigbird",)
logger = logging.getLogger("longbird.export")


def to_bigbird_config(config: LongBirdConfig) -> BigBirdConfig:
    if config.position != "absolute" or config.attention not in ("bigbird", "full"):
        # transformers' BigBirdModel has absolute positions and BigBird/full attention only: a LittleBird (BiALiBi,
        # sliding window, pack) or TAPE model has no counterpart there, but the traced graph formats carry it as is.
        raise ValueError(f"hf-bigbird export needs absolute positions and bigbird or full attention (the kobigbird and "
                         f"full presets); this model has position={config.position!r}, "
                         f"attention={config.attention!r}. Use the model as a longbird directory (Auto classes), or "
                         "export its graph with torch.export or torch.onnx.export (docs/export.md, 'torch.export, "
                         "ONNX, torch.compile')")
    if config.embedding_size != config.hidden_size:
        raise ValueError(
            f"hf-bigbird has no embedding projection: embedding_size ({config.embedding_size}) != hidden_size "
            f"({config.hidden_size}) (an ELECTRA-small-style source); export is not possible for this model"
        )
    if config.global_blocks != "itc":
        raise ValueError(f"hf-bigbird has only BigBird ITC's global blocks; this model uses global_blocks="
                         f"{config.global_blocks!r}. Reconvert it with global_blocks='itc' to export (it then computes "
                         f"another function above {config.full_attention_threshold} tokens)")
    if config.local_windows != "sliding":
        raise ValueError(f"hf-bigbird has only BigBird's sliding windows; this model uses local_windows="
                         f"{config.local_windows!r}. Reconvert it with local_windows='sliding' to export (it then "
                         f"computes another function above {config.full_attention_threshold} tokens)")
    return BigBirdConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads, intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act, hidden_dropout_prob=config.hidden_dropout_prob,
        attention_probs_dropout_prob=config.attention_probs_dropout_prob,
        max_position_embeddings=config.max_position_embeddings, type_vocab_size=config.type_vocab_size,
        initializer_range=config.initializer_range, layer_norm_eps=config.layer_norm_eps,
        pad_token_id=config.pad_token_id,
        attention_type="block_sparse" if config.attention == "bigbird" else "original_full",
        block_size=config.block_size, num_random_blocks=config.num_random_blocks, use_bias=True,
        rescale_embeddings=False, tie_word_embeddings=config.tie_word_embeddings,
    )


def to_bigbird(model: LongBirdPreTrainedModel) -> BigBirdModel | BigBirdForMaskedLM:
    """An in-memory transformers BigBird model with the same weights."""
    config = model.config
    bigbird_config = to_bigbird_config(config)
    base = model.longbird if isinstance(model, LongBirdForMaskedLM) else model
    state = {name: tensor for name, tensor in base.state_dict().items() if not name.startswith("pooler.")}
    if base.pooler is not None:
        state["pooler.weight"], state["pooler.bias"] = base.pooler.dense.weight, base.pooler.dense.bias
    else:
        # No source pooler (ELECTRA): identity weights so BigBird's pooler is tanh(h_[CLS]) rather than random.
        state["pooler.weight"] = torch.eye(config.hidden_size, dtype=base.embeddings.word_embeddings.weight.dtype)
        state["pooler.bias"] = torch.zeros(config.hidden_size, dtype=state["pooler.weight"].dtype)
    if isinstance(model, LongBirdForMaskedLM):
        if (config.lm_head_act or config.hidden_act) != config.hidden_act:
            raise ValueError(f"hf-bigbird's MLM head uses hidden_act ({config.hidden_act}); this head uses "
                             f"{config.lm_head_act}, so it cannot be exported faithfully")
        target = BigBirdForMaskedLM(bigbird_config)
        state = {f"bert.{name}": tensor for name, tensor in state.items()}
        head = model.lm_head
        state.update({
            "cls.predictions.transform.dense.weight": head.dense.weight,
            "cls.predictions.transform.dense.bias": head.dense.bias,
            "cls.predictions.transform.LayerNorm.weight": head.LayerNorm.weight,
            "cls.predictions.transform.LayerNorm.bias": head.LayerNorm.bias,
            "cls.predictions.decoder.weight": head.decoder.weight, "cls.predictions.bias": head.bias,
            "cls.predictions.decoder.bias": head.bias,
        })
    else:
        target = BigBirdModel(bigbird_config)
    missing, unexpected = target.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"hf-bigbird export left missing={missing} unexpected={unexpected}")
    return target.eval()


def export(model_dir: str | os.PathLike, out: str | os.PathLike, format: str = "hf-bigbird",
           overwrite: bool = False) -> Path:
    """Load a saved longbird model from `model_dir` and write a `format` checkpoint (plus tokenizer) to `out`."""
    if format not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {format!r}; choose one of {EXPORT_FORMATS}")
    config = LongBirdConfig.from_pretrained(model_dir)
    if config.attention == "bigbird" and config.random_blocks != "transformers":
        logger.warning(
            "this model uses random_blocks=%r: the exported BigBirdModel computes the same up to %d tokens but differs "
            "above (transformers uses block 0 as every random block and full attention up to (5 + 2r)·b = %d tokens); "
            "convert with random_blocks='transformers' for an export that computes what longbird computes",
            config.random_blocks, config.full_attention_threshold,
            (5 + 2 * config.num_random_blocks) * config.block_size)
    model_class = LongBirdForMaskedLM if config.has_lm_head else LongBirdModel
    exported = to_bigbird(model_class.from_pretrained(model_dir))
    tokenizer = _load_tokenizer(Path(model_dir))
    if tokenizer is not None:
        # The tokenizer's special ids, not BigBirdConfig's defaults (sep 66, bos 1, eos 2: BigBird's own vocabulary).
        bos = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
        eos = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
        for name, value in (("sep_token_id", tokenizer.sep_token_id), ("bos_token_id", bos), ("eos_token_id", eos),
                            ("pad_token_id", tokenizer.pad_token_id)):
            if value is not None:
                setattr(exported.config, name, value)
        tokenizer.model_max_length = config.max_position_embeddings  # else truncation=True cuts at the source's 512

    def write(directory: Path) -> None:
        exported.save_pretrained(directory)
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)

    return write_directory_atomically(out, write, overwrite=overwrite)


def _load_tokenizer(source: Path):
    """The tokenizer saved beside the model, or None (a model directory without tokenizer files is valid)."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError, KeyError):
        return None
