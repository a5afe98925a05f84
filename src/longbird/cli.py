"""Thin typer app: each command calls a library function and prints its result (rich)."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="longbird: long-context encoders from short ones.")
console = Console()


def _parse_options(options: list[str]) -> dict:
    parsed = {}
    for option in options:
        if "=" not in option:
            raise typer.BadParameter(f"--set expects KEY=VALUE; got {option!r}")
        key, value = option.split("=", 1)
        try:
            parsed[key] = json.loads(value)
        except json.JSONDecodeError:
            parsed[key] = value  # plain strings such as taper_schedule=power
    return parsed


@app.command()
def convert(
    source: Optional[str] = typer.Argument(None, help="Local HF model directory (default: embedded all-MiniLM-L6-v2)"),
    preset: str = typer.Option("kobigbird", help="Method preset"),
    max_length: int = typer.Option(4096, help="Target maximum length in tokens"),
    out: Path = typer.Option(..., help="Output directory"),
    set_: list[str] = typer.Option([], "--set", help="Config override KEY=VALUE, e.g. taper_schedule=power"),
    overwrite: bool = typer.Option(False, help="Replace OUT if it exists"),
):
    """Convert a BERT/RoBERTa/XLM-R/CamemBERT/ELECTRA encoder into a longbird model."""
    from transformers import AutoTokenizer

    from . import convert as convert_model
    from .convert import default_source
    from .files import write_directory_atomically

    source_path = source or str(default_source())
    with console.status(f"converting {source_path} ({preset}, {max_length} tokens)"):
        model = convert_model(source_path, preset=preset, max_length=max_length, **_parse_options(set_))

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        try:
            AutoTokenizer.from_pretrained(source_path, local_files_only=True).save_pretrained(directory)
        except (OSError, ValueError):
            console.print("[yellow]no tokenizer found beside the source; saved the model only[/]")

    with console.status(f"saving to {out}"):
        write_directory_atomically(out, write, overwrite=overwrite)
    config = model.config
    console.print(f"[green]saved[/] {type(model).__name__} to {out}: attention={config.attention}, "
                  f"position={config.position}/{config.position_extension}, max_length={config.max_position_embeddings}, "
                  f"source L={config.source_max_positions}")


@app.command()
def export(
    model_dir: Path = typer.Argument(..., help="A saved longbird model directory"),
    format: str = typer.Option("hf-bigbird", "--format", help="Export format"),
    out: Path = typer.Option(..., help="Output directory"),
    overwrite: bool = typer.Option(False, help="Replace OUT if it exists"),
):
    """Export a BigBird+TAPER model to a plain transformers checkpoint."""
    from .export import export as export_model

    with console.status(f"exporting {model_dir} as {format}"):
        export_model(model_dir, out, format=format, overwrite=overwrite)
    console.print(f"[green]wrote[/] {format} checkpoint to {out}")


@app.command()
def env():
    """Versions, presets and kernels."""
    import tokenizers
    import torch
    import transformers

    from . import METHODS, PRESETS, __version__
    from .bench.sweep import cpu_model
    from .convert import SUPPORTED_FAMILIES

    table = Table(title="longbird environment", show_header=False)
    rows = {
        "longbird": __version__, "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "threads": str(torch.get_num_threads()), "cpu": cpu_model(),
        "cpu capability": str(torch.backends.cpu.get_cpu_capability()),
        "source families": ", ".join(SUPPORTED_FAMILIES),
        "presets": ", ".join(f"{name} ({', '.join(f'{k}={v}' for k, v in values.items())})" for name, values in PRESETS.items()),
        "kernels": "full (SDPA), bigbird (blocked ITC), littlebird (blocked USW + pack), reference (dense oracle)",
        "methods": "; ".join(f"{name}: {text}" for name, text in METHODS.items()),
    }
    for key, value in rows.items():
        table.add_row(key, value)
    console.print(table)


@app.command()
def demo(
    out: Path = typer.Option(Path("demo-output/kobigbird-minilm-4096"), help="Where the converted model is saved"),
    document: Optional[Path] = typer.Option(None, help="Long document to encode (default: the Korean constitution)"),
    max_length: int = typer.Option(4096, help="Target length"),
):
    """Convert the embedded MiniLM to kobigbird-4096, verify, encode a long Korean document, save and reload."""
    from .demo import DEFAULT_DOCUMENT, run_demo

    with console.status("starting") as status:
        results = run_demo(out, document=document or DEFAULT_DOCUMENT, max_length=max_length,
                           step=lambda message: (status.update(message), console.log(message)))
    table = Table(title="longbird demo: all-MiniLM-L6-v2 -> kobigbird", show_header=False)
    table.add_row("equivalence at <= 512 tokens (lengths)", str(results["equivalence_lengths"]))
    table.add_row("max |converted - source| (fp32)", f"{results['max_abs_diff_vs_source']:.2e}")
    table.add_row("document tokens (encoded)", f"{results['document_tokens']} ({results['encoded_tokens']})")
    table.add_row("fp32 encode time / peak memory", f"{results['fp32_seconds']:.2f} s / {results['fp32_peak_mib']:.0f} MiB")
    table.add_row("bf16 autocast time / peak memory", f"{results['bf16_seconds']:.2f} s / {results['bf16_peak_mib']:.0f} MiB")
    table.add_row("bf16 vs fp32 min cosine", f"{results['bf16_min_cosine_vs_fp32']:.5f}")
    table.add_row("saved to / reload identical", f"{results['saved_to']} / {results['reload_identical']}")
    console.print(table)
    if results["max_abs_diff_vs_source"] > 1e-4 or not results["reload_identical"]:
        console.print("[red]demo checks failed[/]")
        raise typer.Exit(1)


@app.command()
def bench(
    models: list[str] = typer.Option(["littlebird", "kobigbird", "full", "hf-bigbird", "hf-longformer", "sdpa-roberta"],
                                     "--model", help="Presets and baselines to compare (repeat the option)"),
    lengths: list[int] = typer.Option([1024, 2048, 4096, 8192, 16384], "--length", help="Sequence lengths"),
    modes: list[str] = typer.Option(["forward", "forward+backward"], "--mode", help="forward and/or forward+backward"),
    dtypes: list[str] = typer.Option(["fp32"], "--dtype", help="fp32 and/or bf16"),
    repeats: int = typer.Option(3, help="Timed calls per point (median), after one warm-up"),
    max_seconds: float = typer.Option(60.0, help="Skip a model at longer lengths once a call takes longer"),
    max_memory_gib: float = typer.Option(16.0, help="Skip a model when its projected peak memory passes this"),
    out: Path = typer.Option(Path("benchmarks/results"), help="Directory for JSON, markdown and PNG plots"),
    smoke: bool = typer.Option(False, help="Tiny model (2 layers, 128 hidden) for a quick check, e.g. in CI"),
    name: str = typer.Option("", help="File stem of the results (default: bench, or bench_smoke with --smoke)"),
):
    """Latency and peak memory vs length for longbird presets and transformers baselines, with plots."""
    import sys

    from rich.progress import Progress

    from .bench.models import BASE
    from .bench.report import markdown, write_report
    from .bench.sweep import SweepSettings, run_sweep

    for mode in modes:
        if mode not in ("forward", "forward+backward"):
            raise typer.BadParameter(f"--mode must be forward or forward+backward; got {mode!r}")
    settings = SweepSettings(models=list(models), lengths=list(lengths), modes=list(modes), dtypes=list(dtypes),
                             repeats=repeats, max_seconds=max_seconds, max_memory_gib=max_memory_gib)
    base = dict(BASE, num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=256) if smoke else None
    import json

    from .files import write_file_atomically

    stem = name or ("bench_smoke" if smoke else "bench")
    partial = out / f"{stem}.partial.json"
    steps = len(dtypes) * len(modes) * len(lengths)
    with Progress(console=console) as progress:
        task = progress.add_task("bench", total=steps)
        report = run_sweep(settings, base, progress=lambda message: progress.update(
            task, advance=1, description=message),
            checkpoint=lambda report: write_file_atomically(partial, json.dumps(report, indent=2) + "\n"))
    partial.unlink(missing_ok=True)
    command = "longbird " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else "longbird bench"
    paths = write_report(report, out, command, stem=stem)
    console.print(markdown(report | {"command": command}, command))
    console.print("wrote " + ", ".join(str(path) for path in paths))


if __name__ == "__main__":
    app()
