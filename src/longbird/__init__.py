"""longbird: turn a short pretrained encoder into a long-context encoder without pretraining from scratch.

`import longbird` is cheap (the command line answers `--help` without loading torch): the public names below load
their modules on first use (PEP 562), and the Auto classes learn model_type "longbird" as soon as `transformers`
is imported, whichever of the two is imported first (see `_auto_registration`).
"""

from __future__ import annotations

import importlib
import sys
import types

from ._auto_registration import register_when_transformers_loads

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
    "LongBirdForSequenceClassification": "heads", "register_auto_classes": "heads",
    "LongBirdModel": "modeling",
    "SUPPORTED_FAMILIES": "convert", "convert": "convert",
    "answer": "tasks.qa",
    "tape_peft": "training.peft", "load_tape_peft": "checkpoints",
}

__all__ = ["METHODS", "__version__", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'longbird' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


class _Package(types.ModuleType):
    """`longbird.convert` is the function, also after the submodule `longbird.convert` is imported (the import system
    then sets the package attribute to the submodule; this property keeps the function under that name)."""

    @property
    def convert(self):
        from .convert import convert

        return convert

    @convert.setter
    def convert(self, submodule) -> None:
        pass


sys.modules[__name__].__class__ = _Package
register_when_transformers_loads()
