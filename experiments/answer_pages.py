"""The two KorQuAD 2.1 pages in data/korquad/ (HTML, never trained on: no KorQuAD 2.x data is in any recipe), all
three of their questions, answered by one or more QA models as `longbird answer` answers them (longbird.Reader, the
window each model was fine-tuned at unless --window-length is given).

Usage: python experiments/answer_pages.py --model qa-model/kobigbird-e5-korquad --model qa-model/kobigbird-e5-korquad-long
       [--name answer_pages] [--bf16] [--lexical-weight 0.3]
Writes experiments/results/NAME.{md,json}.

Held out, asserted: every model's own record (longbird_finetune.json) shows KorQuAD 1.0 training data (format
korquad1 or korquad1-articles, never a KorQuAD 2.x page), and neither page's title is an article of the repository's
KorQuAD 1.0 file, the only KorQuAD 1.0 data here; the page titles and context hashes go into the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from longbird import Reader  # noqa: E402
from longbird.data.corpus import text_hash  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, read_korquad_v2  # noqa: E402
from longbird.files import write_file_atomically  # noqa: E402
from longbird.lexical_prior import DEFAULT_WEIGHT  # noqa: E402
from longbird.metrics.korquad import f1_korquad_v2, normalize_korquad_v2  # noqa: E402

PAGES = [ROOT / "data" / "korquad" / name for name in ("korquad2.1_dev_00.json", "korquad2.1_train_00.json")]
KORQUAD1 = ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json"
TRAINED_FORMATS = ("korquad1", "korquad1-articles")


def held_out_record(models: list[Path], rows) -> dict:
    """Raises unless every model was fine-tuned on KorQuAD 1.0 data only and no page title is a KorQuAD 1.0 article;
    returns the page titles, their context hashes and each model's training format."""
    formats = {}
    for model_dir in models:
        record = json.loads((model_dir / "longbird_finetune.json").read_text(encoding="utf-8"))
        formats[str(model_dir)] = record.get("format")
        if record.get("format") not in TRAINED_FORMATS:
            raise SystemExit(f"{model_dir} was fine-tuned on {record.get('format')!r} data: only readers trained on "
                             f"KorQuAD 1.0 ({', '.join(TRAINED_FORMATS)}) have never seen these KorQuAD 2.1 pages")
    titles = sorted(set(rows["title"]))
    shared = set(titles) & set(read_korquad_v1_articles(KORQUAD1)[0]["title"])
    if shared:
        raise SystemExit(f"the KorQuAD 1.0 data holds the pages {sorted(shared)}: they may have been trained on")
    return {"page_titles": titles, "page_context_sha256": sorted({text_hash(c) for c in rows["context"]}),
            "training_formats": formats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, action="append", required=True)
    parser.add_argument("--window-length", type=int, default=None)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (where the CPU multiplies bf16)")
    parser.add_argument("--lexical-weight", type=float, default=DEFAULT_WEIGHT,
                        help="The lexical prior's weight, as `answer --lexical-weight` (0: off)")
    parser.add_argument("--name", default="answer_pages")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    args = parser.parse_args()
    pages = read_korquad_v2(PAGES)[0]
    held_out = held_out_record(args.model, pages)
    rows = list(pages)
    results = {"command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "held_out": held_out,
               "models": {}}
    lines = [f"Command: `{results['command']}`", "",
             "| model | window | page | question | gold | answer | probability | EM | F1 | seconds |",
             "|---|---:|---|---|---|---|---:|---:|---:|---:|"]
    for model_dir in args.model:
        # as `answer --bf16` reads: the encoder's Linears stored in bf16
        reader = Reader(model_dir, bf16=args.bf16, lexical_weight=args.lexical_weight)
        records = []
        for row in rows:
            started = time.perf_counter()
            reading = reader.answer(row["question"], row["context"], is_html=True, window_length=args.window_length)
            seconds = time.perf_counter() - started
            best = reading.answers[0] if reading.answers else {"answer": None, "probability": None}
            golds = row["answers"]["text"]
            predicted = best["answer"] or ""
            record = {"title": row["title"], "question": row["question"], "gold": golds, "answer": best["answer"],
                      "probability": best.get("probability"), "window_length": reading.window_length,
                      "windows": reading.windows, "seconds": seconds,
                      # the official KorQuAD 2.x measures (tags stripped), in %
                      "exact_match": 100.0 * max(normalize_korquad_v2(predicted) == normalize_korquad_v2(g)
                                                 for g in golds),
                      "f1": 100.0 * max(f1_korquad_v2(predicted, g) for g in golds)}
            records.append(record)
            probability = "" if record["probability"] is None else f"{record['probability']:.2f}"
            lines.append(f"| {model_dir} | {reading.window_length} | {row['title']} | {row['question']} | "
                         f"{' / '.join(golds)} | {best['answer']} | {probability} | {record['exact_match']:.0f} | "
                         f"{record['f1']:.1f} | {seconds:.1f} |")
            print(lines[-1], flush=True)
        results["models"][str(model_dir)] = records
    write_file_atomically(args.out / f"{args.name}.json", json.dumps(results, ensure_ascii=False, indent=1) + "\n")
    write_file_atomically(args.out / f"{args.name}.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
