"""The lexical prior (lexical_prior.py): BM25 of the passage around a span, added to its score across windows."""

import math

import numpy as np
import pytest
from conftest import korquad1_dev_questions
from rank_bm25 import BM25Okapi

from longbird.data.features import features_for_rows
from longbird.lexical_prior import LexicalPrior, PassageScorer, document_sequence, question_tokens
from longbird.qa import SCORING_RULES, WindowCandidates, merge_windows, rank_answers


@pytest.fixture(scope="module")
def article():
    return korquad1_dev_questions(40)[0]


def windows_of(tokenizer, row, max_length=128, stride=32):
    cache = {}
    features = features_for_rows(tokenizer, [row], max_length, stride, with_labels=False, documents=cache)
    return features, {row["id"]: cache[(row["context"], row["is_html"])]}


def test_the_document_rebuilt_from_overlapping_windows_is_the_tokenized_document(korean_tokenizer, article):
    features, documents = windows_of(korean_tokenizer, article)
    assert len(features) > 3  # the windows overlap: every inner token is read twice
    document, place = document_sequence(features)
    expected = korean_tokenizer(documents[article["id"]].text, add_special_tokens=False)["input_ids"]
    assert document.tolist() == expected
    assert sorted(place.values()) == list(range(len(expected)))


def test_the_question_is_what_precedes_the_document_without_special_tokens(korean_tokenizer, article):
    features, _ = windows_of(korean_tokenizer, article)
    question = korean_tokenizer(article["question"], add_special_tokens=False)["input_ids"]
    for feature in (features[0], features[-1]):
        assert question_tokens(feature, korean_tokenizer.all_special_ids) == list(dict.fromkeys(question))


def test_a_passage_scores_as_bm25okapi_scores_it_among_the_documents_passages():
    rng = np.random.default_rng(0)
    radius = 8
    document = rng.integers(10, 40, size=5 * 2 * radius + 5)  # five whole passages and a short last one
    document[::7] = 3  # a token in every passage: a negative IDF, raised to the floor
    question = [3, 11, 12, 25, 99]  # 99 is in no passage
    passages = [document[i:i + 2 * radius].tolist() for i in range(0, len(document), 2 * radius)]
    expected = BM25Okapi(passages).get_scores(question)
    scorer = PassageScorer(document, question, radius)
    for index in range(len(passages) - 1):  # a passage centred on a whole passage is that passage
        assert math.isclose(scorer(index * 2 * radius + radius), expected[index], rel_tol=1e-12)
    assert scorer(len(document) - 1) >= 0  # near the end the passage is clipped, never out of range


def test_the_prior_of_a_span_is_the_same_in_every_window_that_holds_it(korean_tokenizer, article):
    features, _ = windows_of(korean_tokenizer, article)
    prior = LexicalPrior(1.0, 16, frozenset(korean_tokenizer.all_special_ids)).for_question(features)
    first, second = features[0], features[1]
    shared = {offset[0]: i for i, offset in enumerate(second.offsets) if offset is not None}
    pairs = [(i, shared[o[0]]) for i, o in enumerate(first.offsets) if o is not None and o[0] in shared]
    assert pairs  # the windows overlap
    for i, j in pairs:
        assert prior(first, i) == prior(second, j)


def test_a_document_of_one_or_two_passages_gets_no_prior():
    """Every word of such a document is in half its passages or more, so no IDF is above 0; rank_bm25's floor (a
    quarter of the mean IDF) would then be negative and score a passage lower for holding the question's words."""
    document = np.array([5, 6, 7, 5, 8, 9, 6, 5, 10, 11])
    for radius in (5, 3):  # one passage of 10 tokens; two passages of 6 and 4
        scorer = PassageScorer(document, [5, 6, 10], radius)
        assert [scorer(p) for p in range(len(document))] == [0.0] * len(document)
        if radius == 5:
            assert min(BM25Okapi([document.tolist()]).get_scores([5, 6, 10])) < 0  # what the floor avoids


def test_a_radius_below_one_token_is_refused():
    with pytest.raises(ValueError, match="lexical radius is at least 1"):
        PassageScorer(np.arange(10), [1], 0)


