"""A cross-window ranking learned for each reader, cross-fitted over article halves (E7 round 24, no model run).

The library ranks a question's candidates from every window (or every segment of a layout) by one fixed rule: the
span's score (start logit + log P(end | start)) minus its window's or region's null start logit (`null-relative`),
plus 0.3 × the BM25 of the passage around the span's start (the lexical prior, radius 64). Rounds 18 and 24 found the
readers losing most of what separates them from reading the answer's own paragraph in that ranking. Here each reader
gets the ranking's weights learned for it: a candidate's score is

    raw + w_null · (−null logit) + w_norm · (−logsumexp of its region's start logits)
        + w_64 · BM25(radius 64) + w_256 · BM25(radius 256) + w_lead · [the span starts in the first paragraph]

(the library's rule is w = (1, 0, 0.3, 0, 0)). The weights (and a softmax temperature, which does not change the
ranking) are fitted on one half of the dev-side articles (round 17's seed-0 halves, as `--cross-fit` uses) by the
expected F1 of the softmax over the question's candidates, −log Σ p(c) F1(c), and applied to the other half, so no
question's weights saw it, and every reader gets the same treatment: what `--cross-fit` does for the lexical prior
alone, with five weights. The candidates are those `e7_paragraph_layout.py --keep-candidates` saved.

Usage: python experiments/e7_learned_ranking.py --candidates experiments/runs/e7_round24/candidates \
           --baseline sliding-512-90min --readings global-s6-bm25-90min global-s6-bm25-carry-90min
Writes experiments/results/NAME.{json,md} (default e7_learned_ranking).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e4_korquad_articles import BUCKETS, answer_buckets  # noqa: E402
from e7_all_dev import halves  # noqa: E402
from e7_long_reading import held_out_record, write_tables  # noqa: E402
from e7_paragraph_cuts import DATA, article_paragraphs  # noqa: E402
from lexical_prior import scores_with  # noqa: E402

from longbird.checkpoints import load_task_model  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.lexical_prior import LexicalPrior  # noqa: E402
from longbird.metrics.intervals import bucket_summary  # noqa: E402
from longbird.metrics.korquad import f1_korquad_v1  # noqa: E402
from longbird.qa import _answer_bounds  # noqa: E402

FEATURES = ("null", "normaliser", "bm25-64", "bm25-256", "lead")
LIBRARY = (1.0, 0.0, 0.3, 0.0, 0.0)  # the library's default decoding in these features
BUILT_IN = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])  # what rank_answers adds itself: the null-relative offset


def window_features(window, start: int, bm25_64, bm25_256, lead_end: int) -> list[float]:
    """The five features (FEATURES) of a span of `window` starting at token `start`."""
    return [window.offset("null-relative", start), window.offset("log-probability", start),
            bm25_64(window.feature, start), bm25_256(window.feature, start),
            float(window.feature.offsets[start][0] < lead_end)]


def question_candidates(windows, documents, rows, special_ids: frozenset[int],
                        lead_end: dict[str, int]) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per question: every decoded span's raw score (n,), its features (n, 5) and its F1 against the gold answers
    (n,), 0-100, the span read as `rank_answers` reads it (edge spaces dropped)."""
    by_question: dict[str, list] = {}
    for window in windows:
        by_question.setdefault(window.feature.example_id, []).append(window)
    out = {}
    for row in rows:
        mine = by_question[row["id"]]
        features = [w.feature for w in mine]
        bm25_64 = LexicalPrior(1.0, 64, special_ids).for_question(features)
        bm25_256 = LexicalPrior(1.0, 256, special_ids).for_question(features)
        text, golds = documents[row["id"]].text, row["answers"]["text"]
        raw, values, f1 = [], [], []
        for window in mine:
            for score, start, end in window.spans:
                begin, finish = _answer_bounds(text, window.feature.offsets[start][0],
                                                     window.feature.offsets[end][1])
                raw.append(score)
                values.append(window_features(window, start, bm25_64, bm25_256, lead_end[row["id"]]))
                f1.append(100 * max(f1_korquad_v1(text[begin:finish], gold) for gold in golds))
        out[row["id"]] = (torch.tensor(raw, dtype=torch.float64), torch.tensor(values, dtype=torch.float64),
                          torch.tensor(f1, dtype=torch.float64))
    return out


