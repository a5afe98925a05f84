"""Run a piece of Python in a process of its own that has imported torch and nothing else of note.

A forkserver preloaded with torch forks one child per call (`maxtasksperchild=1`), so each call starts clean of
transformers and longbird, which is what import-order tests need, without paying torch's import every time (about 4
of the 9 s such a subprocess took on an idle 2-core machine). Only for code that does not care whether torch came
first: a test of what `import longbird` itself loads needs a bare interpreter (`subprocess`). stdlib only, since
every child imports this module to run `_run`.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
from collections.abc import Callable, Iterator


def _run(code: str) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "<fresh process>", "exec"), {"__name__": "__fresh__"})
    return printed.getvalue().strip()


def _context():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch"])  # ignored if this process already started its forkserver
    return context


@contextlib.contextmanager
def fresh_processes() -> Iterator[Callable[[str], str]]:
    """Yields `run(code) -> what it printed`; an exception in the child is raised again here."""
    with _context().Pool(1, maxtasksperchild=1) as pool:
        yield lambda code: pool.apply(_run, (code,))


def run_together(codes: list[str]) -> list[str]:
    """Each piece of code in a fresh process of its own, all at once (e.g. the ranks of a `torch.distributed` group);
    what each printed, in order."""
    with _context().Pool(len(codes), maxtasksperchild=1) as pool:
        return pool.map(_run, codes)