def test_the_prior_moves_the_answer_to_the_passage_that_matches_the_question(korean_tokenizer, article):
    # the question is the words of a sentence late in the article; two spans score the same for the reader
    row = dict(article)
    late = row["context"][-400:]
    row["question"] = late[len(late) // 2 - 40:len(late) // 2 + 40]
    features, documents = windows_of(korean_tokenizer, row)
    early, last = features[0], features[-1]
    early_token = next(i for i, o in enumerate(early.offsets) if o is not None)
    late_tokens = [i for i, o in enumerate(last.offsets) if o is not None]
    late_token = next(i for i in late_tokens if last.offsets[i][0] >= len(row["context"]) - 200)
    offsets = {rule: 0.0 for rule in SCORING_RULES}
    spans = {0: [(1.0, early_token, early_token)], len(features) - 1: [(1.0, late_token, late_token)]}
    windows = [WindowCandidates(feature, spans.get(i, []), dict(offsets), None) for i, feature in enumerate(features)]
    special = frozenset(korean_tokenizer.all_special_ids)
    plain = merge_windows(windows, documents)[row["id"]]
    assert plain.window_index == early.window_index  # a tie: the earlier window
    assert merge_windows(windows, documents, lexical=LexicalPrior(0.0, 32, special))[row["id"]] == plain
    moved = rank_answers(windows, documents, top_k=2, lexical=LexicalPrior(1.0, 32, special))[row["id"]]
    assert moved[0].window_index == last.window_index
    prior = LexicalPrior(1.0, 32, special).for_question(features)
    assert moved[0].score == pytest.approx(1.0 + prior(last, late_token), rel=1e-12)
    assert prior(last, late_token) > prior(early, early_token)
    # each answer carries the prior's part of its score: the rule's value alone is what the pipeline format's
    # handle_impossible_answer compares with 0
    assert [a.lexical_prior for a in moved] == [prior(last, late_token), prior(early, early_token)]
    assert all(a.score - a.lexical_prior == pytest.approx(1.0, rel=1e-12) for a in moved)
    assert plain.lexical_prior == 0.0


def test_the_prior_is_off_at_weight_zero_and_refuses_what_it_cannot_use(korean_tokenizer):
    assert LexicalPrior.of(korean_tokenizer, 0.0) is None
    prior = LexicalPrior.of(korean_tokenizer, 0.3, 64)
    assert prior.special_ids == frozenset(korean_tokenizer.all_special_ids) and (prior.weight, prior.radius) == (0.3, 64)
    with pytest.raises(ValueError, match="lexical weight must be 0 .off. or more"):
        LexicalPrior.of(korean_tokenizer, -0.1)
    with pytest.raises(ValueError, match="lexical radius is at least 1"):
        LexicalPrior.of(korean_tokenizer, 0.3, 0)


def test_top_k_answers_are_distinct_places_unless_distinct_spans_are_asked(korean_tokenizer, article):
    """Candidates 신중현-like: a span, a span inside it, one overlapping its end, the same span in the next window,
    and one elsewhere. `distinct="place"` (the readers' default) keeps the best of each place; `"span"` (E7's
    shortlists) only drops the same span seen twice."""
    features, documents = windows_of(korean_tokenizer, dict(article))
    first, second = features[0], features[1]
    tokens = [i for i, o in enumerate(first.offsets) if o is not None]
    shared = [i for i in tokens if first.offsets[i][0] >= second.offsets[next(
        j for j, o in enumerate(second.offsets) if o is not None)][0]]  # tokens the second window holds too
    a, b = shared[0], shared[3]
    again = next(j for j, o in enumerate(second.offsets) if o == first.offsets[a])
    again_end = next(j for j, o in enumerate(second.offsets) if o == first.offsets[b])
    offsets = {rule: 0.0 for rule in SCORING_RULES}
    spans = {0: [(5.0, a, b), (4.0, a + 1, b), (3.0, b, b + 2), (1.0, tokens[0], tokens[0])],
             1: [(4.5, again, again_end)]}
    windows = [WindowCandidates(feature, spans.get(i, []), dict(offsets), None) for i, feature in enumerate(features)]
    example = features[0].example_id
    places = rank_answers(windows, documents, top_k=5)[example]
    assert [a.score for a in places] == [5.0, 1.0]
    assert all(x.end <= y.start or y.end <= x.start for x in places for y in places if x is not y)
    spans_only = rank_answers(windows, documents, top_k=5, distinct="span")[example]
    assert [a.score for a in spans_only] == [5.0, 4.0, 3.0, 1.0]  # 4.5 is the 5.0 span read in the next window
    with pytest.raises(ValueError, match="distinct must be 'place' or 'span'"):
        rank_answers(windows, documents, distinct="text")
