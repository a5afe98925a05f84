"""What the commands share beyond their options: the consoles, the metrics table, `--device`, `--bf16` autocast,
`--set`, and the training settings of a training command's options."""

from __future__ import annotations

import dataclasses
import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()
error_console = Console(stderr=True)


def print_metrics(title: str, metrics: dict) -> None:
    """The title on one line, then the metrics; printed by the first process only (under torchrun each trained)."""
    from ..training.processes import is_main_process

    if not is_main_process():
        return
    console.print(title, markup=False, soft_wrap=True)  # a table title wrapped at the table's width
    table = Table(show_header=False)
    for key, value in metrics.items():
        if key == "num_input_tokens_seen" and metrics.get("tokens_seen") == value:
            continue  # Trainer's name of tokens_seen, shown once
        if isinstance(value, (int, float, str)):
            table.add_row(escape(key), f"{value:.4g}" if isinstance(value, float) else escape(str(value)))
    resume = metrics.get("resume")
    if resume and resume["steps_trained_by_this_run"]:  # train_loss is then the loss of the resumed steps only
        first, last = resume["steps_trained_by_this_run"]
        table.add_row("resumed", f"from {escape(str(resume['from_checkpoint']))}: train_loss covers steps "
                                 f"{first}-{last} only")
    elif resume:
        table.add_row("resumed", f"from {escape(str(resume['from_checkpoint']))}, its last step: nothing left to "
                                 "train")
    console.print(table)


def resolve_device(device: str | None) -> str:
    """--device: "auto" (default) is CUDA when present, else CPU; anything else must be available here."""
    import torch

    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"--device {device!r} is not a device name ({error}); use cpu, cuda or cuda:N") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available on this machine (torch "
                         f"{torch.__version__}); use --device cpu")
    return str(parsed)


def warn_if_bf16_is_slow(device: str, bf16: bool) -> None:
    """`--bf16` of the inference commands: a warning where bf16 is emulated on `device`."""
    from ..precision import slow_bf16_warning

    slow = slow_bf16_warning(device) if bf16 else None
    if slow:
        error_console.print(f"[yellow]warning:[/] {escape(slow)}", highlight=False)


def autocast(device: str, bf16: bool):
    """bf16 autocast on `device` for a command that reads a model it loaded itself, with the warning above."""
    from ..precision import bf16_autocast

    warn_if_bf16_is_slow(device, bf16)
    return bf16_autocast(device.split(":")[0], bf16)


def parse_options(options: list[str]) -> dict:
    """`--set KEY=VALUE ...` as config overrides: JSON values, else the plain string (taper_schedule=power)."""
    parsed = {}
    for option in options:
        if "=" not in option:
            raise ValueError(f"--set expects KEY=VALUE; got {option!r}")
        key, value = option.split("=", 1)
        try:
            parsed[key] = json.loads(value)
        except json.JSONDecodeError:
            parsed[key] = value  # plain strings such as taper_schedule=power
    _check_option_types(parsed)
    return parsed


def _check_option_types(parsed: dict) -> None:
    """A --set value of the wrong kind for a config field with a number or a switch as its default, named here
    (`num_random_blocks=abc` failed deep in the config with "'<' not supported between 'str' and 'int'")."""
    if not parsed:
        return
    from ..config import LongBirdConfig

    defaults = LongBirdConfig()
    for key, value in parsed.items():
        default = getattr(defaults, key, None)
        if value is None:
            continue  # null: the config says whether the field may be unset
        if isinstance(default, bool):
            fits, kind = isinstance(value, bool), "true or false"
        elif isinstance(default, int):
            fits, kind = isinstance(value, int) and not isinstance(value, bool), "a whole number"
        elif isinstance(default, float):
            fits, kind = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        else:
            continue
        if not fits:
            raise ValueError(f"--set {key}={json.dumps(value) if not isinstance(value, str) else value}: {key} takes "
                             f"{kind} (its default is {json.dumps(default)})")


def training_settings(options: dict, **fixed):
    """The `FinetuneSettings` of a training command: every option named like one of its fields (the command passes
    `locals()`), then `fixed`. Checked before any data is read or model converted (FinetuneSettings checks the
    numbers, `check_training_device` the device and precision; a ValueError is one line and exit 1)."""
    from ..training.finetune import FinetuneSettings, check_training_device

    fields = {field.name for field in dataclasses.fields(FinetuneSettings)}
    settings = FinetuneSettings(**{name: value for name, value in options.items() if name in fields} | fixed)
    check_training_device(settings)
    return settings
