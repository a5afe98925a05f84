"""E7's protocol (experiments/e7_long_reading.py): dev questions are drawn as whole unseen articles until both
thresholds hold, the held-out record refuses any article on both sides (by title or by text), and the summary's
intervals and paired differences are those of `metrics.intervals` over the right questions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from datasets import Dataset
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

from e7_long_reading import draw_dev_articles, held_out_record, summarise  # noqa: E402

from longbird.conversion import default_source  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.metrics.intervals import bootstrap_interval, paired_difference  # noqa: E402


@pytest.fixture(scope="module")
def split():
    rows, _ = read_korquad_v1_articles(ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json")
    return split_by_title(rows)


def test_dev_questions_are_whole_unseen_articles_meeting_both_thresholds(split):
    tokenizer = AutoTokenizer.from_pretrained(default_source(), local_files_only=True)
    some = sorted(set(split["dev"]["title"]))[:10]  # ten dev articles keep the bucket tokenizing short
    side = split["dev"].filter(lambda row: row["title"] in some)
    dev, buckets = draw_dev_articles(side, tokenizer, 60, 30)
    beyond = sum(bucket == "beyond 512" for bucket in buckets.values())
    assert len(dev) >= 60 and beyond >= 30 and set(buckets) == set(dev["id"])
    titles = set(dev["title"])
    assert len(dev) == sum(title in titles for title in side["title"])  # every question of a drawn article
    # held out from training by held_out_record, whose refusal is tested below: drawn from the dev side, the draw
    # cannot hold a training title, so asserting that here would hold by construction
    again, _ = draw_dev_articles(side, tokenizer, 60, 30)
    assert list(again["id"]) == list(dev["id"])  # seeded
    with pytest.raises(SystemExit, match="fewer than --min-dev-questions 100000"):
        draw_dev_articles(side, tokenizer, 100000, 1)


def test_the_probe_validates_on_dev_articles_outside_the_test_articles(split):
    """e7_conversion_probe.py chooses a conversion on dev-side articles that E7 does not test on: its draw holds no
    test title (the dev side it draws from holds no training title), is seeded, and refuses a dev side with nothing
    left outside the test."""
    from e7_conversion_probe import validation_rows

    titles = sorted(set(split["dev"]["title"]))
    test = set(titles[:5])
    rows = validation_rows(split["dev"], test, 50)
    assert len(rows) == 50 and not set(rows["title"]) & test
    assert list(validation_rows(split["dev"], test, 50)["id"]) == list(rows["id"])
    with pytest.raises(SystemExit, match="no dev-side article is left"):
        validation_rows(split["dev"], set(titles), 50)


def test_the_held_out_record_lists_both_sides_and_refuses_an_overlap(split):
    record = held_out_record(split["train"], split["dev"])
    assert set(record["dev_titles"]) == set(split["dev"]["title"]) and len(record["train_context_sha256"]) > 100
    leaked = Dataset.from_list([split["dev"][0], split["train"][0]])  # one training article among dev questions
    with pytest.raises(AssertionError, match="share 1 titles and 1 articles"):
        held_out_record(split["train"], leaked)
    renamed = Dataset.from_list([{**split["train"][0], "title": "another title"}])
    with pytest.raises(AssertionError, match="share 0 titles and 1 articles"):
        held_out_record(split["train"], renamed)


def test_the_summary_is_bootstrap_intervals_and_paired_differences_per_bucket():
    scores = {f"q{i}": {"exact_match": 100.0 * (i % 2), "f1": float(10 * i)} for i in range(8)}
    baseline = {f"q{i}": {"exact_match": 0.0, "f1": float(5 * i)} for i in range(8)}
    buckets = {f"q{i}": "first 512" if i < 3 else "beyond 512" for i in range(8)}
    summary = summarise(scores, buckets, baseline)
    beyond = [f"q{i}" for i in range(3, 8)]
    assert summary["beyond 512"]["questions"] == 5 and summary["all"]["questions"] == 8
    assert summary["beyond 512"]["f1"] == sum(10 * i for i in range(3, 8)) / 5
    assert summary["beyond 512"]["f1_interval"] == bootstrap_interval([scores[i]["f1"] for i in beyond])
    assert summary["beyond 512"]["f1_vs_baseline"] == paired_difference([scores[i]["f1"] for i in beyond],
                                                                         [baseline[i]["f1"] for i in beyond])
    assert "f1_vs_baseline" not in summarise(scores, buckets, None)["all"]


def test_a_row_that_rereads_another_rows_model_trains_exactly_like_it():
    from e7_long_reading import METHODS

    for name, method in METHODS.items():
        if method.trained_by:
            trainer = METHODS[method.trained_by]
            assert trainer.trained_by is None, name  # one hop: the trainer trains
            if method.reconverted:  # the trainer's model converted again: another conversion, never a copy
                assert (method.preset, method.length, method.overrides) != (trainer.preset, trainer.length,
                                                                            trainer.overrides), name
                assert not method.untrained and not method.teacher, name
                continue
            assert trainer[:6] == method[:6], name  # same conversion, training windows and teacher
            assert trainer.padding_insertion == method.padding_insertion, name
            assert trainer.reading != method.reading, name  # else it is the same row twice
    assert not any(m.reconverted and not m.trained_by for m in METHODS.values())  # reconverting needs a trainer


def test_the_per_article_table_averages_each_articles_questions_shortest_first():
    from e7_long_reading import by_article

    per_question = {"sliding-512": {"a1": 100.0, "a2": 50.0, "b1": 0.0}, "kobigbird-1k": {"a1": 0.0, "a2": 0.0,
                                                                                         "b1": 80.0}}
    results = {"dev_article_tokens": {"long": 3000, "short": 700},
               "dev_question_article": {"a1": "long", "a2": "long", "b1": "short"},
               "methods": {name: {"per_question": {i: {"f1": f1} for i, f1 in scores.items()}}
                           for name, scores in per_question.items()}}
    lines = by_article(results)
    rows = [line for line in lines if line.startswith("| short") or line.startswith("| long")]
    assert rows == ["| short | 700 | 1 | 0.0 | 80.0 |", "| long | 3,000 | 2 | 75.0 | 0.0 |"]
    assert by_article({"methods": {}}) == []  # results written before the field existed


def _results_file(path, rows, held_out=None):
    """A minimal E7 results file: rows {method: (budget minutes, {question: f1})}."""
    import json

    methods = {}
    for method, (minutes, scores) in rows.items():
        summary = {bucket: {"f1": sum(scores.values()) / len(scores), "f1_interval": [0.0, 100.0]}
                   for bucket in ("all", "first 512", "beyond 512")}
        methods[method] = {"cpu_budget": {"minutes": minutes, "cpu_seconds": 60.0 * minutes, "steps": 3 * minutes},
                           "tokens_seen": 100 * minutes, "summary": summary,
                           "per_question": {q: {"f1": f1} for q, f1 in scores.items()}}
    path.write_text(json.dumps({"methods": methods, "held_out": held_out or {"dev_titles": ["a"]},
                                "machine": {"summary": "file", "matmul_tflops": {}}}))
    return path


def test_learning_curves_pair_each_point_with_the_baseline_at_its_budget(tmp_path, monkeypatch):
    import json

    import e7_learning_curves

    questions = [f"q{i}" for i in range(6)]
    base = {q: 50.0 for q in questions}
    better = {q: 50.0 + 10 * (i % 2) for i, q in enumerate(questions)}  # +5 on average
    first = _results_file(tmp_path / "a.json", {"sliding": (30, base), "long": (30, better)})
    second = _results_file(tmp_path / "b.json", {"sliding": (60, better), "long": (60, base)})
    monkeypatch.setattr(sys, "argv", ["x", "--curve", f"sliding={first}:sliding,{second}:sliding",
                                      "--curve", f"long={second}:long,{first}:long", "--out", str(tmp_path)])
    e7_learning_curves.main()
    record = json.loads((tmp_path / "e7_learning_curves.json").read_text())
    long_curve = record["curves"]["long"]
    assert [point["budget_minutes"] for point in long_curve] == [30, 60]  # sorted by budget
    assert long_curve[0]["paired_vs_baseline"]["difference"] == pytest.approx(5.0)
    assert long_curve[1]["paired_vs_baseline"]["difference"] == pytest.approx(-5.0)
    assert all(point["paired_vs_baseline"] is None for point in record["curves"]["sliding"])
    assert (tmp_path / "e7_learning_curves.png").stat().st_size > 0
    assert "| long | 30 |" in (tmp_path / "e7_learning_curves.md").read_text()

    other = _results_file(tmp_path / "c.json", {"long": (90, base)}, held_out={"dev_titles": ["b"]})
    monkeypatch.setattr(sys, "argv", ["x", "--curve", f"sliding={first}:sliding", "--curve", f"long={other}:long",
                                      "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="another held-out split"):
        e7_learning_curves.main()


def test_a_row_trains_with_padding_insertion_exactly_when_it_says_so(monkeypatch, tmp_path):
    """The round-7 LittleBird row trains like the baseline (512-token windows, stride 128, the same batch and budget)
    except for Padding Insertion, which reaches the trainer's settings; the baseline trains without it."""
    import argparse

    import e7_long_reading

    seen = {}

    def fake_finetune(start, train, run_dir, **kwargs):
        seen[run_dir.name] = (kwargs["settings"], kwargs["window_length"], kwargs["doc_stride"])
        return {"log_history": [], "cpu_budget": {}, "tokens_seen": 0, "training_windows": 0, "windows": 0}

    monkeypatch.setattr(e7_long_reading, "finetune_qa", fake_finetune)
    args = argparse.Namespace(batch_tokens=16 * 512, long_batch_size=4, learning_rate=5e-5, max_steps=10, bf16=False,
                              cpu_minutes=1.0, negative_fraction=0.1, teacher_weight=1.0, seed=3)
    for name in ("sliding-512", "littlebird-short-pi"):
        e7_long_reading.train_method(name, tmp_path, None, tmp_path / name, args, tmp_path)
    baseline, littlebird = seen["sliding-512"], seen["littlebird-short-pi"]
    assert littlebird[0].padding_insertion and not baseline[0].padding_insertion
    assert littlebird[0].seed == baseline[0].seed == 3  # --seed is every row's training seed
    assert littlebird[1:] == baseline[1:] == (512, 128) and littlebird[0].batch_size == baseline[0].batch_size == 16
    assert e7_long_reading.METHODS["littlebird-short-pi"].reading == (4096, 1024)


