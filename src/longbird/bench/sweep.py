"""`longbird bench`: latency and peak memory vs length for longbird presets and transformers baselines.

All models run in one process, batch 1, base size, random init. A model is skipped at longer lengths once
one call took longer than `max_seconds` or its projected memory passes `max_memory_gib` (recorded as a skip
with the reason). Timed calls of different models alternate, so machine noise hits them alike.
"""

from __future__ import annotations

import gc
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .memory import peak_allocated_bytes
from .models import BASE, build_model, forward_fn, linear_flops, matmul_throughput

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class SweepSettings:
    models: list[str] = field(default_factory=lambda: ["littlebird", "kobigbird", "full", "hf-bigbird",
                                                        "hf-longformer", "sdpa-roberta"])
    lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384])
    modes: list[str] = field(default_factory=lambda: ["forward", "forward+backward"])
    dtypes: list[str] = field(default_factory=lambda: ["fp32"])
    repeats: int = 3
    max_seconds: float = 60.0
    max_memory_gib: float = 16.0


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_sweep(settings: SweepSettings, base: dict | None = None,
              progress: Callable[[str], None] = lambda message: None,
              checkpoint: Callable[[dict], None] = lambda report: None) -> dict:
    """Returns a JSON-ready report: environment, matmul throughput, one row per (model, dtype, mode, length).

    `checkpoint(report)` is called after every length so a long sweep that is stopped keeps what it measured.
    """
    import transformers

    base = dict(BASE if base is None else base)
    report = {
        "settings": asdict(settings), "base": base, "torch": torch.__version__,
        "transformers": transformers.__version__, "threads": torch.get_num_threads(), "cpu": cpu_model(),
        "matmul_tflops": {name: matmul_throughput(DTYPES[name]) / 1e12 for name in settings.dtypes},
        "rows": [],
    }
    max_length = max(settings.lengths)
    for dtype_name in settings.dtypes:
        for mode in settings.modes:
            models = {name: build_model(name, max_length, base).to(DTYPES[dtype_name]) for name in settings.models}
            skipped: dict[str, str] = {}
            last_peak: dict[str, tuple[int, float]] = {}
            for length in sorted(settings.lengths):
                active = {}
                for name in models:
                    reason = skipped.get(name) or _projected_over_memory(last_peak.get(name), length, settings)
                    if reason:
                        skipped[name] = reason
                        report["rows"].append(dict(model=name, dtype=dtype_name, mode=mode, length=length,
                                                   skipped=reason))
                        continue
                    active[name] = forward_fn(models[name], length, backward=mode != "forward")
                progress(f"{dtype_name} {mode} {length}: {', '.join(active) or 'all skipped'}")
                for name, row in _measure(active, settings.repeats).items():
                    row.update(model=name, dtype=dtype_name, mode=mode, length=length)
                    row["linear_tflops_achieved"] = linear_flops(length, base) * (3 if mode != "forward" else 1) \
                        / row["median_seconds"] / 1e12
                    report["rows"].append(row)
                    last_peak[name] = (length, row["peak_mib"])
                    if row["median_seconds"] > settings.max_seconds:
                        skipped[name] = f"one call took {row['median_seconds']:.0f} s > max_seconds {settings.max_seconds:.0f}"
                checkpoint(report)
            del models
            gc.collect()
    return report


def _projected_over_memory(last, length, settings) -> str | None:
    if last is None:
        return None
    previous_length, peak_mib = last
    projected_gib = peak_mib * (length / previous_length) ** 2 / 1024  # quadratic bound: safe for every model
    if projected_gib > settings.max_memory_gib:
        return f"projected peak {projected_gib:.1f} GiB > max_memory_gib {settings.max_memory_gib:.0f}"
    return None


def _measure(runs: dict[str, Callable], repeats: int) -> dict[str, dict]:
    times = {name: [] for name in runs}
    for run in runs.values():
        run()  # warm-up
    for _ in range(repeats):
        for name, run in runs.items():
            gc.collect()
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    rows = {}
    for name, run in runs.items():
        peak, _ = peak_allocated_bytes(run)
        rows[name] = {"median_seconds": statistics.median(times[name]), "min_seconds": min(times[name]),
                      "peak_mib": peak / 2**20}
    return rows
