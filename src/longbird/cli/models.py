"""Commands about a model itself: `convert`, `export`, `env`, `demo`."""

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from .common import console, parse_options
from .options import Out, Overwrite, Preset

Source = Annotated[str | None, typer.Argument(help="Local HF model directory, or a named embedded source: minilm "
                                                   "(default) or multilingual-e5-small")]
Overrides = Annotated[list[str], typer.Option("--set", help="Config override KEY=VALUE, e.g. taper_schedule=power")]


def convert(source: Source = None, preset: Preset = "kobigbird",
            max_length: Annotated[int, typer.Option(help="Target maximum length in tokens")] = 4096,
            out: Out = ..., set_: Overrides = (), overwrite: Overwrite = False):
    """Convert a BERT/RoBERTa/XLM-R/CamemBERT/ELECTRA encoder into a longbird model."""
    from ..checkpoints import convert_to_directory

    source = source or "minilm"
    with console.status(escape(f"converting {source} ({preset}, {max_length} tokens) and saving to {out}")):
        model, has_tokenizer = convert_to_directory(source=source, out=out, preset=preset, max_length=max_length,
                                                    overwrite=overwrite, **parse_options(set_))
    if not has_tokenizer:
        console.print("[yellow]no tokenizer found beside the source; saved the model only[/]")
    config = model.config
    # the extension (TAPER or copy) applies to a position table only: BiALiBi and RoPE-initialised TAPE have none
    position = f"{config.position}/{config.position_extension}" if config.uses_position_table else config.position
    console.print(f"[green]saved[/] {type(model).__name__} to {escape(str(out))}: attention={config.attention}, "
                  f"position={position}, "
                  f"max_length={config.max_position_embeddings}, "
                  f"source L={config.source_max_positions}")


def export(model_dir: Annotated[Path, typer.Argument(help="A saved longbird model directory")],
           format: Annotated[str, typer.Option(
               "--format", help="hf-bigbird: a transformers BigBird checkpoint (kobigbird, full); onnx: model.onnx "
                                "with its head, dynamic batch and length (every preset; needs longbird[onnx])")
           ] = "hf-bigbird",
           out: Out = ..., overwrite: Overwrite = False):
    """Export a longbird model: a plain transformers BigBird checkpoint or an ONNX graph."""
    from ..export import ONNX_RECORD
    from ..export import export as export_model

    with console.status(escape(f"exporting {model_dir} as {format}")):
        export_model(model_dir=model_dir, out=out, format=format, overwrite=overwrite, quiet=True)
    if format == "onnx":
        record = json.loads((Path(out) / ONNX_RECORD).read_text(encoding="utf-8"))
        lengths = record["lengths"]
        console.print(f"[green]wrote[/] {escape(str(out))}/model.onnx: inputs {', '.join(record['inputs'])} of any "
                      "batch size and "
                      f"{lengths['shortest']}-{lengths['longest']} tokens"
                      + (f" in multiples of {lengths['multiple']}" if lengths["multiple"] > 1 else "")
                      + " (pad with attention_mask 0); outputs " + ", ".join(record["outputs"]))
        return
    console.print(f"[green]wrote[/] {escape(format)} checkpoint to {escape(str(out))}")


def env():
    """Versions, presets and kernels."""
    import platform

    import tokenizers
    import torch
    import transformers

    from .. import METHODS, PRESETS, __version__
    from ..bench.sweep import cpu_model
    from ..conversion import SUPPORTED_FAMILIES
    from ..malloc import applied

    table = Table(title="longbird environment", show_header=False)
    rows = {
        "longbird": __version__, "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "threads": str(torch.get_num_threads()), "cpu": cpu_model(),
        "cpu capability": str(torch.backends.cpu.get_cpu_capability()),
        "freed tensor memory": f"{applied()} (LONGBIRD_MALLOC: keep or system)",
        "source families": ", ".join(SUPPORTED_FAMILIES),
        "presets": ", ".join(f"{name} ({', '.join(f'{k}={v}' for k, v in values.items())})"
                             for name, values in PRESETS.items()),
        "kernels": "full (SDPA), bigbird (blocked ITC), littlebird (blocked USW + pack), reference (dense oracle)",
        "methods": "; ".join(f"{name}: {text}" for name, text in METHODS.items()),
    }
    for key, value in rows.items():
        table.add_row(key, value)
    console.print(table)


def demo(out: Annotated[Path, typer.Option(help="Where the converted model is saved")] = Path(
             "demo-output/kobigbird-e5-small-4096"),
         source: Annotated[str, typer.Option(help="Source: a named embedded source or a directory")] = (
             "multilingual-e5-small"),
         document: Annotated[Path | None, typer.Option(
             help="Long document to encode (default: the Korean constitution)")] = None,
         max_length: Annotated[int, typer.Option(help="Target length")] = 4096,
         overwrite: Annotated[bool, typer.Option(help="Replace --out even when it holds a model the demo did not "
                                                      "write (an earlier demo's output is replaced unasked)")] = False):
    """Convert multilingual-e5-small to kobigbird-4096, verify, encode a long Korean document, save and reload."""
    from ..demo import DEFAULT_DOCUMENT, run_demo

    with console.status("starting") as status:
        results = run_demo(out=out, source=source, document=document or DEFAULT_DOCUMENT, max_length=max_length,
                           overwrite=overwrite,
                           step=lambda message: (status.update(message), console.log(message)))
    console.print(_demo_table(results))
    if results["max_abs_diff_vs_source"] > 1e-4 or not results["reload_identical"]:
        console.print("[red]demo checks failed[/]")
        raise typer.Exit(1)


def _demo_table(results: dict) -> Table:
    table = Table(title=f"longbird demo: {results['source']} -> kobigbird", show_header=False)
    table.add_row("equivalence at <= 512 tokens (lengths)", str(results["equivalence_lengths"]))
    table.add_row("max |converted - source| (fp32)", f"{results['max_abs_diff_vs_source']:.2e}")
    table.add_row("document tokens (encoded)", f"{results['document_tokens']} ({results['encoded_tokens']})")
    table.add_row("fp32 encode time / peak memory",
                  f"{results['fp32_seconds']:.2f} s / {results['fp32_peak_mib']:.0f} MiB")
    if results["bf16_skipped"]:
        table.add_row("bf16 autocast", f"skipped: {results['bf16_skipped']}")
    else:
        table.add_row("bf16 autocast time / peak memory",
                      f"{results['bf16_seconds']:.2f} s / {results['bf16_peak_mib']:.0f} MiB")
        table.add_row("bf16 vs fp32 min cosine", f"{results['bf16_min_cosine_vs_fp32']:.5f}")
    table.add_row("saved to / reload identical", f"{results['saved_to']} / {results['reload_identical']}")
    return table
