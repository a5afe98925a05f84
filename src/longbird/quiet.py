"""Quiet defaults for the command line: the libraries' progress bars, load reports and warnings are noise next to
longbird's own output (`longbird --verbose` keeps them)."""

from __future__ import annotations

import os
import sys


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
