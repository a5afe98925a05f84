"""longbird: turn a short pretrained encoder into a long-context encoder without pretraining from scratch.

`import longbird` is cheap (the command line answers `--help` without loading torch): the public names below load
their modules on first use (PEP 562), and the Auto classes learn model_type "longbird" as soon as `transformers`
is imported, whichever of the two is imported first (see `registration`).
"""

from __future__ import annotations

import importlib
import importlib.util

from .registration import register_when_transformers_is_loaded

__version__ = "0.1.0"
METHODS = {
    "kobigbird": "BigBird ITC block-sparse attention + TAPER absolute positions (KoBigBird-large)",
    "littlebird": "BiALiBi + unpack & sliding-window attention + pack attention; Padding Insertion (LittleBird)",
    "tape": "contextualised equivariant position states beside any attention; parameter-efficient fine-tuning (TAPE)",
}

# public name -> the module that defines it; loaded on first access
_LAZY = {
    "PRESETS": "config", "LongBirdConfig": "config",
    "LongBirdForMaskedLM": "heads", "LongBirdForQuestionAnswering": "heads",
    "LongBirdForSequenceClassification": "heads", "register_auto_classes": "registration",
    "LongBirdModel": "modeling",
    "SUPPORTED_FAMILIES": "conversion", "convert": "conversion", "reconvert": "conversion",
    "answer": "tasks.qa", "Reader": "reader",
    "tape_peft": "training.peft", "load_tape_peft": "checkpoints", "convert_to_directory": "checkpoints",
}

__all__ = ["METHODS", "__version__", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        # a submodule (`longbird.malloc.keep_freed_memory()`) is imported on first use, like the names above
        if name.isidentifier() and not name.startswith("_") and \
                importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f".{name}", __name__)
        raise AttributeError(f"module 'longbird' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


register_when_transformers_is_loaded()
