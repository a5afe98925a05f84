"""The main job (`make demo`): convert the embedded Korean-capable multilingual-e5-small to a 4096-token kobigbird
model, check it against its source on Korean text, encode a long Korean document, save and reload."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

from .bench.memory import peak_allocated_bytes
from .conversion import convert, load_source
from .files import check_writable, write_directory_atomically
from .precision import native_bf16
from .sources import E5_NAME, resolve_source

# Package data (resources/konlpy-corpus/SOURCE.md): the Korean constitution and ten National Assembly bills.
KONLPY = Path(__file__).resolve().parent / "resources" / "konlpy-corpus"
DEFAULT_DOCUMENT = KONLPY / "kolaw" / "constitution.txt"
SHORT_TEXTS = (KONLPY / "kobill" / "1809890.txt", KONLPY / "kobill" / "1809891.txt")
# The demo's record in its output: a directory holding it is a demo's own, which a new demo replaces unasked.
DEMO_RECORD = "longbird_demo.json"


def _timed(fn, repeats: int) -> tuple[float, int, torch.Tensor]:
    """Median seconds over `repeats` calls after a warm-up, and the peak tensor memory of one extra call."""
    fn()  # warm-up: first call pays one-off allocation and kernel selection
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    peak, _ = peak_allocated_bytes(fn)
    return statistics.median(times), peak, out


def run_demo(
    out: Path,
    source: str | Path | None = None,
    document: Path = DEFAULT_DOCUMENT,
    max_length: int = 4096,
    repeats: int = 2,
    overwrite: bool = False,
    step: Callable[[str], None] = lambda message: None,
) -> dict:
    """Returns the measured figures; `step` reports progress (the CLI prints it). `out` is replaced when an earlier
    demo wrote it; any other longbird directory (a fine-tuned model) only with `overwrite`, checked before the work."""
    if not Path(document).is_file():
        raise FileNotFoundError(f"demo document {document} not found; pass --document FILE")
    overwrite = overwrite or (Path(out) / DEMO_RECORD).is_file()
    check_writable(out, overwrite)
    name = str(source) if source is not None else E5_NAME
    source = resolve_source(name)
    results: dict = {"source": name, "max_length": max_length}

    step("converting the source model")
    source_model = load_source(source).eval()
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    tokenizer.model_max_length = max_length
    model = convert(source_model, preset="kobigbird", max_length=max_length)
    base = getattr(model, "longbird", model)

    step("checking equivalence with the source at <= 512 tokens on real text")
    texts = [Path(path).read_text(encoding="utf-8") for path in SHORT_TEXTS if Path(path).is_file()]
    texts.append(Path(document).read_text(encoding="utf-8")[:200])
    limit = base.config.source_max_positions
    batch = tokenizer(texts, truncation=True, max_length=limit, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = source_model.base_model(**batch).last_hidden_state
        actual = base(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    results["equivalence_lengths"] = batch["attention_mask"].sum(1).tolist()
    results["max_abs_diff_vs_source"] = (expected - actual).abs()[real].max().item()

    # bf16 is timed only where the CPU multiplies it: emulated (AVX2-only CPUs) it is ~75x slower than fp32 and
    # would turn a one-minute demo into a long wait for a figure nobody should use.
    with_bf16 = native_bf16("cpu")
    step(f"encoding {Path(document).name} at {max_length} tokens (fp32{' and bf16 autocast' if with_bf16 else ''})")
    encoded = tokenizer(Path(document).read_text(encoding="utf-8"), return_tensors="pt")
    results["document_tokens"] = int(encoded["input_ids"].shape[1])
    long_batch = tokenizer(Path(document).read_text(encoding="utf-8"), truncation=True, max_length=max_length,
                           return_tensors="pt")
    results["encoded_tokens"] = int(long_batch["input_ids"].shape[1])
    with torch.inference_mode():
        seconds, peak, fp32_out = _timed(lambda: base(**long_batch).last_hidden_state, repeats)
        results["fp32_seconds"], results["fp32_peak_mib"] = seconds, peak / 2**20

        def bf16():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return base(**long_batch).last_hidden_state

        if with_bf16:
            seconds, peak, bf16_out = _timed(bf16, repeats)
    results["bf16_skipped"] = None if with_bf16 else "this CPU has no bf16 arithmetic (emulated, far slower than fp32)"
    if with_bf16:
        results["bf16_seconds"], results["bf16_peak_mib"] = seconds, peak / 2**20
        results["bf16_min_cosine_vs_fp32"] = torch.nn.functional.cosine_similarity(
            bf16_out.float(), fp32_out, dim=-1).min().item()

    step(f"saving to {out} and reloading")

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        (directory / DEMO_RECORD).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")

    write_directory_atomically(out, write, overwrite=overwrite)
    reloaded = AutoModel.from_pretrained(out, local_files_only=True).eval()
    with torch.inference_mode():
        again = reloaded(**long_batch).last_hidden_state
    results["reload_identical"] = bool(torch.equal(again, fp32_out))
    results["saved_to"] = str(out)
    return results
