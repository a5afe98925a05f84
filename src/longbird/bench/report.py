"""Bench report: markdown tables, fitted growth exponents and PNG plots (matplotlib)."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from ..files import save_figure_atomically, write_file_atomically


def fitted_exponent(points: list[tuple[int, float]], from_length: int = 4096) -> float | None:
    """Least-squares slope of log(value) vs log(length) over lengths >= from_length (1.0 = linear)."""
    points = [(length, value) for length, value in points if length >= from_length and value > 0]
    if len(points) < 2:
        return None
    xs = [math.log(length) for length, _ in points]
    ys = [math.log(value) for _, value in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)


def _series(report):
    series = defaultdict(list)
    for row in report["rows"]:
        if "skipped" not in row:
            series[(row["dtype"], row["mode"], row["model"])].append(row)
    return series


def markdown(report: dict, command: str) -> str:
    lines = [f"Command: `{command}`  ",
             f"torch {report['torch']}, transformers {report['transformers']}, {report['threads']} threads, "
             f"CPU: {report['cpu']}  ",
             "Dense matmul throughput (4096x768 @ 768x3072): "
             + ", ".join(f"{k} {v:.2f} TFLOP/s" for k, v in report["matmul_tflops"].items()), ""]
    groups = defaultdict(list)
    for row in report["rows"]:
        groups[(row["dtype"], row["mode"])].append(row)
    series = _series(report)
    for (dtype, mode), rows in groups.items():
        lengths = sorted({row["length"] for row in rows})
        models = list(dict.fromkeys(row["model"] for row in rows))
        index = {(row["model"], row["length"]): row for row in rows}
        lines += [f"### {mode}, {dtype}: median seconds / peak MiB", "",
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
                    cells.append(f"{row['median_seconds']:.3f} / {row['peak_mib']:.0f}")
            points = series.get((dtype, mode, model), [])
            time_exp = fitted_exponent([(r["length"], r["median_seconds"]) for r in points])
            memory_exp = fitted_exponent([(r["length"], r["peak_mib"]) for r in points])
            exponent = "" if time_exp is None else f"{time_exp:.2f}, {memory_exp:.2f}"
            lines.append(f"| {model} | " + " | ".join(cells) + f" | {exponent} |")
        skips = {row["model"]: row["skipped"] for row in rows if "skipped" in row}
        lines += [""] + [f"- {model} skipped from some length on: {reason}" for model, reason in skips.items()] + [""]
    return "\n".join(lines) + "\n"


def plot(report: dict, out_dir: Path, stem: str = "bench") -> list[Path]:
    """latency vs length and peak memory vs length (log-log), one PNG per (dtype, mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    series = _series(report)
    for dtype, mode in sorted({(d, m) for d, m, _ in series}):
        figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for (d, m, model), rows in series.items():
            if (d, m) != (dtype, mode):
                continue
            rows = sorted(rows, key=lambda row: row["length"])
            lengths = [row["length"] for row in rows]
            axes[0].plot(lengths, [row["median_seconds"] for row in rows], marker="o", label=model)
            axes[1].plot(lengths, [row["peak_mib"] for row in rows], marker="o", label=model)
        for axis, label in zip(axes, ("median latency (s)", "peak tensor memory (MiB)")):
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_xlabel("sequence length (tokens)")
            axis.set_ylabel(label)
            axis.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=8)
        figure.suptitle(f"{mode}, {dtype}, batch 1, base size ({report['threads']} CPU threads)")
        figure.tight_layout()
        path = out_dir / f"{stem}_{dtype}_{mode.replace('+', '_')}.png"
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