def test_the_table_header_names_each_machine_with_its_rows_when_rows_ran_apart():
    from e7_long_reading import provenance

    fast, slow = {"summary": "Xeon, bf16 2.083 TFLOP/s"}, {"summary": "Xeon, bf16 0.714 TFLOP/s"}
    one = {"command": "c", "machine": fast, "methods": {"a": {"machine": fast}, "b": {"machine": fast}}}
    assert provenance(one) == ["Command: `c`  ", "Machine: Xeon, bf16 2.083 TFLOP/s  "]
    # a row added with --resume at another rate: the header's machine alone (the last run's) would mislabel the others
    two = {"command": "c", "machine": slow,
           "methods": {"a": {"machine": fast}, "b": {"machine": fast}, "c": {"machine": slow}}}
    assert provenance(two)[1] == "Machines: Xeon, bf16 2.083 TFLOP/s (a, b); Xeon, bf16 0.714 TFLOP/s (c)  "
    diagnosis = {"command": "c", "machine": fast, "readers": {"a": {}}}  # e7_diagnosis's results: one run
    assert provenance(diagnosis)[1] == "Machine: Xeon, bf16 2.083 TFLOP/s  "


def test_all_dev_halves_and_cross_fitting_never_let_a_question_choose_its_own_setting():
    from e7_all_dev import cross_fitted, halves

    titles = [f"article {i}" for i in range(7)]
    half_of_title = halves(titles, seed=0)
    assert sorted(half_of_title) == sorted(titles) and sorted(half_of_title.values()) == [0, 0, 0, 1, 1, 1, 1]
    assert halves(list(reversed(titles)), seed=0) == half_of_title  # by title, not by the order given
    assert halves(titles, seed=1) != half_of_title
    # Two settings: "a" wins every question of half 0, "b" every question of half 1. Cross-fitted, each half takes the
    # setting the *other* half prefers, so both halves read with the setting that loses on them.
    half_of = {"q0": 0, "q1": 0, "q2": 1, "q3": 1}
    win, lose = {"exact_match": 100.0, "f1": 100.0}, {"exact_match": 0.0, "f1": 0.0}
    by_setting = {"a": {"q0": win, "q1": win, "q2": lose, "q3": lose},
                  "b": {"q0": lose, "q1": lose, "q2": win, "q3": win}}
    merged, chosen = cross_fitted(by_setting, half_of)
    assert chosen == {0: "b", 1: "a"} and all(merged[q] == lose for q in half_of)
    # A tie on the other half goes to the first setting (no prior first in the script's order).
    tied = {"none": {q: win for q in half_of}, "x": {q: win for q in half_of}}
    assert cross_fitted(tied, half_of)[1] == {0: "none", 1: "none"}


