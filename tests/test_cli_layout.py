"""Issue 23 item 5: the CLI stays thin: every command is a short function (its options included) and no module of the
cli package grows past the 400 lines every src/ file keeps to."""

from __future__ import annotations

import inspect
from pathlib import Path

from longbird.cli import app


def test_every_command_is_a_short_function():
    lengths = {info.callback.__name__: len(inspect.getsourcelines(info.callback)[0]) for info in app.registered_commands}
    assert len(lengths) == 11 and max(lengths.values()) <= 35, lengths


def test_cli_modules_stay_small():
    package = Path(inspect.getfile(app.registered_callback.callback)).parent
    sizes = {path.name: len(path.read_text(encoding="utf-8").splitlines()) for path in package.glob("*.py")}
    assert sizes and max(sizes.values()) <= 400, sizes
