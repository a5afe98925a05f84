"""Bench report: markdown tables, fitted growth exponents and PNG plots (matplotlib)."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from ..files import save_figure_atomically, write_file_atomically
from .models import PRESET_SETTINGS, eager_name


def fitted_exponent(points: list[tuple[int, float]], from_length: int = 4096) -> float | None:
    """Least-squares slope of log(value) vs log(length) over lengths >= from_length (1.0 = linear)."""
    points = [(length, value) for length, value in points if length >= from_length and value > 0]
    if len(points) < 2:
        return None
    xs = [math.log(length) for length, _ in points]
    ys = [math.log(value) for _, value in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)


GROUP_KEYS = ("size", "batch_setting", "dtype", "mode")


def _longbird(model: str) -> bool:
    """A longbird preset, eager or compiled ("kobigbird+compile:reduce-overhead")."""
    return eager_name(model) in PRESET_SETTINGS


def memory_measured(report: dict, row: dict) -> bool:
    """False for CUDA-graph runs (compiled with mode="reduce-overhead" on a GPU): their memory comes from the graphs'
    private pool, recorded at capture, which the per-call peak counter never sees (it reads 0)."""
    return not (report.get("device") == "cuda" and row["model"].endswith(":reduce-overhead"))


def _group(row) -> tuple:
    return tuple(str(row.get(key, default)) for key, default in zip(GROUP_KEYS, ("base", "1", "", "")))


def _series(report):
    series = defaultdict(list)
    for row in report["rows"]:
        if "skipped" not in row:
            series[(*_group(row), row["model"])].append(row)
    return series


def _environment(report: dict) -> list[str]:
    where = (f"device: {report['device_name']} ({report['device']})" if report.get("device") == "cuda"
             else f"CPU: {report['cpu']}, {report['threads']} threads")
    size = "8192^3" if report.get("device") == "cuda" else "4096x768 @ 768x3072"
    return [f"torch {report['torch']}, transformers {report['transformers']}, {where}  ",
            f"Dense matmul throughput ({size}): "
            + ", ".join(f"{k} {v:.2f} TFLOP/s" for k, v in report["matmul_tflops"].items()), ""]


def markdown(report: dict, command: str) -> str:
    lines = [f"Command: `{command}`  ", *_environment(report)]
    groups = defaultdict(list)
    for row in report["rows"]:
        groups[_group(row)].append(row)
    series = _series(report)
    for group, rows in groups.items():
        size, batch, dtype, mode = group
        lengths = sorted({row["length"] for row in rows})
        models = list(dict.fromkeys(row["model"] for row in rows))
        index = {(row["model"], row["length"]): row for row in rows}
        batch_text = "largest batch that fits (batch in brackets)" if batch == "max" else f"batch {batch}"
        lines += [f"### {size}, {batch_text}, {mode}, {dtype}: median ms / peak MiB", "",
                  "| model | " + " | ".join(str(length) for length in lengths) + " | exponent 4K+ (time, memory) |",
                  "|---|" + "---:|" * (len(lengths) + 1)]
        for model in models:
            cells = []
            for length in lengths:
                row = index.get((model, length))
                if row is None:
                    cells.append("")
                elif "skipped" in row:
                    cells.append("skipped")
                else:
                    memory = f"{row['peak_mib']:.0f}" if memory_measured(report, row) else "–"
                    cell = f"{1000 * row['median_seconds']:.1f} / {memory}"
                    cells.append(cell + (f" [{row['batch']}]" if batch == "max" else ""))
            points = series.get((*group, model), [])
            time_exp = fitted_exponent([(r["length"], r["median_seconds"] / r.get("batch", 1)) for r in points])
            memory_exp = fitted_exponent([(r["length"], r["peak_mib"] / r.get("batch", 1)) for r in points
                                          if memory_measured(report, r)])
            exponent = "" if time_exp is None else (f"{time_exp:.2f}, "
                                                    + ("–" if memory_exp is None else f"{memory_exp:.2f}"))
            lines.append(f"| {model} | " + " | ".join(cells) + f" | {exponent} |")
        skips = {row["model"]: row["skipped"] for row in rows if "skipped" in row}
        lines += [""] + [f"- {model} skipped from some length on: {reason}" for model, reason in skips.items()] + [""]
        lines += _ratios(rows, lengths) + [""]
    return "\n".join(lines) + "\n"


def _ratios(rows, lengths) -> list[str]:
    """Per longbird model: throughput (tokens/s) ratio over each baseline, and the linear layers' share of matmul."""
    index = {(row["model"], row["length"]): row for row in rows if "skipped" not in row}
    ours = [model for model in dict.fromkeys(m for m, _ in index) if _longbird(model)]
    others = list(dict.fromkeys(m for m, _ in index if not _longbird(m)))
    if not ours:
        return []
    lines = ["Speed-up (tokens/s ratio) and linear-layer FLOP rate as a fraction of the measured matmul rate:", "",
             "| longbird model | vs | " + " | ".join(str(length) for length in lengths) + " |",
             "|---|---|" + "---:|" * len(lengths)]
    for model in ours:
        for other in others:
            cells = []
            for length in lengths:
                a, b = index.get((model, length)), index.get((other, length))
                cells.append(f"{a['tokens_per_second'] / b['tokens_per_second']:.2f}x" if a and b and
                             "tokens_per_second" in a else "")
            lines.append(f"| {model} | {other} | " + " | ".join(cells) + " |")
        cells = [f"{100 * index[(model, length)]['linear_fraction_of_matmul']:.0f} %"
                 if (model, length) in index and "linear_fraction_of_matmul" in index[(model, length)] else ""
                 for length in lengths]
        lines.append(f"| {model} | matmul rate | " + " | ".join(cells) + " |")
    return lines + _compiled_ratios(rows, index, lengths)