def test_the_near_reading_keeps_only_the_512_article_tokens_around_each_answer(korean_tokenizer):
    from conftest import korquad1_dev_questions
    from e7_diagnosis import NEAR_AFTER, NEAR_BEFORE, near_features

    from longbird.data.features import features_for_rows

    rows = korquad1_dev_questions(40)  # 10 questions over several whole articles, most past one window
    features = features_for_rows(korean_tokenizer, rows, 512, 128, with_labels=False)
    kept, allowed = near_features(list(reversed(features)), rows)  # grouping by question, whatever the order
    assert len(kept) == len(allowed) and 0 < len(kept) < len(features)
    for row in rows:
        windows = [(f, m) for f, m in zip(kept, allowed) if f.example_id == row["id"]]
        every = [f for f in features if f.example_id == row["id"]]
        article_tokens = sorted({o for f in every for o in f.offsets if o is not None})
        starts = sorted({f.offsets[i] for f, m in windows for i in m.nonzero().flatten().tolist()})
        # the allowed starts are consecutive article tokens, NEAR_BEFORE + 1 + NEAR_AFTER of them where the article
        # has that many on both sides, and they hold the answer's first character
        first, last = article_tokens.index(starts[0]), article_tokens.index(starts[-1])
        assert starts == article_tokens[first:last + 1]
        holding = next(i for i, (_, end) in enumerate(article_tokens) if end > row["answers"]["answer_start"][0])
        assert first == max(0, holding - NEAR_BEFORE)
        assert last == min(len(article_tokens) - 1, holding + NEAR_AFTER)
        # every window with an allowed start is kept, every window without one dropped; nothing outside the article
        assert all(m.any() for _, m in windows)
        assert all(f.offsets[i] is not None for f, m in windows for i in m.nonzero().flatten().tolist())
        dropped = [f for f in every if all(f is not k for k, _ in windows)]
        assert all(not any(o is not None and starts[0][0] <= o[0] and o[1] <= starts[-1][1] for o in f.offsets)
                   for f in dropped)


