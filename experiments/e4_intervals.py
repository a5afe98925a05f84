"""95 % intervals for E4 from its committed predictions (no model is run).

E4 (`e4_korquad_articles.py`) committed each method's predictions beside its scores but reported the scores alone. This
script scores every question again with the official KorQuAD 1.0 metric (`tasks.qa.per_question_scores`), asserts
that the means and the bucket sizes equal the committed ones, and reports, as E7 does, each method's EM and F1 with a
95 % bootstrap interval and its paired F1 difference from sliding-512, both resampling whole articles (the 100
questions come from 22 articles; `metrics.intervals`, 10,000 resamples, seed 0). It also asserts and records the
by-article split, which the committed runs did not record.
Usage: python experiments/e4_intervals.py  (writes experiments/results/e4_intervals.{json,md})
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e4_korquad_articles import BUCKETS, DATA, answer_buckets, dev_articles  # noqa: E402

from longbird.data.corpus import held_out_record  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.files import write_file_atomically  # noqa: E402
from longbird.metrics.intervals import bucket_summary  # noqa: E402
from longbird.sources import resolve_source  # noqa: E402
from longbird.tasks.qa import per_question_scores, sample_questions  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
RUNS = ("e4_korquad_articles_e5", "e4_korquad_articles_e5_reader")
BASELINE = "sliding-512"


def run_intervals(name: str, tokenizer) -> dict:
    committed = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))
    rows, _ = read_korquad_v1_articles(DATA / "korquad" / "KorQuAD_v1.0_dev.json")
    train = sample_questions(split_by_title(rows)["train"], committed["train_questions"])
    dev = dev_articles(committed["dev_questions"])
    buckets = answer_buckets(dev, tokenizer)
    sizes = {bucket: list(buckets.values()).count(bucket) for bucket in BUCKETS}
    assert sizes == committed["dev_bucket_sizes"], (sizes, committed["dev_bucket_sizes"])
    articles = {row["id"]: row["title"] for row in dev}
    scores = {}
    for method, result in committed["methods"].items():
        predictions = json.loads((RESULTS / f"{name}_predictions" / f"{method}.json").read_text(encoding="utf-8"))
        assert set(predictions) == set(articles), method
        scores[method] = per_question_scores(predictions, dev, "korquad1-articles")
        for bucket, expected in result["scores"].items():  # the committed scores, question by question
            ids = [i for i in scores[method] if bucket == "all" or buckets[i] == bucket]
            for metric in ("exact_match", "f1"):
                mean = sum(scores[method][i][metric] for i in ids) / len(ids)
                assert abs(mean - expected[metric]) < 1e-9, (method, bucket, metric, mean, expected[metric])
    return {"held_out": held_out_record(train, dev), "questions": len(dev), "articles": len(set(articles.values())),
            "methods": {method: bucket_summary(per_question, buckets, BUCKETS,
                                               None if method == BASELINE else scores[BASELINE], articles)
                        for method, per_question in scores.items()}}


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_source("multilingual-e5-small"), local_files_only=True)
    report = {"command": "python experiments/e4_intervals.py", "baseline": BASELINE,
              "runs": {name: run_intervals(name, tokenizer) for name in RUNS}}
    lines = [f"Command: `{report['command']}` (from the committed E4 predictions; no model run)  ",
             "Official KorQuAD 1.0 F1 with 95 % bootstrap intervals and the paired F1 difference from sliding-512, "
             "both resampling whole articles (10,000 resamples, seed 0); the scores re-computed per question equal "
             "the committed ones (asserted)."]
    for name, run in report["runs"].items():
        lines += ["", f"**{name}** ({run['questions']} questions of {run['articles']} unseen articles)", "",
                  "| method | " + " | ".join(f"F1 {bucket}" for bucket in ("all", *BUCKETS)) +
                  " | − sliding-512 (all) | − sliding-512 (beyond 512) |", "|---|" + "---:|" * 5]
        for method, summary in run["methods"].items():
            cells = [f"{summary[b]['f1']:.1f} ({summary[b]['f1_interval'][0]:.1f}–{summary[b]['f1_interval'][1]:.1f})"
                     for b in ("all", *BUCKETS)]
            differences = [f"{d['difference']:+.1f} ({d['low']:+.1f} to {d['high']:+.1f})"
                           if (d := summary[b].get("f1_vs_baseline")) else "" for b in ("all", "beyond 512")]
            lines.append(f"| {method} | " + " | ".join(cells + differences) + " |")
    write_file_atomically(RESULTS / "e4_intervals.json", json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    write_file_atomically(RESULTS / "e4_intervals.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
