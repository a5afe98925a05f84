"""E7 probe: a null score per region for the long reader (issue 24, the ranking loss of e7_diagnosis.py).

The paragraph reader's start logits were trained inside one window's softmax, which is blind to a constant per
window, so the sliding reader compares windows by each window's null-relative score (span score minus that window's
[CLS] score). A 4096-token reading has one [CLS] and compares the raw logits of the whole article, which
e7_diagnosis.py measured as the long reader's main loss. This probe gives the long reading a null per region,
zero-shot: a [CLS] token with position id 0 (the row the reader's [CLS] always had) is inserted before every
`region` document tokens past the first 512 of each 4096-token window, and a span scores relative to the start logit
of the [CLS] that opens its region (the real [CLS] in the first 512). Readings per region size:
- `regional`: spans scored against their region's null;
- `inserted, one null`: the same input (with the inserted tokens) scored against the real [CLS] only: what the
  insertion itself does to the reading.
Plain reading (no insertion) of the same conversion is e7_diagnosis.py's "whole" row.

Questions: the probe's validation articles (the dev side minus E7's test articles, asserted), `--questions` of them;
nothing here reads E7's test articles. A measurement of whether the route was worth building; the library now has it
(config `qa_null_every`, data/null_regions.py; E7 round 4), which this script does not use.

Usage: python experiments/e7_regional_null.py --reader qa-model/kobigbird-e5-korquad \\
           --model experiments/runs/e7_conversion_probe/from-reader/kobigbird-4096-copy-128-128-0-first-reads-source \\
           --regions 384 256 128 [--questions 200]
Writes experiments/results/e7_regional_null.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e4_korquad_articles import BUCKETS, answer_buckets  # noqa: E402
from e7_conversion_probe import validation_rows  # noqa: E402
from e7_long_reading import (  # noqa: E402
    LONG,
    SOURCE_WINDOW,
    add_output_arguments,
    draw_dev_articles,
    held_out_record,
    machine,
    provenance,
    score_cells,
    wants_bf16,
    write_tables,
)

from longbird.checkpoints import load_task_model  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.metrics.intervals import bucket_summary  # noqa: E402
from longbird.precision import bf16_autocast  # noqa: E402
from longbird.qa import row_features  # noqa: E402
from longbird.tasks.qa import per_question_scores, question_limit, require_trained_apart  # noqa: E402

READINGS = ("regional", "inserted, one null")
ROOM = 32  # tokens left free in each window for the inserted [CLS] tokens (at most 3584 / 128 = 28)


def with_nulls(feature, region: int, cls_id: int):
    """The window's inputs with a [CLS] (position 0) before every `region` document tokens past the first 512, its
    offsets (None at the inserted tokens) and the inserted indices."""
    ids, offsets, types, nulls = [], [], [], []
    for index, (token, offset) in enumerate(zip(feature.input_ids, feature.offsets)):
        token_type = feature.token_type_ids[index] if feature.token_type_ids else 0
        if offset is not None and index >= SOURCE_WINDOW and (index - SOURCE_WINDOW) % region == 0:
            nulls.append(len(ids))
            ids.append(cls_id)
            offsets.append(None)
            types.append(token_type)
        ids.append(token)
        offsets.append(offset)
        types.append(token_type)
    positions = list(range(len(ids)))
    for index in nulls:
        positions[index] = 0
    inputs = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
              "position_ids": torch.tensor([positions])}
    if feature.token_type_ids is not None:
        inputs["token_type_ids"] = torch.tensor([types])
    return inputs, offsets, nulls


@torch.no_grad()
def read_row(model, tokenizer, row, region: int, cap: int) -> dict[str, str]:
    """{reading: predicted text} for one question: every window of the article, spans decoded as `qa.decode_window`
    does for the conditional head (start logit + log-softmax of the allowed ends), minus the reading's null."""
    features, documents = row_features(model, tokenizer, [row], LONG - ROOM, 1024, max_question_tokens=cap)
    text = documents[row["id"]].text
    best = {reading: (float("-inf"), "") for reading in READINGS}
    for feature in features:
        inputs, offsets, nulls = with_nulls(feature, region, tokenizer.cls_token_id)
        document = torch.tensor([offset is not None for offset in offsets])
        out = model(**inputs, top_k=model.config.qa_top_k, start_candidates=document[None])
        start = out.start_logits[0].float()
        region_null = torch.full_like(start, float(start[0]))
        for index in nulls:  # each inserted null holds from its place to the next one
            region_null[index:] = start[index]
        positions = torch.arange(len(offsets))
        for rank, first in enumerate(out.start_top_index[0].tolist()):
            if offsets[first] is None:
                continue
            allowed = document & (positions >= first) & (positions - first < model.config.qa_max_answer_tokens)
            ends = torch.log_softmax(out.end_top_logits[0, rank].float().masked_fill(~allowed, float("-inf")), -1)
            last = int(ends.argmax())
            raw = float(start[first] + ends[last])
            answer = text[offsets[first][0]:offsets[last][1]].strip()
            for reading, null in zip(READINGS, (float(region_null[first]), float(start[0]))):
                if raw - null > best[reading][0]:
                    best[reading] = (raw - null, answer)
    return {reading: answer for reading, (_, answer) in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", type=Path, required=True, help="The paragraph reader the model was converted from")
    parser.add_argument("--model", type=Path, required=True, help="A 4096-token conversion of it")
    parser.add_argument("--regions", type=int, nargs="+", default=[384])
    parser.add_argument("--questions", type=int, default=200)
    add_output_arguments(parser, "e7_regional_null")
    args = parser.parse_args()
    bf16 = wants_bf16(args.precision)
    rows, _ = read_korquad_v1_articles(ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json")
    split = split_by_title(rows)
    _, tokenizer = load_task_model(args.reader, LongBirdForQuestionAnswering)
    test, _ = draw_dev_articles(split["dev"], tokenizer, 300, 150)
    questions = validation_rows(split["dev"], set(test["title"]), args.questions)
    assert not set(questions["title"]) & set(test["title"]), "a validation article is one of E7's test articles"
    require_trained_apart(args.reader, set(split["dev"]["title"]), root=ROOT)
    buckets = answer_buckets(questions, tokenizer)
    model, model_tokenizer = load_task_model(args.model, LongBirdForQuestionAnswering)
    model.eval()
    if model.config.qa_null_every:  # the library would insert its own nulls under this script's
        raise SystemExit(f"{args.model} already reads with regional nulls (qa_null_every="
                         f"{model.config.qa_null_every}): give this probe a conversion with qa_null_every=0")
    cap = question_limit(model, model_tokenizer, LONG - ROOM)
    results = {"command": "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "machine": machine(),
               "model": str(args.model), "bf16": bf16, "questions": len(questions),
               "articles": sorted(set(questions["title"])), "held_out": held_out_record(split["train"], questions),
               "bucket_sizes":
               {b: list(buckets.values()).count(b) for b in BUCKETS}, "regions": {}}
    for region in args.regions:
        started = time.process_time()
        predictions = {reading: {} for reading in READINGS}
        with bf16_autocast("cpu", bf16):
            for row in questions:
                for reading, answer in read_row(model, model_tokenizer, row, region, cap).items():
                    predictions[reading][row["id"]] = answer
        entry = {"cpu_seconds": time.process_time() - started}
        for reading in READINGS:
            scores = per_question_scores(predictions[reading], questions, "korquad1-articles")
            entry[reading] = {"summary": bucket_summary(scores, buckets, BUCKETS, None), "per_question": scores}
            print(region, reading, json.dumps(entry[reading]["summary"]["all"]), flush=True)
        results["regions"][str(region)] = entry
        write_tables(args.out, args.name, results, table(results))


def table(results: dict) -> list[str]:
    sizes = results["bucket_sizes"]
    lines = provenance(results) + [
        f"{results['model']} read zero-shot on {results['questions']} questions of {len(results['articles'])} "
        f"validation articles ({sizes['first 512']} answers in the first 512 tokens, {sizes['beyond 512']} "
        f"beyond), {'bf16 autocast' if results['bf16'] else 'fp32'}; a [CLS] with position 0 inserted before "
        "every *region* document tokens past the first 512.", "",
        "| region | reading | F1 (95 % CI) | EM | F1 first 512 | F1 beyond 512 | CPU s (both readings) |",
        "|---:|---|---:|---:|---:|---:|---:|"]
    for region, entry in results["regions"].items():
        for reading in READINGS:
            lines.append(f"| {region} | {reading} | {score_cells(entry[reading]['summary'])} | "
                         f"{entry['cpu_seconds']:.0f} |")
    return lines


if __name__ == "__main__":
    main()
