"""How long gold answers are in tokens, and what share a `--max-answer-tokens` limit covers.

Every question of the repository's KorQuAD 1.0 file (paragraph contexts, 5,774 questions) and KorQuAD 2.1 pages (HTML,
3 questions), tokenized as the readers see them: the multilingual-e5-small tokenizer (the Korean source) with the
HTML tag tokens added, windows of 4096 tokens; an answer's length is end - start + 1 of its labelled window.

Usage: python experiments/answer_lengths.py
Writes experiments/results/answer_lengths.{json,md}.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from transformers import AutoTokenizer  # noqa: E402

from longbird.data.features import features_for_rows  # noqa: E402
from longbird.data.html import add_tag_tokens  # noqa: E402
from longbird.files import write_file_atomically  # noqa: E402
from longbird.sources import resolve_model_directory  # noqa: E402
from longbird.tasks.qa import read_qa_data  # noqa: E402

LIMITS = (16, 32, 64, 128, 256, 512)
DATA = {"KorQuAD 1.0 (paragraphs)": (ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json", "korquad1"),
        "KorQuAD 2.1 (HTML pages)": (sorted((ROOT / "data" / "korquad").glob("korquad2*.json")), "korquad2")}


def answer_lengths(tokenizer, rows, window: int = 4096) -> list[int]:
    lengths = {}
    for feature in features_for_rows(tokenizer, rows, window):
        if feature.start_position > 0 and feature.example_id not in lengths:
            lengths[feature.example_id] = feature.end_position - feature.start_position + 1
    return [lengths[row["id"]] for row in rows if row["id"] in lengths]


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_directory("multilingual-e5-small"), local_files_only=True)
    add_tag_tokens(tokenizer)
    tokenizer.model_max_length = 1 << 20
    results = {"tokenizer": "multilingual-e5-small + HTML tag tokens", "limits": list(LIMITS), "data": {}}
    lines = ["Command: `python experiments/answer_lengths.py`  ",
             "Gold answer length in tokens (multilingual-e5-small tokenizer with the HTML tag tokens), and the share "
             "of answers a `--max-answer-tokens` limit covers.", "",
             "| data | questions | median | p95 | p99 | max | " + " | ".join(f"≤ {n}" for n in LIMITS) + " |",
             "|---|---:|---:|---:|---:|---:|" + "---:|" * len(LIMITS)]
    for name, (path, data_format) in DATA.items():
        rows = read_qa_data([str(p) for p in path] if isinstance(path, list) else path, data_format)[0]
        lengths = sorted(answer_lengths(tokenizer, rows))
        quantile = lambda q: lengths[min(len(lengths) - 1, int(q * len(lengths)))]  # noqa: E731
        coverage = {n: 100.0 * sum(length <= n for length in lengths) / len(lengths) for n in LIMITS}
        results["data"][name] = {"questions": len(rows), "measured": len(lengths), "lengths": lengths,
                                 "median": statistics.median(lengths), "p95": quantile(0.95),
                                 "p99": quantile(0.99), "max": lengths[-1], "coverage_percent": coverage}
        lines.append(f"| {name} | {len(lengths)} | {statistics.median(lengths):g} | {quantile(0.95)} | "
                     f"{quantile(0.99)} | {lengths[-1]} | " + " | ".join(f"{coverage[n]:.1f} %" for n in LIMITS) + " |")
    out = ROOT / "experiments" / "results"
    write_file_atomically(out / "answer_lengths.json", json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    write_file_atomically(out / "answer_lengths.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
