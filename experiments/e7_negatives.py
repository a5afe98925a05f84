"""E7 round 14: what the lexical windows without the answer are, against the random draw (data/window_groups.py).

On E7's 4,843 training questions (512-token windows, stride 128, groups of 2 as the round-14 rows train): how many
groups hold a window without the answer, how often that window overlaps a window with the answer (the tokens two
neighbouring windows share), how often the lexical and the random choice are the same window, and the CPU seconds of
each choice. Writes experiments/results/e7_negatives.json and prints it.

Usage: python experiments/e7_negatives.py [--reader qa-model/kobigbird-e5-korquad] [--size 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e7_long_reading as e7  # noqa: E402  (the data and split E7 trains on)

from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.data.window_groups import WindowGroups  # noqa: E402
from longbird.data.windows import QAWindows  # noqa: E402
from longbird.files import write_file_atomically  # noqa: E402


def overlaps(items, window: int, others: list[int]) -> bool:
    return any(items[window, 2] < items[other, 3] and items[other, 2] < items[window, 3] for other in others)


def main() -> None:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reader", type=Path, default=Path("qa-model/kobigbird-e5-korquad"))
    parser.add_argument("--size", type=int, default=2)
    args = parser.parse_args()
    rows, _ = read_korquad_v1_articles(e7.DATA / "korquad" / "KorQuAD_v1.0_dev.json")
    windows = QAWindows(AutoTokenizer.from_pretrained(args.reader), split_by_title(rows)["train"], 512, 128,
                        negative_fraction=1.0, seed=0)
    items = windows.items
    groups, seconds = {}, {}
    for kind in ("lexical", "random"):
        started = time.process_time()
        groups[kind] = WindowGroups(windows, args.size, 0, kind)
        seconds[kind] = time.process_time() - started
    counts = {"questions": len(groups["lexical"]), "with_a_negative": 0, "same_window": 0,
              "overlapping_answer": {"lexical": 0, "random": 0}}
    for lexical, drawn in zip(groups["lexical"].groups, groups["random"].groups):
        answer = [i for i in lexical if items[i, 4] > 0]
        negatives = {kind: [i for i in group if items[i, 4] == 0] for kind, group in (("lexical", lexical),
                                                                                    ("random", drawn))}
        if not negatives["lexical"]:
            continue
        counts["with_a_negative"] += 1
        counts["same_window"] += negatives["lexical"] == negatives["random"]
        for kind, chosen in negatives.items():
            counts["overlapping_answer"][kind] += overlaps(items, chosen[0], answer)
    record = {"group_size": args.size, "training_windows": windows.windows, **counts,
              "choice_cpu_seconds": {kind: round(value, 2) for kind, value in seconds.items()}}
    out = Path(__file__).resolve().parent / "results" / "e7_negatives.json"
    write_file_atomically(out, json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
