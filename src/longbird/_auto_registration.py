"""Teach transformers' Auto classes model_type "longbird" without making `import longbird` load torch.

Registering needs transformers' model classes, which import torch (about 5 s), so `import longbird` cannot do it
eagerly and still let `longbird --help` answer at once. Instead:
- importing `longbird.config` (which every model path does) registers at the end of that module;
- if `transformers` is imported later by someone else, a one-shot post-import hook registers right after it loads,
  so `import longbird; from transformers import AutoModel; AutoModel.from_pretrained(dir)` works in any order.
"""

from __future__ import annotations

import importlib.abc
import sys


def _longbird_is_importing() -> bool:
    """True while some longbird module is executing: that import chain reaches `longbird.config`, which registers."""
    return any(name.startswith("longbird.") and getattr(getattr(module, "__spec__", None), "_initializing", False)
               for name, module in list(sys.modules.items()))


def _register() -> None:
    if not _longbird_is_importing():
        import longbird.config  # noqa: F401  (registers at its end)


class _AfterTransformersLoads(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of `transformers` so that registration runs after it executes."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "transformers":
            return None
        sys.meta_path.remove(self)  # one shot; the real finders below answer
        spec = next((found for finder in sys.meta_path if hasattr(finder, "find_spec")
                     for found in [finder.find_spec(fullname, path, target)] if found is not None), None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _register()

        spec.loader.exec_module = exec_module
        return spec


def register_when_transformers_loads() -> None:
    if "transformers" in sys.modules:
        _register()
    elif not any(isinstance(finder, _AfterTransformersLoads) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterTransformersLoads())
