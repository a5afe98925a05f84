"""`longbird bench`: latency and peak memory against length (longbird.bench), with its report."""

from pathlib import Path
from typing import Annotated

import typer

from .common import console, resolve_device
from .options import Device

Models = Annotated[list[str], typer.Option("--model", help="Presets and baselines to compare (repeat the option)")]
Lengths = Annotated[list[int], typer.Option("--length", help="Sequence lengths")]
Modes = Annotated[list[str], typer.Option("--mode", help="forward and/or forward+backward")]
Dtypes = Annotated[list[str], typer.Option("--dtype", help="fp32, bf16 and/or fp16")]
Sizes = Annotated[list[str], typer.Option(
    "--size", help="small (12 x 384, e5-small), base (12 x 768) and/or large (24 x 1024)")]
Batches = Annotated[list[str], typer.Option("--batch", help="Batch size, or max: the largest power of two that fits")]
MaxBatch = Annotated[int, typer.Option(help="Upper bound of the search for --batch max")]
Checkpointing = Annotated[bool, typer.Option(help="Recompute layers in backward (forward+backward runs)")]
Repeats = Annotated[int, typer.Option(help="Timed calls per point (median), after one warm-up")]
MaxSeconds = Annotated[float, typer.Option(help="Skip a model at longer lengths once a call takes longer")]
MaxMemory = Annotated[float, typer.Option(help="Skip a model when its projected peak memory passes this")]
Out = Annotated[Path, typer.Option(help="Directory for JSON, markdown and PNG plots")]
Smoke = Annotated[bool, typer.Option(help="Quick check, under a minute: tiny model (2 layers, 128 hidden), lengths 512 "
                                          "and 1024, one timed call (unless --length/--repeats are given)")]
Name = Annotated[str, typer.Option(help="File stem of the results (default: bench, or bench_smoke with --smoke)")]
Compile = Annotated[list[str], typer.Option(
    "--compile", help="Also time each longbird preset through torch.compile(model, fullgraph=True) in this mode "
                      "(default, reduce-overhead: CUDA graphs, max-autotune; repeat the option), alternating with "
                      "eager; a failed compile is reported as a skip")]
Overwrite = Annotated[bool, typer.Option(help="Replace earlier results of the same name in OUT")]


def bench(ctx: typer.Context,
          models: Models = ("littlebird", "kobigbird", "full", "hf-bigbird", "hf-longformer", "sdpa-roberta"),
          lengths: Lengths = (1024, 2048, 4096, 8192, 16384), modes: Modes = ("forward", "forward+backward"),
          dtypes: Dtypes = ("fp32",), sizes: Sizes = ("base",), batches: Batches = ("1",), max_batch: MaxBatch = 64,
          device: Device = "auto", gradient_checkpointing: Checkpointing = False, repeats: Repeats = 3,
          max_seconds: MaxSeconds = 60.0, max_memory_gib: MaxMemory = 16.0, out: Out = Path("benchmarks/results"),
          smoke: Smoke = False, name: Name = "", compile_modes: Compile = (), overwrite: Overwrite = False):
    """Latency and peak memory vs length for longbird presets and transformers baselines, with plots."""
    import os
    import sys

    from ..bench.report import markdown, write_report
    from ..bench.sweep import SweepSettings

    if smoke:
        lengths, repeats = _smoke_defaults(ctx, lengths, repeats)
    settings = SweepSettings(models=list(models), lengths=list(lengths), modes=list(modes), dtypes=list(dtypes),
                             repeats=repeats, max_seconds=max_seconds, max_memory_gib=max_memory_gib,
                             device=resolve_device(device), sizes=["smoke"] if smoke else list(sizes),
                             batches=list(batches), max_batch=max_batch,
                             gradient_checkpointing=gradient_checkpointing, compile_modes=list(compile_modes))
    stem = name or ("bench_smoke" if smoke else "bench")
    report = _sweep(settings, out=out, stem=stem, overwrite=overwrite)
    command = "longbird " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else "longbird bench"
    # the environment variables that change what runs (the sparse kernel, the compiled row plan) are part of the
    # command; no other (LONGBIRD_API_KEY is a secret)
    chosen = [f"{key}={os.environ[key]}" for key in ("LONGBIRD_ATTENTION_BACKEND", "LONGBIRD_ROW_PLAN")
              if os.environ.get(key)]
    command = " ".join([*chosen, command])
    # out positionally: write_report names it out_dir
    paths = write_report(report, out, command=command, stem=stem)
    console.print(markdown(report=report | {"command": command}, command=command), markup=False)
    console.print("wrote " + ", ".join(str(path) for path in paths), markup=False)


def _smoke_defaults(ctx: typer.Context, lengths, repeats):
    """--smoke: a quick check with shorter lengths and one timed call, unless the user chose them; its model is
    tiny, so a --size is refused rather than ignored."""
    given = lambda name: ctx.get_parameter_source(name).name != "DEFAULT"
    if given("sizes"):
        raise typer.BadParameter("--size does not apply with --smoke, whose model is tiny (2 layers, 128 hidden); "
                                 "leave one of them out")
    return (lengths if given("lengths") else [512, 1024]), (repeats if given("repeats") else 1)


def _sweep(settings, out: Path, stem: str, overwrite: bool) -> dict:
    """The sweep with a progress bar, its report kept in OUT/STEM.partial.json as it grows (removed at the end)."""
    import json

    from rich.progress import Progress

    from ..bench.sweep import run_sweep
    from ..files import write_file_atomically

    partial = out / f"{stem}.partial.json"
    # committed results are evidence, and a partial file the points an interrupted run measured: never replaced
    # silently (the first point of a new run wrote over that file)
    existing = [str(path) for path in (out / f"{stem}.json", out / f"{stem}.md", partial) if path.exists()]
    if existing and not overwrite:
        kept = f"; {partial.name} holds an interrupted run's points: move it to keep them" if partial.exists() else ""
        them = "them" if len(existing) > 1 else "it"
        raise FileExistsError(f"{', '.join(existing)} already {'exist' if len(existing) > 1 else 'exists'}; pass "
                              f"--overwrite to replace {them}, or --name to write beside {them}{kept}")
    steps = len(settings.sizes) * len(settings.dtypes) * len(settings.modes) * len(settings.batches) * len(
        settings.lengths)
    try:
        with Progress(console=console) as progress:
            task = progress.add_task("bench", total=steps)
            report = run_sweep(settings=settings,
                               progress=lambda message: progress.update(task, advance=1, description=message),
                               checkpoint=lambda report: write_file_atomically(
                                   path=partial, text=json.dumps(report, indent=2) + "\n"))
    except BaseException:
        if partial.exists():
            console.print(f"the points measured so far are in {partial}", markup=False)
        raise
    partial.unlink(missing_ok=True)
    return report