def test_the_paragraph_readings_read_the_paragraph_alone_then_with_the_article_around_it(korean_tokenizer):
    from conftest import KORQUAD, korquad1_dev_questions
    from e7_paragraph_cuts import (
        first_windows,
        from_paragraph_rows,
        in_article_windows,
        paragraph_ranges,
        paragraph_rows,
    )

    from longbird.data.features import features_for_rows
    from longbird.data.korquad import read_squad_paragraphs

    rows = korquad1_dev_questions(40)
    ranges = paragraph_ranges(KORQUAD / "KorQuAD_v1.0_dev.json")
    published = {row["id"]: row for row in read_squad_paragraphs(KORQUAD / "KorQuAD_v1.0_dev.json")[0]}
    own = paragraph_rows(rows, ranges)
    for row, alone in zip(rows, own):  # the range is the published paragraph; its answers stay on their text
        assert alone["context"] == published[row["id"]]["context"]
        assert alone["answers"] == published[row["id"]]["answers"]
    assert any(r["answers"]["answer_start"][0] != p["answers"]["answer_start"][0] for r, p in zip(rows, own))

    # paragraph-first: the windows the paragraph alone gets, the same article tokens allowed in each, the rest of
    # each window filled with the text after the paragraph instead of padding
    lengths = {r["id"]: len(r["context"]) for r in own}
    alone_windows = features_for_rows(korean_tokenizer, own, 512, 128, with_labels=False)
    first, allowed = first_windows(features_for_rows(korean_tokenizer, from_paragraph_rows(rows, ranges), 512, 128,
                                                     with_labels=False), lengths)
    for row in rows:
        expected = [[o for o in f.offsets if o is not None] for f in alone_windows if f.example_id == row["id"]]
        got = [[f.offsets[i] for i in m.nonzero().flatten().tolist()] for f, m in zip(first, allowed)
               if f.example_id == row["id"]]
        assert got == expected
    assert any(len([o for o in f.offsets if o is not None]) > len(m.nonzero()) for f, m in zip(first, allowed))

    # paragraph-in-article: every article window holding part of the paragraph, only the paragraph's tokens allowed
    features = features_for_rows(korean_tokenizer, rows, 512, 128, with_labels=False)
    kept, allowed = in_article_windows(features, ranges)
    for feature in features:
        low, high = ranges[feature.example_id]
        inside = [o is not None and low <= o[0] and o[1] <= high for o in feature.offsets]
        matches = [m for f, m in zip(kept, allowed) if f is feature]
        assert (matches[0].tolist() == inside) if any(inside) else not matches
    assert 0 < len(kept) < len(features)


