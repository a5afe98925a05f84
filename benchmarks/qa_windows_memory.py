"""Peak memory and time of building QA training data: the eager windows against the lazy ones (data/windows.py).

The run of issue 24 item 5: KorQuAD 1.0 whole articles (`--format korquad1-articles --split train`), 512-token
windows, half-window stride, `--negative-fraction 0.1`, the multilingual-e5-small tokenizer with longbird's HTML tag
tokens. Each route runs in a fresh process (peak resident memory from getrusage, so one route cannot inherit the
other's heap): `eager` builds every window of every question (`features_for_rows`) and draws negatives from them
(`qa_training_items`); `lazy` tokenizes each article once and builds only the drawn windows' index, then every item
once (what one epoch of the data loader does). The lazy route also runs on a quarter and a half of the questions,
to show memory flat in the number of questions.
Usage: python benchmarks/qa_windows_memory.py [--skip-eager]
Writes benchmarks/results/qa_windows_memory.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from longbird.bench.sweep import cpu_model
from longbird.files import write_file_atomically

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json"

CHILD = """
import json, resource, sys, time
route, fraction = sys.argv[1], float(sys.argv[2])
from transformers import AutoTokenizer
from longbird.data.html import add_tag_tokens
from longbird.sources import e5_path
from longbird.tasks.qa import read_qa_data
rows, _ = read_qa_data(sys.argv[3], "korquad1-articles", "train")
rows = rows.select(range(int(len(rows) * fraction)))
tokenizer = AutoTokenizer.from_pretrained(e5_path(), local_files_only=True)
tokenizer.model_max_length = 1 << 20
add_tag_tokens(tokenizer)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
started = time.perf_counter()
if route == "eager":
    from longbird.data.features import features_for_rows
    from longbird.training.finetune import qa_training_items
    features = features_for_rows(tokenizer, rows, 512)
    items = qa_training_items(features, 0.1, 0)
    windows, built = len(features), time.perf_counter() - started
    tokens = sum(len(item["input_ids"]) for item in items)
else:
    from longbird.data.windows import QAWindows
    items = QAWindows(tokenizer, rows, 512, negative_fraction=0.1, seed=0)
    windows, built = items.windows, time.perf_counter() - started
    tokens = sum(len(items[i]["input_ids"]) for i in range(len(items)))  # every item once: one epoch's assembly
print(json.dumps({"questions": len(rows), "articles": len(set(rows["title"])), "windows": windows,
                  "items": len(items), "item_tokens": tokens, "build_s": built,
                  "total_s": time.perf_counter() - started, "baseline_rss_gib": base,
                  "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


def run(route: str, fraction: float) -> dict:
    result = subprocess.run([sys.executable, "-c", CHILD, route, str(fraction), str(DATA)], capture_output=True,
                            text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if result.returncode:
        raise SystemExit(result.stderr[-3000:])
    return {"route": route, "fraction": fraction, **json.loads(result.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-eager", action="store_true", help="only the lazy route (the eager one needs ~13 GB)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "qa_windows_memory.md")
    args = parser.parse_args()
    runs = [] if args.skip_eager else [run("eager", 1.0)]
    runs += [run("lazy", fraction) for fraction in (0.25, 0.5, 1.0)]
    lines = ["# QA training windows: eager against lazy", "",
             f"Command: `python benchmarks/qa_windows_memory.py{' --skip-eager' if args.skip_eager else ''}`  ",
             f"Machine: {cpu_model()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}  ",
             "Data: KorQuAD 1.0 dev file as whole articles, train side of the by-article split; 512-token windows, "
             "half-window stride, negative fraction 0.1, multilingual-e5-small tokenizer. Peak RSS of a fresh "
             "process (getrusage), including Python, transformers and the tokenizer (the baseline column).", "",
             "| route | questions | articles | windows | training items | item tokens | build s | build + assemble "
             "every item s | baseline RSS GiB | peak RSS GiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['route']} | {r['questions']} | {r['articles']} | {r['windows']} | {r['items']} | "
                     f"{r['item_tokens']} | {r['build_s']:.1f} | {r['total_s']:.1f} | {r['baseline_rss_gib']:.2f} | "
                     f"{r['peak_rss_gib']:.2f} |")
    lines += ["", "```json", json.dumps(runs, indent=1), "```", ""]
    write_file_atomically(args.out, "\n".join(lines))
    print("\n".join(lines[:len(lines) - 4]))


if __name__ == "__main__":
    main()
