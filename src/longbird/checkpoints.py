"""What a model directory is, and how a command gets a model from one: load-or-convert, the trained-head check,
the tokenizer check, and the PEFT directory format (only what `--peft tape` trained, plus how to rebuild its base).

A model argument is either a saved longbird directory (a task head is added if it has none), a PEFT directory, or a
plain Hugging Face encoder directory or named embedded source, which is converted first with `preset` and
`max_length`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoTokenizer

from .config import LongBirdConfig
from .conversion import convert
from .files import check_not_read, check_writable, write_directory_atomically
from .precision import store_encoder_linears_in
from .sources import resolve_model_directory, saved_config
from .training.processes import is_main_process


def convert_to_directory(source, out: str | Path, *, preset: str = "kobigbird", max_length: int = 4096,
                         overwrite: bool = False, **overrides: Any) -> tuple[Any, bool]:
    """Convert `source` (default: the embedded MiniLM) and save model + source tokenizer to `out` atomically.
    Returns (model, whether a tokenizer was found beside the source). A longbird directory (a fine-tuned reader too)
    is reconverted instead (`reconvert_directory`)."""
    source = resolve_model_directory(source)  # a missing, damaged or foreign directory named before anything runs
    check_not_read(out, (source,))  # converting a directory onto itself would delete the source
    check_writable(out, overwrite)  # before the conversion, not after it
    if saved_config(source).get("model_type") == "longbird":
        return reconvert_directory(source, out, preset=preset, max_length=max_length, overwrite=overwrite,
                                   **overrides), True
    model = convert(source, preset=preset, max_length=max_length, **overrides)
    tokenizer = tokenizer_beside(source)

    if tokenizer is not None:
        tokenizer.model_max_length = max_length  # else `truncation=True` would cut to the source's 512

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)

    if is_main_process():  # under torchrun every process trains, the first one writes
        write_directory_atomically(out, write, overwrite=overwrite)
    return model, tokenizer is not None

def saved_model_class(config: dict):
    """The longbird class a saved directory holds (its config's first `architectures` entry; the encoder alone when
    none is recorded): its head with the weights it was saved with."""
    from . import heads
    from .modeling import LongBirdModel

    architecture = (config.get("architectures") or ["LongBirdModel"])[0]
    return getattr(heads, architecture, LongBirdModel)


def reconvert_directory(model_dir, out: str | Path, *, preset: str = "kobigbird", max_length: int = 4096,
                        overwrite: bool = False, **overrides: Any):
    """A saved kobigbird/full longbird model (any head) with another sparse pattern or positions beyond its source
    length (`conversion.reconvert`), saved to `out` with its tokenizer and, for a fine-tuned model, its training record
    (the weights are the ones it trained; the record notes the reconversion). `preset` must be the model's own."""
    from .config import PRESETS
    from .conversion import reconvert

    path = resolve_model_directory(model_dir)
    config = saved_config(path)
    own = next((name for name in ("kobigbird", "full") if PRESETS[name]["attention"] == config.get("attention")
                and config.get("position") == "absolute"), None)
    if preset != own:
        raise ValueError(f"{path} is a longbird model with attention {config.get('attention')!r} and position "
                         f"{config.get('position')!r}: it can be reconverted only within its own preset "
                         f"({own or 'none: only kobigbird and full models'}), not to {preset!r}; convert its short "
                         "source with the new preset instead")
    model = reconvert(saved_model_class(config).from_pretrained(path), max_position_embeddings=max_length,
                      **overrides)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.model_max_length = max_length
    records = {name: json.loads((path / name).read_text(encoding="utf-8"))
               for name in ("longbird_finetune.json",) if (path / name).is_file()}

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        for name, record in records.items():
            record["reconverted"] = {"from": str(path), "max_length": max_length, **overrides}
            (directory / name).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    if is_main_process():
        write_directory_atomically(out, write, overwrite=overwrite)
    return model


TASK_COMMANDS = {"LongBirdForQuestionAnswering": ("question-answering", "finetune-qa"),
                 "LongBirdForSequenceClassification": ("classification", "finetune-cls")}

def require_trained_head(model_path, task_class) -> None:
    """Inference needs a head that was trained and saved: loading a base model (or another task's model) into a task
    class would give a randomly initialised head that answers without a word."""
    path = resolve_model_directory(model_path)
    config = saved_config(path)
    task, command = TASK_COMMANDS[task_class.__name__]
    saved = config.get("architectures") or ["(none)"]
    if config.get("model_type") != "longbird" or task_class.__name__ not in saved:
        raise ValueError(f"{path} has no trained {task} head (saved architecture: {', '.join(saved)}); fine-tune it "
                         f"with `longbird {command}` first, or give a directory that `{command}` wrote")

