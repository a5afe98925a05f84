"""Quiet defaults for the command line: the libraries' progress bars, load reports and warnings are noise next to
longbird's own output (`longbird --verbose` keeps them)."""

from __future__ import annotations

import os


def quiet_libraries() -> None:
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the profiler's USDT profiler_start/stop lines (bench memory)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    import datasets
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.utils.logging.set_verbosity_error()
    datasets.disable_progress_bars()