def test_paragraph_windows_start_at_paragraphs_and_score_every_article_token(korean_tokenizer):
    from conftest import KORQUAD, korquad1_dev_questions
    from e7_paragraph_cuts import article_paragraphs
    from e7_paragraph_windows import paragraph_windows

    from longbird.data.features import features_for_rows

    rows = korquad1_dev_questions(100)[:3]
    paragraphs = {title: [span for span, _ in spans]
                  for title, spans in article_paragraphs(KORQUAD / "KorQuAD_v1.0_dev.json").items()}
    windows, allowed = paragraph_windows(
        lambda parts, stride: features_for_rows(korean_tokenizer, parts, 512, stride, with_labels=False),
        rows, paragraphs, 128)
    sliding = features_for_rows(korean_tokenizer, rows, 512, 128, with_labels=False)
    for row in rows:
        article = row["context"]
        assert "\n\n".join(article[low:high] for low, high in paragraphs[row["title"]]) == article
        mine = [(f, m) for f, m in zip(windows, allowed) if f.example_id == row["id"]]
        starts = {low for low, _ in paragraphs[row["title"]]}
        # every window opens on its paragraph's first token (or continues a paragraph longer than a window) ...
        firsts = [next(o for o in f.offsets if o is not None)[0] for f, _ in mine]
        assert starts <= set(firsts) and len(firsts) >= len(starts)
        # ... its offsets point into the whole article at the same tokens (by their last character: a paragraph's
        # first token does not own the separator before it, as it does in the article's own windows) ...
        ends = {o[1] for f, _ in mine for o in f.offsets if o is not None}
        article_ends = {o[1] for f in sliding if f.example_id == row["id"] for o in f.offsets if o is not None}
        assert ends == article_ends
        # ... and the allowed starts cover every article token, each inside the window's own paragraph
        allowed_ends = [f.offsets[i][1] for f, m in mine for i in m.nonzero().flatten().tolist()]
        assert set(allowed_ends) == article_ends
        for f, m in mine:
            first = next(o for o in f.offsets if o is not None)[0]
            low, high = max((p for p in paragraphs[row["title"]] if p[0] <= first), key=lambda p: p[0])
            assert all(low <= f.offsets[i][0] and f.offsets[i][1] <= high for i in m.nonzero().flatten().tolist())


