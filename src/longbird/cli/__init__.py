"""The `longbird` command line (typer): the app, its root options, one-line errors, and the commands, each a thin call
of a library function in a module by concern (`models`, `bench`, `qa`, `classify`, `pretrain`); the options they share
are in `options`. Importing it loads neither torch nor transformers: the commands import them when they run."""

from __future__ import annotations

import re

import click
import typer
from rich.markup import escape
from typer.core import TyperGroup

from .bench import bench
from .classify import finetune_cls
from .common import error_console
from .models import convert, demo, env, export
from .pretrain import distill, pretrain
from .qa import answer, evaluate, finetune_qa
from .serve import serve


class _OneLineErrors(TyperGroup):
    """Every command's errors as one line on stderr and exit 1; `longbird --debug ...` re-raises (full traceback)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        # typer 0.29 vendors click (typer._click): its usage errors are TyperExceptions, not click's own classes.
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort, typer.Exit, typer.Abort,
                typer.exceptions.TyperException):
            raise
        except Exception as error:
            if ctx.params.get("debug"):
                raise
            error_console.print(f"[red]error:[/] {escape(one_line(error))}", highlight=False, markup=True,
                                soft_wrap=True)
            raise typer.Exit(1) from None


# The library's messages name Python arguments (`max_length=1024`); someone who typed a command reads the options
# they type instead. Only spellings whose option is unambiguous are rewritten.
CLI_SPELLINGS = (
    (re.compile(r"\b(random_blocks|taper_schedule|position_extension|attention|global_blocks|local_windows)='([\w-]+)'"),
     r"--set \1=\2"),
    (re.compile(r"\bmax_length=(\d+)"), r"--max-length \1"),
    (re.compile(r"\bmax_length \((\d+)\)"), r"--max-length (\1)"),
    (re.compile(r"\bmax_length >= (\d+)"), r"--max-length \1 or more"),
    # convert's --max-length is the converted config's max_position_embeddings (config.py's check, nowhere else)
    (re.compile(r"\bmax_position_embeddings \((\d+)\) is below the source length"),
     r"--max-length (\1) is below the source length"),
    (re.compile(r"\bdoc_stride \((-?\d+)\)"), r"--doc-stride (\1)"),
    (re.compile(r"\bwindow_length (-?\d+) must"), r"--window-length \1 must"),
    (re.compile(r"\bpass overwrite=True \(--overwrite\)"), "pass --overwrite"),
    (re.compile(r"\bgive the length as max_length\b"), "give the length as --max-length"),
    (re.compile(r"^the question is empty\b"), "--question is empty"),  # longbird.answer's own check
)


def cli_spelling(text: str) -> str:
    """`text` with Python argument spellings replaced by the CLI options a user types (`CLI_SPELLINGS`)."""
    for pattern, replacement in CLI_SPELLINGS:
        text = pattern.sub(replacement, text)
    return text


def one_line(error: BaseException) -> str:
    """The error as one line: our messages as they are (in CLI spelling); anything else prefixed by its type, with
    where to look."""
    text = cli_spelling(" ".join(str(error).split())) or type(error).__name__
    if isinstance(error, (ValueError, OSError, ImportError, KeyError)):
        return text.strip("'\"") if isinstance(error, KeyError) else text
    return f"{type(error).__name__}: {text} (longbird --debug ... shows the traceback)"


app = typer.Typer(cls=_OneLineErrors, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,  # plain click help: option names are never cut at 80 columns
                  help="longbird: long-context encoders from short ones.")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"longbird {version('longbird')}")
        raise typer.Exit()


def plain_warnings(ctx: click.Context) -> None:
    """longbird's own warnings (memorisation, emulated bf16, ...) read as the errors do, `warning: ...`, without the
    source line that raised them, for the command's time only (an in-process caller gets Python's format back)."""
    import warnings

    previous = warnings.formatwarning
    warnings.formatwarning = lambda message, category, *_, **__: f"warning: {message}\n"
    ctx.call_on_close(lambda: setattr(warnings, "formatwarning", previous))


@app.callback()
def _root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help="Show the full traceback of an error"),
    verbose: bool = typer.Option(False, "--verbose", help="Show library progress bars, load reports and raw logs"),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version"),
    threads: int | None = typer.Option(None, "--threads", help="CPU threads for torch (default: torch's choice)"),
):
    """longbird: long-context encoders from short ones."""
    from ..malloc import keep_freed_memory

    keep_freed_memory()  # before any tensor: freed activations reused, not unmapped (LONGBIRD_MALLOC=system: off)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be >= 1; got {threads}")
        import torch

        torch.set_num_threads(threads)
    if verbose:
        import os

        os.environ["LONGBIRD_VERBOSE"] = "1"  # read by training's progress callback
    else:
        from ..quiet import quiet_libraries

        quiet_libraries()
        plain_warnings(ctx)


# In the order `longbird --help` lists them.
for command in (convert, export, env, demo, bench, finetune_qa, evaluate, answer, serve, distill, pretrain,
                finetune_cls):
    app.command(command.__name__.replace("_", "-"))(command)