def fit(candidates: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], steps: int = 300) -> list[float]:
    """The weights that maximise Σ_questions log Σ_c softmax(score / τ)_c F1_c over `candidates` (questions whose
    candidates all score F1 0 carry no signal and are left out), from the library's weights, by L-BFGS."""
    kept = [c for c in candidates if c[2].max() > 0]
    if not kept:
        raise ValueError("no question has a candidate with F1 above 0 to fit the ranking on")
    width = max(len(raw) for raw, _, _ in kept)
    raw = torch.full((len(kept), width), 0.0, dtype=torch.float64)
    values = torch.zeros(len(kept), width, len(FEATURES), dtype=torch.float64)
    gain = torch.zeros(len(kept), width, dtype=torch.float64)
    real = torch.zeros(len(kept), width, dtype=torch.bool)
    for row, (r, v, f1) in enumerate(kept):  # one padded row per question: the padding is outside every softmax
        raw[row, :len(r)], values[row, :len(r)], gain[row, :len(r)], real[row, :len(r)] = r, v, f1 / 100, True
    weights = torch.tensor(LIBRARY, dtype=torch.float64, requires_grad=True)
    log_temperature = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.LBFGS([weights, log_temperature], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optimiser.zero_grad()
        score = ((raw + values @ weights) / log_temperature.exp()).masked_fill(~real, float("-inf"))
        log_p = torch.log_softmax(score, 1)
        loss = -torch.logsumexp((log_p + torch.log(gain + 1e-9)).masked_fill(~real, float("-inf")), 1).mean()
        loss.backward()
        return loss

    optimiser.step(closure)
    return weights.detach().tolist()


@dataclasses.dataclass
class LearnedRanking:
    """`weights` (FEATURES) as what `rank_answers` adds to a span's null-relative score: duck-types `LexicalPrior`
    (`weight`, `for_question`)."""

    weights: list[float]
    windows: dict[int, object]  # id(feature) -> its WindowCandidates, for the offsets
    special_ids: frozenset[int]
    lead_end: dict[str, int]
    weight: float = 1.0  # rank_answers skips a prior whose weight is 0

    def for_question(self, features):
        bm25_64 = LexicalPrior(1.0, 64, self.special_ids).for_question(features)
        bm25_256 = LexicalPrior(1.0, 256, self.special_ids).for_question(features)
        extra = torch.tensor(self.weights, dtype=torch.float64) - BUILT_IN.double()
        end = self.lead_end[features[0].example_id]

        def prior(feature, start: int) -> float:
            values = window_features(self.windows[id(feature)], start, bm25_64, bm25_256, end)
            return float(torch.tensor(values, dtype=torch.float64) @ extra)

        return prior


def cross_fitted_ranking(windows, documents, rows, special_ids, lead_end, half_of: dict[str, int]):
    """Per-question scores with each half ranked by the weights fitted on the other half, and those weights."""
    candidates = question_candidates(windows, documents, rows, special_ids, lead_end)
    by_id = {id(w.feature): w for w in windows}
    scores, chosen = {}, {}
    for half in (0, 1):
        chosen[half] = fit([c for q, c in candidates.items() if half_of[q] != half])
        mine = [row for row in rows if half_of[row["id"]] == half]
        ids = {row["id"] for row in mine}
        scores.update(scores_with([w for w in windows if w.feature.example_id in ids], documents, mine,
                                  LearnedRanking(chosen[half], by_id, special_ids, lead_end)))
    return {row["id"]: scores[row["id"]] for row in rows}, chosen


def table(results: dict) -> list[str]:
    lines = [f"Command: `{results['command']}`", "",
             f"{results['questions']} dev-side questions of {results['articles']} articles; each reading ranked with "
             "the library's rule (`default`) and with the weights learned on the other half of the articles "
             "(`learned`); paired differences against "
             f"`{results['baseline']}` with the same ranking, intervals over articles.", "",
             "| reading | ranking | F1 | first 512 / beyond 512 | − baseline (95 % CI) | beyond 512 − baseline |",
             "|---|---|---:|---:|---:|---:|"]
    for name, by_ranking in results["readings"].items():
        for ranking, summary in by_ranking.items():
            all_, beyond = summary["all"], summary.get("beyond 512", {})
            paired = all_.get("f1_vs_baseline")
            far = beyond.get("f1_vs_baseline")
            low, high = all_["f1_interval"]
            lines.append(
                f"| {name} | {ranking} | {all_['f1']:.1f} ({low:.1f}–{high:.1f}) | "
                + " / ".join(f"{summary[b]['f1']:.1f}" for b in BUCKETS if b in summary)
                + "".join(f" | {d['difference']:+.1f} ({d['low']:+.1f} to {d['high']:+.1f})" if d else " | "
                          for d in (paired, far)) + " |")
    lines += ["", "Learned weights (" + ", ".join(FEATURES) + f"; the library's: {LIBRARY}), halves 0 / 1:"]
    lines += [f"- `{name}`: " + " / ".join("(" + ", ".join(f"{w:.2f}" for w in weights[str(h)]) + ")"
                                         for h in (0, 1)) for name, weights in results["weights"].items()]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=Path, required=True, help="The --keep-candidates directory")
    parser.add_argument("--baseline", required=True, help="The reading every other is paired with (NAME.pt)")
    parser.add_argument("--readings", nargs="+", required=True, help="Other readings kept there (NAME.pt)")
    parser.add_argument("--reader", type=Path, default=ROOT / "qa-model" / "kobigbird-e5-korquad",
                        help="The paragraph reader, for its tokenizer (special tokens, answer buckets)")
    parser.add_argument("--name", default="e7_learned_ranking")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    args = parser.parse_args()
    rows, _ = read_korquad_v1_articles(DATA)
    split = split_by_title(rows)
    dev = list(split["dev"])
    titles = sorted({row["title"] for row in dev})
    half_of_title = halves(titles, 0)
    tokenizer = load_task_model(args.reader, LongBirdForQuestionAnswering)[1]
    special = frozenset(tokenizer.all_special_ids)
    spans = article_paragraphs(DATA)
    lead_end = {row["id"]: spans[row["title"]][0][0][1] for row in dev}
    article_of = {row["id"]: row["title"] for row in dev}
    per, weights = {}, {}
    for name in [args.baseline] + args.readings:
        kept = torch.load(args.candidates / f"{name}.pt", weights_only=False)
        read = [row for row in dev if row["id"] in kept["documents"]]
        assert {row["id"] for row in read} == set(kept["documents"]), f"{name}: candidates beyond the dev side"
        half_of = {row["id"]: half_of_title[row["title"]] for row in read}
        default = LexicalPrior(LIBRARY[2], 64, special)
        per[name] = {"default": scores_with(kept["windows"], kept["documents"], read, default)}
        per[name]["learned"], chosen = cross_fitted_ranking(kept["windows"], kept["documents"], read, special,
                                                            lead_end, half_of)
        weights[name] = {str(h): w for h, w in chosen.items()}
        print(name, {k: round(sum(s["f1"] for s in v.values()) / len(v), 2) for k, v in per[name].items()},
              weights[name], flush=True)
    questions = set.intersection(*(set(p["default"]) for p in per.values()))
    read = [row for row in dev if row["id"] in questions]
    buckets = answer_buckets(read, tokenizer)
    results = {"command": "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
               "held_out": held_out_record(split["train"], split["dev"]),
               "questions": len(read), "articles": len({row["title"] for row in read}), "baseline": args.baseline,
               "features": FEATURES, "library_weights": LIBRARY, "weights": weights, "article_of": article_of,
               "readings": {}}
    for name, by_ranking in per.items():
        results["readings"][name] = {
            ranking: {**bucket_summary(s, buckets, BUCKETS, None if name == args.baseline
                                       else per[args.baseline][ranking], article_of), "per_question": s}
            for ranking, s in by_ranking.items()}
    write_tables(args.out, args.name, results, table(results))
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
