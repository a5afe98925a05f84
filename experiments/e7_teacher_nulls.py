"""E7 round 12: what the paragraph reader's null-relative targets say about regions without the answer.

On training cuts of round 10's long layout (data/layout_cuts.py, the train side of E7's split), the teacher
(training/cut_teacher.py) reads each cut in one window; for every later region of a cut that does not hold the answer
(the first region, with the question, left out), this counts how often its target gives the region's null less than
half of the region's probability, i.e. says a token there beats "not here", where the gold labels give the null all
of it: with the null-relative targets and with the marginal ones (`--teacher-targets`). Cuts with the answer and
without are counted apart: the teacher's [CLS] reads the whole cut, so its scores are relative to a window-level
"not here".

Usage: python experiments/e7_teacher_nulls.py --reader qa-model/kobigbird-e5-korquad \\
           --layout experiments/runs/e7_round9_amx/kobigbird-long-b128qn-cuts-ranked [--cuts 160]
Writes experiments/results/e7_teacher_nulls.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from longbird.checkpoints import load_task_model  # noqa: E402
from longbird.data.batching import PaddedBatches  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.data.layout_cuts import LayoutCuts  # noqa: E402
from longbird.data.null_regions import NullRegions  # noqa: E402
from longbird.data.windows import QAWindows  # noqa: E402
from longbird.files import write_file_atomically  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.tasks.qa import question_limit  # noqa: E402
from longbird.training.cut_teacher import CutTeacher, region_targets  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", type=Path, required=True, help="The teacher (make qa-model)")
    parser.add_argument("--layout", type=Path, required=True, help="A long reader whose layout the cuts take")
    parser.add_argument("--questions", type=int, default=400, help="Train-side questions to cut from")
    parser.add_argument("--cuts", type=int, default=160, help="Cuts read, evenly spaced over all of them")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "e7_teacher_nulls.json")
    args = parser.parse_args()
    rows, _ = read_korquad_v1_articles(ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json")
    train = split_by_title(rows)["train"]
    train = train.select(range(min(args.questions, len(train))))
    layout, tokenizer = load_task_model(args.layout, LongBirdForQuestionAnswering)
    teacher_model, _ = load_task_model(args.reader, LongBirdForQuestionAnswering)
    windows = QAWindows(tokenizer, train, 4096, 1024, None, 1.0, 0, token_types=False,
                        max_question_tokens=question_limit(layout, tokenizer, 4096),
                        null_regions=NullRegions.of(layout.config, tokenizer))
    cuts = LayoutCuts(windows, 512, layout.config.block_size, 128, 0.1, 0)  # E7's cuts: 512 tokens, overlap 128
    teacher = CutTeacher(teacher_model, windows.template, bf16=False)
    collate = PaddedBatches(layout.config.pad_token_id)
    picked = list(range(0, len(cuts), max(1, len(cuts) // args.cuts)))[:args.cuts]
    counts = {group: {"cuts": 0, "regions": 0, "null below half": 0, "marginal null below half": 0}
              for group in ("with the answer", "without")}
    kinds = {"null below half": "null-relative", "marginal null below half": "marginal"}
    for begin in range(0, len(picked), 16):
        batch = collate([cuts[i] for i in picked[begin:begin + 16]])
        relative = teacher.targets(batch).relative
        valid = batch["attention_mask"].bool()
        # each region's target as the training loss builds it (training/cut_teacher.region_targets)
        p_null = {}
        for key, kind in kinds.items():
            nulls, exists, member, scores = region_targets(relative, batch["region_nulls"], valid, kind)
            probabilities = torch.softmax(scores.masked_fill(~member, float("-inf")), -1)
            p_null[key] = probabilities.gather(2, nulls.clamp(max=valid.shape[1] - 1)[..., None])[..., 0]  # (B, R)
        for row in range(len(batch["input_ids"])):
            gold = int(batch["start_positions"][row])
            group = counts["with the answer" if gold > 0 else "without"]
            group["cuts"] += 1
            answer_region = int(batch["region_nulls"][row, gold]) if gold > 0 else None
            for index, null in enumerate(nulls[row].tolist()):
                if not exists[row, index] or null in (0, answer_region):
                    continue  # the first region holds the question; the answer's region is the gold's
                group["regions"] += 1
                for key in kinds:
                    group[key] += int(p_null[key][row, index].item() < 0.5)
    result = {"command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "counts": counts}
    write_file_atomically(args.out, json.dumps(result, indent=1) + "\n")
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
