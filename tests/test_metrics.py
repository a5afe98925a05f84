"""Official QA metrics against hand-computed cases, and classification scores."""

import json
from pathlib import Path

import pytest

from longbird.metrics.classification import accuracy, macro_f1
from longbird.metrics.korquad import (
    f1_korquad_v1,
    f1_korquad_v2,
    f1_squad,
    korquad_v1,
    korquad_v2,
    normalize_korquad_v1,
    normalize_korquad_v2,
    normalize_squad,
    squad_v1,
)

KORQUAD = Path(__file__).resolve().parents[1] / "data" / "korquad"


def v2_dataset(*golds):
    return {"data": [{"title": "t", "qas": [{"id": str(i), "answer": {"text": g}} for i, g in enumerate(golds)]}]}


def v1_dataset(*golds_per_question):
    qas = [{"id": str(i), "answers": [{"text": g} for g in golds]} for i, golds in enumerate(golds_per_question)]
    return {"data": [{"title": "t", "paragraphs": [{"context": "", "qas": qas}]}]}


def test_korquad_v2_normalisation_strips_html_symbols_punctuation_and_all_whitespace():
    assert normalize_korquad_v2('<a href="/wiki/x">신중현</a>') == "신중현"
    assert normalize_korquad_v2("《시나위》 (밴드)") == "시나위밴드"
    assert normalize_korquad_v2("T-X  Program!") == "txprogram"
    assert normalize_korquad_v2("<td>1,000 대</td>") == "1000대"


def test_korquad_v2_scores_html_answers_and_whitespace_differences():
    # The gold is HTML; a plain-text prediction of the same words is an exact match.
    dataset = v2_dataset("<a>신중현</a>", "360대", "1967년 2월 16일")
    predictions = {"0": "신중현", "1": "360 대", "2": "1967년"}
    scores = korquad_v2(predictions, dataset)
    # Q2: prediction chars {1,9,6,7,년} = 5, gold "1967년2월16일" = 10 chars, 5 shared -> P=1, R=.5, F1=2/3.
    assert scores["exact_match"] == pytest.approx(100 * 2 / 3)
    assert scores["f1"] == pytest.approx(100 * (1 + 1 + 2 / 3) / 3)


def test_korquad_v2_empty_strings_and_unanswered_questions():
    assert f1_korquad_v2("", "") == 0.0  # the official script's quirk: no shared characters -> F1 0
    scores = korquad_v2({"0": "", "1": "abc"}, v2_dataset("", "abc", "unanswered"))
    assert scores["exact_match"] == pytest.approx(100 * 2 / 3)  # "" == "" is an exact match
    assert scores["f1"] == pytest.approx(100 / 3)


def test_korquad_v1_keeps_spaces_between_tokens_and_takes_the_best_gold():
    assert normalize_korquad_v1("  대한민국   헌법 ") == "대한민국 헌법"
    assert normalize_korquad_v1("<b>x</b>") == "b x b"  # no HTML stripping in 1.0, only '<' '>' removed
    assert f1_korquad_v1("대한 민국", "대한민국") == 1.0  # characters of the tokens, spaces never count
    scores = korquad_v1({"0": "헌법", "1": "서울"}, v1_dataset(["대한민국 헌법", "헌법"], ["부산"]))
    assert scores == {"exact_match": 50.0, "f1": 50.0}


def test_squad_v1_uses_tokens_and_drops_articles():
    assert normalize_squad("The Cat, a dog!") == "cat dog"
    assert f1_squad("the cat sat", "cat sat down") == pytest.approx(0.8)
    assert squad_v1({"0": "an apple"}, v1_dataset(["Apple"]))["exact_match"] == 100.0


def test_gold_answers_of_the_real_files_score_100():
    v2 = json.loads((KORQUAD / "korquad2.1_dev_00.json").read_text(encoding="utf-8"))
    predictions = {qa["id"]: qa["answer"]["text"] for doc in v2["data"] for qa in doc["qas"]}
    assert korquad_v2(predictions, v2) == {"exact_match": 100.0, "f1": 100.0}
    v1 = json.loads((KORQUAD / "KorQuAD_v1.0_dev.json").read_text(encoding="utf-8"))
    predictions = {qa["id"]: qa["answers"][0]["text"] for a in v1["data"] for p in a["paragraphs"] for qa in p["qas"]}
    assert korquad_v1(predictions, v1) == {"exact_match": 100.0, "f1": 100.0}


def test_empty_dataset_is_an_error():
    with pytest.raises(ValueError, match="no questions"):
        korquad_v2({}, {"data": []})


def test_accuracy_and_macro_f1_by_hand():
    predictions, golds = ["a", "a", "b", "c"], ["a", "b", "b", "b"]
    assert accuracy(predictions, golds) == 0.5
    # F1: a = 2*1/(2+1) = 2/3, b = 2*1/(1+3) = 1/2, c = 0 -> mean 7/18.
    assert macro_f1(predictions, golds) == pytest.approx(7 / 18)
    with pytest.raises(ValueError, match="equally many"):
        accuracy(["a"], ["a", "b"])


def test_bootstrap_intervals_cover_the_mean_and_pair_the_questions():
    from longbird.metrics.intervals import bootstrap_interval, paired_difference

    assert bootstrap_interval([70.0] * 50) == (70.0, 70.0)
    scores = [100.0] * 30 + [0.0] * 70
    low, high = bootstrap_interval(scores)
    assert low < 30.0 < high and high - low < 25.0  # binomial sd at n=100 is ~4.6 points: width ~18
    # Paired: a method that equals the baseline on every question differs by exactly 0, however noisy the scores.
    assert paired_difference(scores, scores) == {"difference": 0.0, "low": 0.0, "high": 0.0}
    better = [100.0] * 40 + [0.0] * 60  # wins 10 questions, loses none
    result = paired_difference(better, scores)
    assert result["difference"] == 10.0 and 0.0 < result["low"] < 10.0 < result["high"]
    with pytest.raises(ValueError, match="same questions"):
        paired_difference(scores, scores[:-1])