def load_on_device(model_path, task_class, device: str | None = None, compile: bool = False, bf16: bool = False,
                   require_head: bool = True):
    """(model, tokenizer) for inference with a trained head (`require_head`; else any longbird model of `task_class`),
    the model moved to `device` (None: the CPU); `compile`: the encoder compiled in place (compilation.py); `bf16`: for
    use under bf16 autocast only, the encoder's Linear weights stored in bf16 (`precision.store_encoder_linears_in`:
    the same arithmetic without autocast's casts)."""
    if require_head:
        require_trained_head(model_path, task_class)
    model, tokenizer = load_task_model(model_path, task_class)
    model = model.to(device) if device else model
    if bf16:
        store_encoder_linears_in(model)
    if compile:
        from .compilation import compile_encoder

        compile_encoder(model)
    return model, tokenizer

def load_task_model(model_path: str | Path | None, task_class, preset: str = "kobigbird", max_length: int = 4096,
                    **overrides: Any):
    """(model, tokenizer) for a task: a longbird directory is loaded, anything else is converted."""
    path = resolve_model_directory(model_path)
    tokenizer = saved_tokenizer(path)
    if is_tape_peft(path):  # a PEFT directory holds what was trained and where its base is
        model = load_tape_peft(path, task_class)
        return model, _fit_tokenizer(tokenizer, model)
    if AutoConfig.from_pretrained(path, local_files_only=True).model_type == "longbird":
        model = task_class.from_pretrained(path, **overrides)
        return model, _fit_tokenizer(tokenizer, model)
    # LongBirdConfig fields go into the conversion (some shape weights, e.g. pack_size); the rest (num_labels, ...)
    # are head settings of the generic config.
    fields = {field.name for field in dataclasses.fields(LongBirdConfig)}
    base = convert(path, preset=preset, max_length=max_length,
                   **{key: value for key, value in overrides.items() if key in fields})
    config = base.config
    for key, value in overrides.items():
        if key not in fields:
            setattr(config, key, value)
    model = task_class(config)
    source = base.longbird if hasattr(base, "longbird") else base
    getattr(model, "longbird", model).load_state_dict(source.state_dict())  # a head's encoder, or the encoder
    return model, _fit_tokenizer(tokenizer, model)

def _fit_tokenizer(tokenizer, model):
    tokenizer.model_max_length = model.config.max_position_embeddings  # windows are cut by our features
    return tokenizer

def check_tokenizer(model, tokenizer) -> None:
    """A tokenizer that emits ids the model has no embedding for is the wrong tokenizer."""
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise ValueError(f"tokenizer/model mismatch: the tokenizer has {len(tokenizer)} tokens but the model's "
                         f"embedding table has {rows} rows; use the tokenizer saved with the model")

def has_lm_head(path) -> bool:
    config = saved_config(resolve_model_directory(path))
    return config.get("lm_head_act") is not None


PEFT_RECORD = "longbird_peft.json"
PEFT_WEIGHTS = "tape_peft.safetensors"


def base_record(model_path, preset: str, max_length: int) -> dict:
    """How to rebuild the frozen base: a named embedded source by name (found again on any machine), a directory by
    its absolute path; with the conversion that turned it into the model (used when it is not a longbird model)."""
    from .sources import NAMED_SOURCES

    name = "minilm" if model_path is None else str(model_path)
    model = name if name in NAMED_SOURCES else str(Path(name).resolve())
    return {"model": model, "preset": preset, "max_length": max_length}


