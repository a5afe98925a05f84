"""The one place that teaches transformers' Auto classes model_type "longbird".

`register_auto_classes()` registers `LongBirdConfig` with `AutoConfig` and the model classes with `AutoModel`,
`AutoModelForMaskedLM`, `AutoModelForQuestionAnswering` and `AutoModelForSequenceClassification` (idempotent).
`import longbird` calls `register_when_transformers_is_loaded()`, so that saved directories load through the Auto
classes in any import order: `import longbird` then `from transformers import AutoModel`, the reverse, or a direct
`from longbird.modeling import LongBirdModel`.
"""

from __future__ import annotations

import importlib.abc
import sys

_registered = False


def register_auto_classes() -> None:
    """After this, AutoConfig/AutoModel* load saved longbird directories (model_type "longbird")."""
    global _registered
    for finder in [finder for finder in sys.meta_path if isinstance(finder, _RegisterAfterImport)]:
        sys.meta_path.remove(finder)  # registering imports longbird modules: the hook must not fire inside it
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForMaskedLM,
        AutoModelForQuestionAnswering,
        AutoModelForSequenceClassification,
    )

    from .config import LongBirdConfig
    from .heads import LongBirdForMaskedLM, LongBirdForQuestionAnswering, LongBirdForSequenceClassification
    from .modeling import LongBirdModel

    AutoConfig.register("longbird", LongBirdConfig, exist_ok=True)
    for auto, model in ((AutoModel, LongBirdModel), (AutoModelForMaskedLM, LongBirdForMaskedLM),
                        (AutoModelForQuestionAnswering, LongBirdForQuestionAnswering),
                        (AutoModelForSequenceClassification, LongBirdForSequenceClassification)):
        auto.register(LongBirdConfig, model, exist_ok=True)
    _registered = True


def register_when_transformers_is_loaded() -> None:
    """Register now if transformers is loaded, else as soon as it is (and no longbird module is half-executed).

    Why an import hook at all: registering needs the model classes, i.e. torch and transformers. Measured on the
    development machine, `import longbird` takes 0.04 s and `import longbird.heads` (what registering imports)
    6.4 s more, so `import longbird` cannot register eagerly and still let `longbird --help` answer at once; the hook
    lets `import longbird; from transformers import AutoModel` work without paying those 6 s on every import.
    """
    if _registered:
        return
    if "transformers" in sys.modules and not _longbird_is_executing():
        register_auto_classes()
    elif not any(isinstance(finder, _RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())


def _longbird_is_executing(finished: str | None = None) -> bool:
    """True while a longbird submodule other than `finished` is still executing: registering now would import
    modules that are half-defined, so the registration waits for the outermost one to finish."""
    return any(name.startswith("longbird.") and name != finished
               and getattr(getattr(module, "__spec__", None), "_initializing", False)
               for name, module in list(sys.modules.items()))


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself. For `transformers` and for longbird's own submodules it wraps the real loader, so that
    once such a module has executed, with transformers loaded and no other longbird module half-executed, the Auto
    classes are registered; then the finder removes itself (one registration per process)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "transformers" and not fullname.startswith("longbird."):
            return None
        spec = next((found for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec")
                     for found in [finder.find_spec(fullname, path, target)] if found is not None), None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            if (not _registered and "transformers" in sys.modules
                    and not _longbird_is_executing(finished=fullname)):
                register_auto_classes()

        spec.loader.exec_module = exec_module
        return spec