def test_wilson_and_newcombe_intervals_reproduce_the_papers_examples():
    """Newcombe (1998) works both by hand: Wilson's score interval of 81/263 (his method 3 example) is 0.2553-0.3662;
    the hybrid score interval of 56/70 - 48/80 (method 10, his example (a)) is 0.0524-0.3339, to four places."""
    from longbird.metrics.intervals import proportion_difference, wilson_interval

    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=5e-5)
    result = proportion_difference(56, 70, 48, 80)
    assert result["difference"] == pytest.approx(0.2) and (result["low"], result["high"]) == pytest.approx(
        (0.0524, 0.3339), abs=5e-5)
    # at the edges, where a bootstrap of the samples collapses to a point, the interval does not
    assert wilson_interval(40, 40)[0] == pytest.approx(0.9124, abs=5e-5) and wilson_interval(40, 40)[1] == 1.0
    assert wilson_interval(0, 40) == (0.0, pytest.approx(0.0876, abs=5e-5))
    with pytest.raises(ValueError, match="0 <= successes <= n"):
        wilson_interval(41, 40)
    with pytest.raises(ValueError, match="n >= 1; got 0 of 0"):
        proportion_difference(0, 0, 1, 2)
    for n in range(1, 200):  # exactly 0 and 1 at the edges (the general formula missed them by ~1e-16)
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0
        assert wilson_interval(0, n)[1] == pytest.approx(1 - wilson_interval(n, n)[0], abs=1e-15)


def test_the_cluster_bootstrap_resamples_whole_articles():
    import numpy as np

    from longbird.metrics.intervals import (
        bootstrap_interval,
        bucket_summary,
        cluster_bootstrap_interval,
        paired_difference,
    )

    rng = np.random.default_rng(3)
    values = rng.choice([0.0, 50.0, 100.0], size=60).tolist()
    # Every question its own article (names sorting in the values' order): the same draws as the question bootstrap.
    # The means differ only by summation order: 60 fp64 terms <= 100, so |error| <= 60 * 100 * 2**-52 per mean.
    singletons = [f"q{i:03d}" for i in range(60)]
    np.testing.assert_allclose(cluster_bootstrap_interval(values, singletons), bootstrap_interval(values),
                               rtol=0, atol=60 * 100 * 2.0 ** -52)
    # Articles of equal size: a draw's question-weighted mean is the mean of its drawn article means, so the interval is
    # the question bootstrap of the article means (the same draws again: 4 articles, 4 indices per draw).
    articles = [f"a{i // 15}" for i in range(60)]
    article_means = [float(np.mean(values[15 * a:15 * a + 15])) for a in range(4)]
    np.testing.assert_allclose(cluster_bootstrap_interval(values, articles), bootstrap_interval(article_means),
                               rtol=0, atol=60 * 100 * 2.0 ** -52)
    # Questions that agree within an article and differ across articles: resampling questions reads the interval far
    # too narrow; resampling articles does not.
    clustered = [100.0] * 30 + [0.0] * 30
    two_articles = ["x"] * 30 + ["y"] * 30
    question_low, question_high = bootstrap_interval(clustered)
    article_low, article_high = cluster_bootstrap_interval(clustered, two_articles)
    assert question_high - question_low < 30.0 and (article_low, article_high) == (0.0, 100.0)
    # Paired, an article-level win shows only as often as that article is drawn.
    paired = paired_difference([100.0] * 30 + [0.0] * 30, [0.0] * 60, clusters=two_articles)
    assert paired["difference"] == 50.0 and paired["low"] == 0.0 and paired["high"] == 100.0
    with pytest.raises(ValueError, match="one cluster per value"):
        cluster_bootstrap_interval(values, articles[:-1])
    # bucket_summary with clusters: intervals over articles, and each bucket's article count.
    ids = [f"q{i}" for i in range(60)]
    scores = {i: {"exact_match": v, "f1": v} for i, v in zip(ids, clustered)}
    summary = bucket_summary(scores, {i: "near" for i in ids}, ["near"], scores, dict(zip(ids, two_articles)))
    assert summary["all"]["articles"] == 2 and summary["all"]["f1_interval"] == (0.0, 100.0)
    assert summary["all"]["f1_vs_baseline"] == {"difference": 0.0, "low": 0.0, "high": 0.0}


def test_per_question_scores_average_to_the_official_score():
    from longbird.tasks.qa import per_question_scores, score_predictions

    rows = [{"id": "a", "answers": {"text": ["신중현"], "answer_start": [0]}},
            {"id": "b", "answers": {"text": ["서울 특별시", "서울"], "answer_start": [0, 0]}},
            {"id": "c", "answers": {"text": ["1,000대"], "answer_start": [0]}}]
    predictions = {"a": "신중현", "b": "서울특별시"}  # c unanswered
    per_question = per_question_scores(predictions, rows, "korquad1-articles")
    official = score_predictions(predictions, rows, "korquad1-articles")
    for metric in ("exact_match", "f1"):
        mean = sum(scores[metric] for scores in per_question.values()) / len(rows)
        assert abs(mean - official[metric]) < 1e-12  # 3 fp64 terms <= 100 summed in another order: ~1e-14
    assert per_question["c"] == {"exact_match": 0.0, "f1": 0.0}