def test_headroom_choices_take_the_gold_paragraphs_best_ranked_answer_and_the_shortlists_best():
    from e7_headroom import choices

    from longbird.qa import Answer

    context = "부산은 항구 도시이다. 서울특별시는 한국의 수도이다."
    second = context.index("서울")  # the second paragraph starts here

    def answer(text: str, score: float) -> Answer:
        start = context.index(text)
        return Answer(text, start, start + len(text), score, 0, None)

    rows = [{"id": "q1", "title": "t", "question": "한국의 수도는?", "context": context,
             "answers": {"text": ["서울"], "answer_start": [second]}},
            {"id": "q2", "title": "t", "question": "항구 도시는?", "context": context,
             "answers": {"text": ["부산"], "answer_start": [0]}}]
    filler = [answer(w, 1.0 - i / 10) for i, w in enumerate(("항구", "도시", "한국", "수도", "이다"))]
    ranked = {"q1": [answer("부산", 9.0), answer("서울특별시", 8.0), *filler, answer("서울", 0.0)],
              "q2": [answer("서울", 5.0), answer("부산", 4.0)]}
    gold_paragraph = {"q1": 1, "q2": 0}
    starts_of = {"q1": [0, second], "q2": [0, second]}
    out = choices(ranked, rows, gold_paragraph, starts_of)
    f1 = {choice: {q: s["f1"] for q, s in scores.items()} for choice, scores in out.items()}
    assert f1["default"] == {"q1": 0.0, "q2": 0.0}
    # q1: the best-ranked answer inside the gold paragraph is the longer span, not the exact one ranked last
    assert f1["its paragraph"]["q2"] == 100.0 and 0.0 < f1["its paragraph"]["q1"] < 100.0
    # the exact answer is ranked 8th: outside the top 5, inside the top 20
    assert f1["best of top 5"] == {"q1": f1["its paragraph"]["q1"], "q2": 100.0}
    assert f1["best of top 20"] == {"q1": 100.0, "q2": 100.0}
    # no answer in the gold paragraph scores 0, not the reader's answer elsewhere
    out = choices({"q1": [answer("부산", 9.0)], "q2": [answer("부산", 4.0)]}, rows, gold_paragraph, starts_of)
    assert out["its paragraph"]["q1"]["f1"] == 0.0


