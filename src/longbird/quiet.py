"""Quiet defaults for the command line: the libraries' progress bars, load reports and warnings are noise next to
longbird's own output (`longbird --verbose` keeps them)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import warnings


def verbose() -> bool:
    """`longbird --verbose` (LONGBIRD_VERBOSE=1): the libraries' own messages and warnings are shown."""
    return os.environ.get("LONGBIRD_VERBOSE") == "1"


_SILENCING = threading.Lock()  # logger levels and warning filters are process-wide: one silenced block at a time


@contextlib.contextmanager
def silenced(loggers: tuple[str, ...], warnings_too: bool = False):
    """The named loggers below ERROR (and, with `warnings_too`, Python warnings) are dropped inside the block and
    restored after it, unless `verbose()`."""
    if verbose():
        yield
        return
    with _SILENCING:
        chosen = [logging.getLogger(name) for name in loggers]
        levels = [each.level for each in chosen]
        with warnings.catch_warnings() if warnings_too else contextlib.nullcontext():
            if warnings_too:
                warnings.simplefilter("ignore")
            for each in chosen:
                each.setLevel(logging.CRITICAL)
            try:
                yield
            finally:
                for each, level in zip(chosen, levels, strict=True):
                    each.setLevel(level)


def quiet_libraries() -> None:
    """Environment switches, read by each library when it loads: `--help` must not import them (issue 11)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # load reports ("some weights were not used ...")
    os.environ.setdefault("DATASETS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' and the hub's progress bars
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # datasets' map/filter bars
    # A library imported before this call (a Python caller, tests) has read its environment already: tell it directly.
    if "transformers" in sys.modules:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    if "datasets" in sys.modules:
        import datasets

        datasets.utils.logging.set_verbosity_error()
        datasets.disable_progress_bars()
