"""Issue 23: a house a newcomer can walk. Every module of src/longbird keeps to about 400 lines, and the CLI stays thin:
every command is a short function (its options included) that calls the library. The import layering itself is
checked by `make lint` (import-linter contracts in pyproject.toml), not here."""

from __future__ import annotations

import inspect
from pathlib import Path

import longbird
from longbird.cli import app

SOURCE = Path(longbird.__file__).parent


def test_every_command_is_a_short_function():
    lengths = {info.callback.__name__: len(inspect.getsourcelines(info.callback)[0]) for info in app.registered_commands}
    assert len(lengths) == 12 and max(lengths.values()) <= 35, lengths


def test_every_source_file_is_at_most_400_lines():
    sizes = {str(path.relative_to(SOURCE)): len(path.read_text(encoding="utf-8").splitlines())
             for path in SOURCE.rglob("*.py")}
    assert len(sizes) > 50 and "cli/__init__.py" in sizes
    too_long = {name: lines for name, lines in sizes.items() if lines > 400}
    assert not too_long, too_long


def test_the_layout_page_names_every_module():
    """docs/layout.md promises one sentence per module "as the code is laid out today": a module added without its row
    (fourteen were missing once) fails here. A row names a module by its path below src/longbird anywhere, or by its
    file name in its own package's section (a package without a section of its own, cli/ or serve/, in "Top level",
    with the top-level modules); `__init__.py` files are covered by their package's row."""
    page = (SOURCE.parents[1] / "docs" / "layout.md").read_text(encoding="utf-8")
    sections = dict(section.split("\n", 1) for section in page.split("\n## ")[1:])
    modules = [path.relative_to(SOURCE) for path in SOURCE.rglob("*") if path.suffix in (".py", ".cpp", ".h")
               and "__pycache__" not in path.parts and path.name != "__init__.py"]
    assert len(modules) > 50

    def section_of(module) -> str:
        package = module.parts[0] + "/" if len(module.parts) > 1 else None
        own = next((text for title, text in sections.items() if package and f"`{package}`" in title), None)
        return own if own is not None else sections["Top level"]

    missing = [str(module) for module in modules
               if f"`{module.as_posix()}`" not in page and f"`{module.name}`" not in section_of(module)]
    assert not missing, f"docs/layout.md has no row for {missing}"