def test_seed_arms_average_each_question_over_their_readings_and_pair_with_the_baseline_arm_over_articles():
    import argparse

    from e7_seeds import arm_mean, compare_arms, parse_arm

    def scores(f1s: list[float]) -> dict[str, dict[str, float]]:
        return {f"q{i}": {"exact_match": 100.0 * (f == 100.0), "f1": f} for i, f in enumerate(f1s)}

    article_of = {"q0": "a", "q1": "a", "q2": "b", "q3": "c"}
    buckets = {"q0": "first 512", "q1": "beyond 512", "q2": "first 512", "q3": "beyond 512"}
    base = [scores([100.0, 0.0, 50.0, 100.0]), scores([0.0, 0.0, 50.0, 100.0])]
    other = [scores([100.0, 100.0, 50.0, 100.0]), scores([100.0, 0.0, 0.0, 100.0])]
    assert arm_mean(base) == {"q0": {"exact_match": 50.0, "f1": 50.0}, "q1": {"exact_match": 0.0, "f1": 0.0},
                              "q2": {"exact_match": 0.0, "f1": 50.0}, "q3": {"exact_match": 100.0, "f1": 100.0}}
    out = compare_arms({"base": base, "other": other}, buckets, article_of)
    # the mean over seeds per question, then over questions: base 50.0, other (100+50+25+100)/4 = 68.75
    assert out["base"]["summary"]["all"]["f1"] == pytest.approx(50.0)
    assert out["other"]["summary"]["all"]["f1"] == pytest.approx(68.75)
    paired = out["other"]["summary"]["all"]["f1_vs_baseline"]
    assert paired == paired_difference([100.0, 50.0, 25.0, 100.0], [50.0, 0.0, 50.0, 100.0],
                                       clusters=["a", "a", "b", "c"])
    assert "f1_vs_baseline" not in out["base"]["summary"]["all"]
    # by answer position: first 512 holds q0 and q2 ((100 - 50) + (25 - 50)) / 2
    assert out["other"]["summary"]["first 512"]["f1_vs_baseline"]["difference"] == pytest.approx(12.5)
    # each further seed against its arm's first: base's second seed loses 100 on q0 alone
    assert out["base"]["seeds"][0]["vs_first"] is None
    assert out["base"]["seeds"][1]["vs_first"]["difference"] == pytest.approx(-25.0)
    assert [s["f1"] for s in out["other"]["seeds"]] == [87.5, 50.0]
    with pytest.raises(ValueError, match="different questions"):
        arm_mean([scores([1.0, 2.0]), scores([1.0])])
    assert parse_arm("layout=r0,r1") == ("layout", ["r0", "r1"])
    for bad in ("layout", "layout=", "=r0", "layout=r0,r0"):
        with pytest.raises(argparse.ArgumentTypeError, match="--arm"):
            parse_arm(bad)


def test_the_results_record_the_budget_of_either_kind_of_trained_row(tmp_path):
    """A layout row (e7_paragraph_training.py's record) and a sliding baseline (`finetune-qa --cpu-minutes`'s summary)
    both reach the results with their budget, updates and tokens (a --max-steps run: its updates from the log); a model
    without a training record records nothing."""
    import json

    from e7_paragraph_layout import training_record

    layout, sliding, untrained = (tmp_path / name for name in ("layout", "sliding", "untrained"))
    for directory in (layout, sliding, untrained):
        directory.mkdir()
    (layout / "longbird_finetune.json").write_text(json.dumps(
        {"cpu_budget_minutes": 90, "cpu_seconds": 5400.2, "updates": 190, "questions": 789, "tokens_seen": 9_000_000,
         "layout": "global"}))
    (sliding / "longbird_finetune.json").write_text(json.dumps(
        {"task": "qa", "source_model": {"model": "qa-model/kobigbird-e5-korquad"},
         "metrics": {"train_runtime": 2700.0, "tokens_seen": 4_700_000,
                     "cpu_budget": {"minutes": 90, "cpu_seconds": 5399.0, "steps": 577}}}))
    assert training_record(layout) == {"cpu_budget_minutes": 90, "cpu_seconds": 5400.2, "updates": 190,
                                       "questions": 789, "tokens_seen": 9_000_000, "layout": "global"}
    assert training_record(sliding) == {"cpu_budget_minutes": 90, "cpu_seconds": 5399.0, "updates": 577,
                                        "tokens_seen": 4_700_000, "started_from": "qa-model/kobigbird-e5-korquad"}
    assert training_record(untrained) == {}
    stepped = tmp_path / "stepped"  # trained by --max-steps: no budget, its updates from the log
    stepped.mkdir()
    (stepped / "longbird_finetune.json").write_text(json.dumps(
        {"task": "qa", "metrics": {"tokens_seen": 6_000_000}, "log_history": [{"step": 384, "loss": 1.0},
                                                                              {"step": 769, "loss": 0.9}]}))
    assert training_record(stepped) == {"updates": 769, "tokens_seen": 6_000_000}
