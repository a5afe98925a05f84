"""A saved longbird model in another format: a plain `transformers` BigBird checkpoint (`hf-bigbird`, how
KoBigBird-large was released; the kobigbird and full presets) or an ONNX graph (`onnx`, every preset and head)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import BigBirdConfig, BigBirdForMaskedLM, BigBirdModel

from .checkpoints import is_tape_peft, load_task_model, saved_model_class, tokenizer_beside
from .config import LongBirdConfig
from .files import check_not_read, check_writable, write_directory_atomically
from .heads import LongBirdForMaskedLM
from .modeling import LongBirdModel, LongBirdPreTrainedModel
from .quiet import silenced
from .sources import resolve_model_directory, saved_config

EXPORT_FORMATS = ("hf-bigbird", "onnx")
logger = logging.getLogger("longbird.export")
# Neither format has an input that names each row's document: an exported linked reader would read its windows apart.
LINKED_EXPORT = ("this model has linked windows (linked_windows=true), whose rows read the other windows of their "
                 "document; an exported graph reads every row apart and would compute another function. Serve the "
                 "longbird directory, or reconvert with --set linked_windows=false --set qa_ranking_weight=0 "
                 "--set qa_selector_weight=0 to export the unlinked reader")


# what save_pretrained writes the weights as (whole, or sharded with an index)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def to_bigbird_config(config: LongBirdConfig) -> BigBirdConfig:
    if config.position != "absolute" or config.attention not in ("bigbird", "full"):
        # transformers' BigBirdModel has absolute positions and BigBird/full attention only: a LittleBird (BiALiBi,
        # sliding window, pack) or TAPE model has no counterpart there, but the traced graph formats carry it as is.
        raise ValueError(f"hf-bigbird export needs absolute positions and bigbird or full attention (the kobigbird and "
                         f"full presets); this model has {config.position} positions and {config.attention} "
                         f"attention. Use the model as a longbird directory (Auto classes), or "
                         "export its graph: `longbird export --format onnx`, torch.export or torch.onnx.export "
                         "(docs/export.md)")
    if config.linked_windows:
        raise ValueError(LINKED_EXPORT)
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
           overwrite: bool = False, quiet: bool = False) -> Path:
    """Load a saved longbird model from `model_dir` and write a `format` checkpoint (plus tokenizer) to `out`."""
    if format not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {format!r}; choose one of {EXPORT_FORMATS}")
    check_not_read(out, (model_dir,))
    check_writable(out, overwrite)  # before the model is loaded and traced, not after
    if format == "onnx":
        return export_onnx(model_dir, out, overwrite=overwrite, quiet=quiet)
    model_dir = resolve_model_directory(model_dir)  # a missing directory named as such, not as a Hub repo id
    if is_tape_peft(model_dir):
        raise ValueError(f"{model_dir} holds a TAPE fine-tuning (position states over a base): transformers' BigBird "
                         "has no counterpart for TAPE; export its graph with --format onnx, which takes it")
    saved = saved_config(model_dir)
    if saved.get("model_type") == "big_bird":
        raise ValueError(f"{model_dir} is a transformers BigBird model already (model_type 'big_bird'): use it as "
                         "it is (BigBirdModel.from_pretrained)")
    if saved.get("model_type") != "longbird":
        raise ValueError(f"{model_dir} is not a longbird model (model_type {saved.get('model_type')!r}); convert it "
                         "first (`longbird convert`)")
    if not any((model_dir / name).is_file() for name in WEIGHT_FILES):
        raise FileNotFoundError(f"{model_dir} has a config.json but no weights (none of {', '.join(WEIGHT_FILES)}); "
                                "give the whole directory save_pretrained or `longbird convert` wrote")
    config = LongBirdConfig.from_pretrained(model_dir)
    model_class = LongBirdForMaskedLM if config.has_lm_head else LongBirdModel
    exported = to_bigbird(model_class.from_pretrained(model_dir))
    head = (config.architectures or ["LongBirdModel"])[0]
    if head not in ("LongBirdModel", "LongBirdForMaskedLM"):
        # transformers' BigBird heads differ from longbird's (its QA head has an extra layer and no conditional end)
        logger.warning("this model's head (%s) has no counterpart among transformers' BigBird classes: the "
                       "hf-bigbird export holds the encoder only (BigBirdModel), to fine-tune further; for the head, "
                       "read the longbird directory itself (Auto classes, `answer`, `serve`) or export it with "
                       "--format onnx", head)
    if config.attention == "bigbird" and config.random_blocks != "transformers":
        logger.warning(
            "this model uses random_blocks=%r: the exported BigBirdModel computes the same up to %d tokens but differs "
            "above (transformers uses block 0 as every random block and full attention up to (5 + 2r)·b = %d tokens); "
            "convert with random_blocks='transformers' (--set random_blocks=transformers) for an export that "
            "computes what longbird computes",
            config.random_blocks, config.full_attention_threshold,
            (5 + 2 * config.num_random_blocks) * config.block_size)
    tokenizer = tokenizer_beside(Path(model_dir))
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


ONNX_RECORD = "longbird_onnx.json"
ONNX_INPUTS = ("input_ids", "attention_mask")


@dataclass(frozen=True)
class OnnxLengths:
    """The sequence lengths one exported graph takes: multiples of `multiple` from `shortest` to `longest`. A shorter
    input, or one between two multiples, is right-padded with attention_mask 0 (padding is read as padding, each row
    as itself: docs/export.md). What `attention/tracing.py: check_dynamic_length` lets one graph serve."""

    shortest: int
    longest: int
    multiple: int

    def dynamic_shapes(self) -> dict:
        """torch.export's `dynamic_shapes` for ONNX_INPUTS: any batch size, these lengths."""
        from torch.export import Dim

        if self.multiple == 1:
            seq = Dim("seq", min=self.shortest, max=self.longest)
        else:
            seq = self.multiple * Dim("blocks", min=self.shortest // self.multiple, max=self.longest // self.multiple)
        batch = Dim("batch", max=1024)
        return {name: {0: batch, 1: seq} for name in ONNX_INPUTS}


def onnx_lengths(config: LongBirdConfig) -> OnnxLengths:
    """littlebird: block multiples; kobigbird: block multiples above its full-attention threshold, where each row's
    plan is made in the graph and shorter rows are read with full attention as alone (a graph cannot hold both
    sides of the threshold); full attention (full, tape, kobigbird no longer than its threshold): any length."""
    longest, block = config.max_position_embeddings, config.block_size
    if config.attention == "littlebird":
        return OnnxLengths(2 * block, longest // block * block, block)
    if config.attention == "bigbird" and longest > config.full_attention_threshold:
        return OnnxLengths((config.full_attention_threshold // block + 1) * block, longest // block * block, block)
    return OnnxLengths(2, longest, 1)  # torch.export specialises sizes 0 and 1


def export_onnx(model_dir: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False,
                quiet: bool = False) -> Path:
    """Write `out/model.onnx` (torch.onnx.export's dynamo exporter) of the saved model with its head, with a dynamic
    batch and sequence length (`onnx_lengths`), its tokenizer and config, and `longbird_onnx.json`: inputs, outputs,
    the lengths the graph takes and ONNX Runtime's difference from PyTorch on two check batches. `quiet`: without the
    exporter's step messages and warnings (the command line's default; `quiet.silenced`)."""
    try:
        import onnxscript  # noqa: F401  (torch.onnx's exporter needs it)
    except ImportError as error:
        raise ImportError('ONNX export needs onnxscript (and onnxruntime to check the graph): pip install '
                          '"longbird[onnx]"') from error
    path = resolve_model_directory(model_dir)
    config = saved_config(path)
    peft = is_tape_peft(path)
    if config.get("model_type") != "longbird" and not peft:
        raise ValueError(f"{path} is not a longbird model (model_type {config.get('model_type')!r}); convert it "
                         "first (`longbird convert`)")
    if config.get("linked_windows"):
        raise ValueError(LINKED_EXPORT)
    model_class = saved_model_class(config)
    # a PEFT directory holds what TAPE trained and where its base is (load_task_model rebuilds it)
    model = load_task_model(path, model_class)[0] if peft else model_class.from_pretrained(path)
    model = model.float().eval()
    if type(model).__name__ == "LongBirdForSpanSelection":  # pretrain's RSS head reads [QUESTION] positions too
        logger.warning("%s holds a pretraining head (Recurring Span Selection), which reads the [QUESTION] tokens' "
                       "positions as a third input: the encoder alone is exported (last_hidden_state), the model "
                       "that fine-tuning starts from", path)
        model = model.longbird
    tokenizer = tokenizer_beside(path)
    lengths = onnx_lengths(model.config)
    example = _example_batch(model.config, lengths)
    checks = [example, _example_batch(model.config, lengths, length=_long_check_length(lengths))]
    with torch.no_grad():
        expected = [model(**example, return_dict=True)]
    outputs = [name for name, value in expected[0].items() if isinstance(value, torch.Tensor)]

    def write(directory: Path) -> None:
        graph = directory / "model.onnx"
        with silenced(("torch.onnx", "torch._dynamo", "torch.export", "onnxscript"), warnings_too=True) if quiet \
                else contextlib.nullcontext():
            torch.onnx.export(model, tuple(example[name] for name in ONNX_INPUTS), graph, dynamo=True,
                              input_names=list(ONNX_INPUTS), output_names=outputs,
                              dynamic_shapes=lengths.dynamic_shapes(), verbose=not quiet)
        record = {"model": str(path), "architecture": type(model).__name__, "inputs": list(ONNX_INPUTS),
                  "outputs": outputs, "lengths": asdict(lengths), "torch": torch.__version__,
                  "check": _onnxruntime_check(graph, model, checks, expected, outputs)}
        model.config.save_pretrained(directory)
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)
        (directory / ONNX_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")

    return write_directory_atomically(out, write, overwrite=overwrite)


def _example_batch(config: LongBirdConfig, lengths: OnnxLengths, length: int | None = None) -> dict:
    """Two rows of `length` tokens (default: the shortest length past the first multiple, sparse for kobigbird), the
    second one padded from half its length."""
    length = length or min(lengths.longest, lengths.shortest + lengths.multiple)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, config.vocab_size, (2, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, length // 2:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


ONNX_TOLERANCE = 1e-4  # relative to an output's largest magnitude: fp32 sums in another order are ~1e-6 off


def _long_check_length(lengths: OnnxLengths) -> int:
    """The second check batch's length: the longest the graph takes, at most 2,048 tokens (dense presets at 8K+ would
    need gigabytes of scores), a multiple of `lengths.multiple`. A graph whose sizes a guard fixed at the example's
    passes the example and refuses longer inputs (LittleBird's head chunks did, above 1,088 tokens a batch)."""
    longest = min(lengths.longest, max(2048, lengths.shortest + lengths.multiple))
    return longest // lengths.multiple * lengths.multiple


def _onnxruntime_check(graph: Path, model, batches: list[dict], expected: list, outputs: list[str]) -> list[dict]:
    """ONNX Runtime's largest difference from PyTorch per output on each batch (PyTorch's outputs of the first are
    `expected`; the others are computed here); a graph that refuses a batch or computes something else is refused, so
    nothing is written. Without onnxruntime: one record {"onnxruntime": None}."""
    try:
        import onnxruntime
    except ImportError:
        return [{"onnxruntime": None}]
    session = onnxruntime.InferenceSession(str(graph))
    records = []
    for index, batch in enumerate(batches):
        if index >= len(expected):
            with torch.no_grad():
                expected.append(model(**batch, return_dict=True))
        shape = list(batch["input_ids"].shape)
        try:
            got = session.run(outputs, {name: batch[name].numpy() for name in ONNX_INPUTS})
        except Exception as error:  # onnxruntime's own errors are not Python's
            raise RuntimeError(f"the exported graph refuses a batch of shape {shape} that it should take "
                               f"({' '.join(str(error).split())[:300]}): nothing was written. Please report it with "
                               f"torch {torch.__version__} and onnxruntime {onnxruntime.__version__}") from error
        differences = {}
        for name, value in zip(outputs, got):
            reference = expected[index][name].numpy()
            differences[name] = float(abs(value - reference).max())
            scale = float(abs(reference[abs(reference) < 1e30]).max(initial=0.0))  # not the masked logits' fill
            if differences[name] > ONNX_TOLERANCE * max(1.0, scale):
                raise RuntimeError(f"the exported graph's {name} differs from PyTorch's by {differences[name]:.3g} "
                                   f"on a batch of shape {shape} (largest value {scale:.3g}): nothing was written. "
                                   f"Please report it with torch {torch.__version__} and onnxruntime "
                                   f"{onnxruntime.__version__}")
        records.append({"onnxruntime": onnxruntime.__version__, "batch": shape, "max_abs_difference": differences})
    return records