def _compiled_ratios(rows, index, lengths) -> list[str]:
    """Per compiled variant: eager time / compiled time (above 1: compiling pays) and its first call (the compile)."""
    compiled = [model for model in dict.fromkeys(m for m, _ in index) if "+compile" in model]
    if not compiled:
        return []
    lines = ["", "Compiled against eager (eager median / compiled median; first call = compilation + one call, s):", "",
             "| compiled model | " + " | ".join(str(length) for length in lengths) + " |",
             "|---|" + "---:|" * len(lengths)]
    for model in compiled:
        eager = eager_name(model)
        cells = []
        for length in lengths:
            a, b = index.get((model, length)), index.get((eager, length))
            cells.append(f"{b['median_seconds'] / a['median_seconds']:.2f}x (first {a['first_call_seconds']:.0f} s)"
                         if a and b and "first_call_seconds" in a else "")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return lines


def plot(report: dict, out_dir: Path, stem: str = "bench") -> list[Path]:
    """latency vs length and peak memory vs length (log-log), one PNG per (size, batch, dtype, mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    series = _series(report)
    where = report.get("device_name", "") if report.get("device") == "cuda" else f"{report['threads']} CPU threads"
    for group in sorted({key[:4] for key in series}):
        size, batch, dtype, mode = group
        figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for key, rows in series.items():
            if key[:4] != group:
                continue
            rows = sorted(rows, key=lambda row: row["length"])
            lengths = [row["length"] for row in rows]
            axes[0].plot(lengths, [row["median_seconds"] for row in rows], marker="o", label=key[4])
            measured = [row for row in rows if memory_measured(report, row)]
            axes[1].plot([row["length"] for row in measured], [row["peak_mib"] for row in measured], marker="o",
                         label=key[4])
        for axis, label in zip(axes, ("median latency (s)", "peak tensor memory (MiB)")):
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_xlabel("sequence length (tokens)")
            axis.set_ylabel(label)
            axis.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=8)
        batch_text = "largest batch that fits" if batch == "max" else f"batch {batch}"
        figure.suptitle(f"{mode}, {dtype}, {batch_text}, {size} size ({where})")
        figure.tight_layout()
        path = out_dir / f"{stem}_{size}_b{batch}_{dtype}_{mode.replace('+', '_')}.png"
        save_figure_atomically(figure, path)
        plt.close(figure)
        written.append(path)
    return written


def write_report(report: dict, out_dir: Path, command: str, stem: str = "bench") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {**report, "command": command}
    paths = [write_file_atomically(out_dir / f"{stem}.json", json.dumps(report, indent=2) + "\n"),
             write_file_atomically(out_dir / f"{stem}.md", markdown(report, command))]
    return paths + plot(report, out_dir, stem)


def write_table(report: dict, lines: list[str], out_dir: Path, name: str) -> None:
    """A benchmark script's result: NAME.json (the report) and NAME.md (its markdown lines), each written atomically,
    and the markdown printed."""
    write_file_atomically(out_dir / f"{name}.json", json.dumps(report, indent=2) + "\n")
    write_file_atomically(out_dir / f"{name}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