def conversion_settings(config) -> dict:
    """The model's values of every LongBirdConfig field of longbird's own (attention, position, TAPER, blocks, TAPE,
    sizes, heads; not the generic PreTrainedConfig ones such as labels) but `vocab_size`, which adding tokens grows
    after conversion: given to `convert` (or to `from_pretrained` of a longbird base) as overrides they rebuild the
    base the model was trained on, with every override (`--set`, `**overrides`) its conversion had."""
    from transformers import PreTrainedConfig

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

    directory = Path(directory)
    record = json.loads((directory / PEFT_RECORD).read_text(encoding="utf-8"))
    base = record["base"]
    conversion = base.get("conversion")
    if conversion is None:
        conversion = _settings_of_a_record_without_them(directory, base)
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    model = task_class(config)
    encoder = getattr(model, "longbird", model)  # a task head's encoder, or the encoder itself (distill's students)
    rebuilt = load_task_model(base["model"], task_class, base["preset"], base["max_length"], **conversion)[0]
    state = getattr(rebuilt, "longbird", rebuilt).state_dict()
    word = "embeddings.word_embeddings.weight"
    table = encoder.state_dict()[word].clone()
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
    missing, unexpected = encoder.load_state_dict(state, strict=False)
    saved_as = (config.architectures or [task_class.__name__])[0]
    saved = _as_head_names(load_file(str(directory / PEFT_WEIGHTS)), saved_as)
    added = saved.pop("added_word_embeddings", None)
    trained = set(_as_head_names(dict.fromkeys(record["trained"]), saved_as))
    if saved_as != task_class.__name__:
        # another head than the one trained (RSS pretraining's span selection, then QA): the trained encoder parts
        # carry over, that head's own parameters stay behind, as when a full checkpoint is loaded into another head
        heads = {name for name in saved if not name.startswith(ENCODER)}
        saved, trained = ({name: value for name, value in saved.items() if name not in heads}, trained - heads)
    with torch.no_grad():
        if added is not None:
            model.get_input_embeddings().weight[first_added:] = added
        for name, parameter in model.named_parameters():
            key = name if encoder is not model else ENCODER + name
            if key in saved:
                parameter.copy_(saved.pop(key))
    not_restored = {ENCODER + name for name in missing} - trained
    if unexpected or saved or not_restored:
        raise ValueError(f"{directory}: the PEFT checkpoint does not fit its base {base['model']} (not restored: "
                         f"{sorted(not_restored)[:5]}, unexpected: {sorted(unexpected)[:5]}, "
                         f"unused: {sorted(saved)[:5]})")
    return model.eval()


ENCODER = "longbird."  # the encoder's parameters inside a task head


def _as_head_names(tensors: dict, saved_as: str) -> dict:
    """A PEFT file's names as a task head's: those saved from a bare encoder (`saved_as` "LongBirdModel": distill's
    students) gain the head's `longbird.` prefix; the added rows keep their name."""
    if saved_as != "LongBirdModel":
        return tensors
    return {name if name == "added_word_embeddings" else ENCODER + name: value for name, value in tensors.items()}


def _settings_of_a_record_without_them(directory: Path, base: dict) -> dict:
    """Records written before 2026-11-24 keep only the preset and length of the base's conversion, not its config
    overrides (taper_schedule, block_size, ...): a longbird base is loaded as it was saved (overrides there change
    its config, which the PEFT directory keeps, not its saved weights); a converted one may not be rebuilt as it was
    trained and is refused."""
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
    directory = resolve_model_directory(base["model"])
    rows = AutoConfig.from_pretrained(directory, local_files_only=True).vocab_size
    # Fine-tuning always reads the base's tokenizer (load_task_model), so it is there.
    return min(rows, len(AutoTokenizer.from_pretrained(directory, local_files_only=True)))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "sentencepiece.bpe.model", "spiece.model",
                   "vocab.json")


def tokenizer_beside(path: Path):
    """The tokenizer saved in a directory, or None where it holds no tokenizer files: transformers 5 then builds an
    empty tokenizer of the config's model type (5 special tokens, every word [UNK]) rather than failing, and a
    conversion saved that beside the model."""
    if not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
        return None
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as error:  # files that are there but cannot be read: not "no tokenizer"
        raise ValueError(f"the tokenizer files in {path} cannot be read ({' '.join(str(error).split())[:200]}); "
                         "save the tokenizer there again (tokenizer.save_pretrained)") from error


def saved_tokenizer(path: Path):
    """The tokenizer saved in a model directory; a directory without one (`model.save_pretrained(dir)` alone, a
    Trainer `save_model` without a processing class) is named as such, not as transformers' guess at a missing
    sentencepiece."""
    tokenizer = tokenizer_beside(path)
    if tokenizer is None:
        raise ValueError(f"{path} has a model but no tokenizer: save the source's tokenizer beside it "
                         f"(`tokenizer.save_pretrained('{path}')`), or write the directory with `longbird convert`, "
                         "which copies it")
    return tokenizer


def training_window(model, window_length: int | None) -> int:
    """The window a training run reads: `window_length`, or the model's length; refused before any data is prepared
    when the model cannot read it (it failed at the first step, or trained on short windows and recorded a window no
    later `evaluate` could read)."""
    limit = model.config.max_position_embeddings
    if window_length is None:
        return limit
    if not 1 <= window_length <= limit:
        raise ValueError(f"--window-length {window_length} does not fit the model, which reads at most {limit} tokens: "
                         f"give --window-length {limit} or less, or convert with a --max-length of at least "
                         f"{window_length}")
    return window_length
