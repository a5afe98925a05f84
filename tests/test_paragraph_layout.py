"""E7 round 20's paragraph layout (experiments/e7_paragraph_layout.py): one sequence per question over its whole
article, each paragraph a segment at the positions the paragraph reader gives it, reading the question and itself."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

from conftest import BLOCK, KORQUAD, korquad1_dev_questions, make_source  # noqa: E402
from e7_paragraph_cuts import article_paragraphs  # noqa: E402
from e7_paragraph_layout import SHARED, VARIANTS, SegmentPlan, attention_mask, masked, paragraph_layout  # noqa: E402

import longbird  # noqa: E402
from longbird.data.features import features_for_rows  # noqa: E402


def _questions_over_their_paragraphs():
    """(row, its article's paragraph spans, the gold answer's characters) for three real dev questions."""
    paragraphs = {title: [span for span, _ in spans]
                  for title, spans in article_paragraphs(KORQUAD / "KorQuAD_v1.0_dev.json").items()}
    for row in korquad1_dev_questions(100)[:3]:
        begin = row["answers"]["answer_start"][0]
        yield row, paragraphs[row["title"]], (begin, begin + len(row["answers"]["text"][0]))


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_article_token_sits_at_its_paragraph_window_position(korean_tokenizer, variant):
    for row, spans, answer in _questions_over_their_paragraphs():
        layout = paragraph_layout(korean_tokenizer, row["id"], row["question"], row["context"], spans, variant,
                                  512, 128, 63, answer)
        feature, groups = layout.feature, layout.groups
        # the label points at the answer's first and last tokens, in one segment
        start, end = feature.start_position, feature.end_position
        assert 0 < start <= end and groups[start] == groups[end] != SHARED
        assert feature.offsets[start][0] <= answer[0] < feature.offsets[start][1]
        assert feature.offsets[end][0] < answer[1] <= feature.offsets[end][1]
        # every token of the article is in the layout (by its last character, as in the article's own windows)
        ends = {o[1] for o in feature.offsets if o is not None}
        sliding = features_for_rows(korean_tokenizer, [row], 512, 128, with_labels=False)
        assert ends == {o[1] for f in sliding for o in f.offsets if o is not None}
        # each paragraph window of the reader, token for token, at the reader's positions
        windows = [piece for low, high in spans for piece in features_for_rows(
            korean_tokenizer, [{**row, "context": row["context"][low:high]}], 512, 128, with_labels=False)]
        _assert_each_segment_is_its_window(korean_tokenizer, layout, windows, variant)


def _assert_each_segment_is_its_window(tokenizer, layout, windows, variant):
    """The layout's segments are `windows` in order, token for token at the reader's positions, each with its null
    (`[CLS]` at 0) and its region; the shared question once, at 0..first-1, unless every segment has its copy."""
    feature, groups = layout.feature, layout.groups
    segments = sorted(set(groups) - {SHARED})
    assert len(segments) == len(windows)
    first = next(i for i, o in enumerate(windows[0].offsets) if o is not None)
    shared = [i for i, g in enumerate(groups) if g == SHARED]
    if variant == "replicated":
        assert not shared
    else:  # [CLS] question [SEP] [SEP] once, at 0..first-1, its own region
        assert [feature.input_ids[i] for i in shared] == windows[0].input_ids[:first]
        assert [feature.position_ids[i] for i in shared] == list(range(first))
        assert all(feature.region_nulls[i] == 0 for i in shared)
    for segment, window in zip(segments, windows):
        members = [i for i, g in enumerate(groups) if g == segment]
        null = members[0]
        assert feature.input_ids[null] == tokenizer.cls_token_id and feature.position_ids[null] == 0
        assert all(feature.region_nulls[i] == null for i in members)
        reads = members if variant == "replicated" else members[1:]
        kept = range(len(window.input_ids)) if variant == "replicated" else range(first, len(window.input_ids))
        assert [feature.input_ids[i] for i in reads] == [window.input_ids[i] for i in kept]
        assert [feature.position_ids[i] for i in reads] == list(kept)
        assert max(feature.position_ids[i] for i in members) < 512


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_carried_segment_is_the_window_that_starts_at_its_paragraph(korean_tokenizer, variant):
    """Round 23's carry: a paragraph that fits a window is read in the truncated window over the article from the
    paragraph's start, token for token at the reader's positions; what follows the paragraph is carried (no offsets,
    never the label), so the candidates are exactly the layout's without carry, and a paragraph too long for a window
    keeps its own windows."""
    carrying = 0
    for row, spans, answer in _questions_over_their_paragraphs():
        plain = paragraph_layout(korean_tokenizer, row["id"], row["question"], row["context"], spans, variant,
                                 512, 128, 63, answer)
        layout = paragraph_layout(korean_tokenizer, row["id"], row["question"], row["context"], spans, variant,
                                  512, 128, 63, answer, carry=True)
        feature, groups = layout.feature, layout.groups
        assert not any(plain.carried) and len(layout.carried) == len(feature.input_ids)
        candidates = [o for o in feature.offsets if o is not None]
        assert candidates == [o for o in plain.feature.offsets if o is not None]  # the same answers, in order
        start, end = feature.start_position, feature.end_position
        assert 0 < start <= end and not layout.carried[start] and not layout.carried[end]
        assert (feature.offsets[start], feature.offsets[end]) == (plain.feature.offsets[plain.feature.start_position],
                                                                  plain.feature.offsets[plain.feature.end_position])
        windows = []
        for low, high in spans:
            own = features_for_rows(korean_tokenizer, [{**row, "context": row["context"][low:high]}], 512, 128,
                                    with_labels=False)
            windows += own if len(own) > 1 else features_for_rows(
                korean_tokenizer, [{**row, "context": row["context"][low:]}], 512, 128, max_windows=1,
                with_labels=False)
            carrying += len(own) == 1 and high < len(row["context"])
        _assert_each_segment_is_its_window(korean_tokenizer, layout, windows, variant)
        for i, o in enumerate(feature.offsets):  # carried tokens lie past their segment's candidates
            if layout.carried[i]:
                assert o is None and groups[i] != SHARED
    assert carrying  # the articles read here do carry text


def test_the_mask_reads_the_own_segment_and_the_question():
    groups = [SHARED, SHARED, 0, 0, 1]
    alone = attention_mask(groups, "question-alone")[0, 0]
    expected = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 1]])
    assert torch.equal(alone, expected.bool())
    expected[:2] = 1  # the shared question reads everything
    assert torch.equal(attention_mask(groups, "question-global")[0, 0], expected.bool())
    assert torch.equal(attention_mask([0, 0, 1], "replicated")[0, 0],
                       torch.tensor([[1, 1, 0], [1, 1, 0], [0, 0, 1]]).bool())


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_segment_plan_computes_what_the_dense_mask_says(variant):
    """Per segment over its keys against one SDPA under the l x l mask: the same sums in another layout (1e-6)."""
    groups = ([SHARED] * 5 if variant != "replicated" else []) + [0] * 7 + [1] * 3 + [2] * 12 + [3]
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, 4, len(groups), 8, generator=generator) for _ in range(3))
    dense = torch.nn.functional.scaled_dot_product_attention(query, key, value,
                                                             attn_mask=attention_mask(groups, variant))
    torch.testing.assert_close(SegmentPlan.of(groups, variant).attend(query, key, value), dense, atol=1e-6, rtol=1e-5)


def _qa_model():
    base = longbird.convert(make_source("bert"), max_length=128, block_size=BLOCK)
    model = longbird.LongBirdForQuestionAnswering(base.config)
    model.longbird.load_state_dict(base.state_dict())
    return model.eval()


def test_a_segment_reads_as_its_window_alone_and_the_question_as_the_mask_says():
    """Replicated: each window in the one sequence gets the start logits it gets alone; shared: the question alone
    gets the states of the question read by itself, and each segment those of [question, segment] read with the
    question blind to it (1e-6 / 1e-5: the same sums in another layout)."""
    torch.manual_seed(0)
    model = _qa_model()
    generator = torch.Generator().manual_seed(1)
    windows = [torch.randint(5, 90, (n,), generator=generator) for n in (20, 33, 7)]
    ids = torch.cat(windows)[None]
    positions = torch.cat([torch.arange(len(w)) for w in windows])[None]
    groups = [g for g, w in enumerate(windows) for _ in w]
    config = model.config
    before = config.full_attention_max_length, config.max_position_embeddings
    with torch.no_grad(), masked(model, SegmentPlan.of(groups, "replicated")):
        inside = config.full_attention_max_length, config.max_position_embeddings
        together = model(input_ids=ids, position_ids=positions).start_logits[0]
    with torch.no_grad():
        alone = torch.cat([model(input_ids=w[None]).start_logits[0] for w in windows])
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=1e-5)
    # lifted inside (sequences may outrun the table of positions), both restored after
    assert inside[0] > before[0] and inside[1] > before[1]
    assert (config.full_attention_max_length, config.max_position_embeddings) == before

    question, segment = windows[0][:6], windows[1]
    ids = torch.cat([question, segment])[None]
    positions = torch.cat([torch.arange(6), torch.arange(6, 6 + len(segment))])[None]
    groups = [SHARED] * 6 + [0] * len(segment)
    with torch.no_grad():
        with masked(model.longbird, SegmentPlan.of(groups, "question-alone")):
            shared = model.longbird(input_ids=ids, position_ids=positions).last_hidden_state[0]
        with masked(model.longbird, SegmentPlan.of(groups, "question-global")):
            global_ = model.longbird(input_ids=ids, position_ids=positions).last_hidden_state[0]
        question_alone = model.longbird(input_ids=question[None]).last_hidden_state[0]
        dense = model.longbird(input_ids=ids, position_ids=positions).last_hidden_state[0]
    torch.testing.assert_close(shared[:6], question_alone, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(global_, dense, atol=1e-6, rtol=1e-5)  # one segment: global reading is dense
    assert not torch.allclose(shared[:6], dense[:6], atol=1e-3)  # read alone, the question does not read the segment


def test_training_segments_keep_the_answers_paragraph_in_article_order():
    from e7_paragraph_training import chosen_segments

    spans = [(0, 10), (12, 30), (32, 40), (42, 60), (62, 70)]
    for seed in range(5):
        chosen = chosen_segments(spans, (35, 38), 3, random.Random(seed))
        assert len(chosen) == 3 and (32, 40) in chosen and chosen == sorted(chosen)
    assert chosen_segments(spans, (35, 38), 0, random.Random(0)) == spans
    assert chosen_segments(spans, (35, 38), 9, random.Random(0)) == spans


def test_bm25_distractors_are_the_paragraphs_the_question_matches_best():
    from e7_paragraph_training import chosen_segments, paragraph_scores

    class Words:  # a tokenizer of whitespace words, enough for BM25 over ids
        def __init__(self):
            self.vocabulary = {}

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [self.vocabulary.setdefault(w, len(self.vocabulary)) for w in text.split()]}

    paragraphs = ["the river runs north", "a red bird sings", "red bird nests by the river",
                  "stone walls stand", "the bird is red and small"]
    context, spans = "", []
    for text in paragraphs:
        spans.append((len(context), len(context) + len(text)))
        context += text + "\n\n"
    scores = paragraph_scores(Words(), "which red bird", context, spans)
    assert scores[3] == 0 and scores[1] > 0 and scores[4] > 0  # a paragraph without the words scores nothing
    answer = (spans[0][0] + 4, spans[0][0] + 9)  # in the first paragraph, which shares no question word
    chosen = chosen_segments(spans, answer, 3, random.Random(0), scores)
    best_two = sorted(range(1, 5), key=lambda i: -scores[i])[:2]
    assert chosen == [spans[0]] + [spans[i] for i in sorted(best_two)] and spans[3] not in chosen
    for seed in range(3):  # the lexical choice does not depend on the generator
        assert chosen_segments(spans, answer, 3, random.Random(seed), scores) == chosen


def test_the_linear_layout_schedule_is_finetune_qas_linear_schedule_over_cpu_time():
    """--lr-schedule linear falls as transformers' linear schedule without warmup (finetune-qa's) does over the same
    fraction of its budget, so a layout phase started at a sliding run's checkpoint rate finishes that schedule."""
    from e7_paragraph_training import scheduled_learning_rate
    from transformers import get_linear_schedule_with_warmup

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=5e-5)
    schedule = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=577)
    for step in range(578):
        assert scheduled_learning_rate(5e-5, step * 1.5, 577 * 1.5, "linear") == pytest.approx(
            schedule.get_last_lr()[0], rel=1e-12, abs=1e-18)
        optimizer.step()
        schedule.step()
    rate_at_385 = 5e-5 * (577 - 385) / 577  # the sliding run's rate at its checkpoint
    assert scheduled_learning_rate(rate_at_385, 0.0, 1800.0, "linear") == rate_at_385
    assert scheduled_learning_rate(rate_at_385, 1900.0, 1800.0, "linear") == 0.0  # the last update overshoots
    assert scheduled_learning_rate(5e-5, 900.0, 1800.0, "constant") == 5e-5
    with pytest.raises(ValueError, match=r"'cosine'.*'constant' or 'linear'"):
        scheduled_learning_rate(5e-5, 0.0, 1.0, "cosine")


def _hand_made_layout(carried: list[bool] | None = None):
    """A question-global layout of a shared question (4 tokens) and two segments (7 and 6 tokens, each its null
    first), the answer at tokens 13-14 of the second; `carried` tokens lose their offsets."""
    from e7_paragraph_layout import Layout

    from longbird.data.features import QAFeature

    ids = [5, 10, 11, 2] + [5, 20, 21, 22, 23, 24, 25] + [5, 30, 31, 32, 33, 34]
    positions = [0, 1, 2, 3] + [0, 4, 5, 6, 7, 8, 9] + [0, 4, 5, 6, 7, 8]
    nulls = [0] * 4 + [4] * 7 + [11] * 6
    groups = [SHARED] * 4 + [0] * 7 + [1] * 6
    offsets = [None] * 4 + [None] + [(i, i + 1) for i in range(6)] + [None] + [(i, i + 1) for i in range(10, 15)]
    carried = carried or [False] * len(ids)
    offsets = [None if c else o for o, c in zip(offsets, carried)]
    return Layout(QAFeature("q", ids, None, offsets, 13, 14, position_ids=positions, region_nulls=nulls), groups,
                  carried)


def test_the_layout_loss_reaches_every_weight_and_falls_when_trained():
    """A hand-made question-global layout (a shared question, two segments, the answer in the second): the loss is
    finite, its gradient reaches the QA heads and the attention of the first layer, and 30 Adam steps lower it."""
    from e7_paragraph_training import layout_loss

    torch.manual_seed(0)
    model = _qa_model().train()
    layout = _hand_made_layout()
    loss = layout_loss(model, layout, "question-global", 0.5)
    assert torch.isfinite(loss)
    loss.backward()
    for name in ("qa_start.weight", "qa_end.dense.weight", "longbird.encoder.layer.0.attention.self.query.weight"):
        assert model.get_parameter(name).grad.abs().sum() > 0, name
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    first = float(loss.detach())
    for _ in range(30):
        optimizer.zero_grad()
        loss = layout_loss(model, layout, "question-global", 0.5)
        loss.backward()
        optimizer.step()
    assert float(loss.detach()) < first / 2


def test_carried_tokens_get_no_start_gradient_and_the_others_do():
    """layout_loss leaves carried context out of every softmax: its start logits get no gradient, the candidates'
    in the same segment do."""
    from unittest import mock

    from e7_paragraph_training import layout_loss

    torch.manual_seed(0)
    model = _qa_model().train()
    carried = [False] * 4 + [False] * 4 + [True] * 3 + [False] * 4 + [True] * 2
    layout = _hand_made_layout(carried)
    captured, forward = {}, model.forward

    def keeping(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.start_logits.retain_grad()
        captured["out"] = out
        return out

    with mock.patch.object(model, "forward", keeping):
        layout_loss(model, layout, "question-global", 0.5).backward()
    grad = captured["out"].start_logits.grad[0]
    assert all(grad[i] == 0 for i, c in enumerate(carried) if c)
    assert all(grad[i] != 0 for i in (5, 6, 7, 12, 13, 14))  # the candidates of both segments


def test_the_article_length_table_averages_each_bucket_and_pairs_with_the_baseline():
    from e7_paragraph_layout import by_article_length, length_bucket

    assert [length_bucket(n) for n in (1, 1024, 1025, 2048, 4096, 4097)] == [
        "1–1,024", "1–1,024", "1,025–2,048", "1,025–2,048", "2,049–4,096", "> 4,096"]
    per = {"base": {"a1": 100.0, "a2": 0.0, "b1": 50.0}, "long": {"a1": 100.0, "a2": 100.0, "b1": 20.0}}
    results = {"article_tokens": {"short": 900, "long article": 5000},
               "article_of": {"a1": "short", "a2": "short", "b1": "long article"}, "baseline": "base",
               "readings": {name: {"default": {"per_question": {q: {"f1": f1, "exact_match": f1}
                                                                for q, f1 in scores.items()}}}
                            for name, scores in per.items()}}
    lines = by_article_length(results)
    assert lines[2] == "| reading | 1–1,024 (1 / 2) | > 4,096 (1 / 1) |"
    assert lines[4] == "| base | 50.0 | 50.0 |"
    assert lines[5] == "| long | 100.0 (+50.0) | 20.0 (-30.0) |"


def test_the_budget_curves_start_from_the_untrained_layout_and_follow_the_budget():
    from e7_paragraph_layout import budget_curves

    def reading(f1):
        return {"default": {"all": {"f1": f1}}, "none": {"all": {"f1": f1 - 1}}}

    def trained(minutes, segments):
        return {"layout": {"variant": "question-global", "segments": segments}, "cpu_budget_minutes": minutes}

    results = {"models": {"sliding": {"reading": "sliding"}, "global": {"reading": "question-global", "training": {}},
                          "g60": {"reading": "question-global", "training": trained(60, 12)},
                          "g30": {"reading": "question-global", "training": trained(30, 12)},
                          "s4": {"reading": "question-global", "training": trained(30, 4)},
                          "b4": {"reading": "question-global",
                                 "training": {**trained(30, 4), "layout": {"variant": "question-global", "segments": 4,
                                                                           "distractors": "bm25"}}},
                          "global-carry": {"reading": "question-global", "training": {}, "carry": True},
                          "c6": {"reading": "question-global", "carry": True,
                                 "training": {**trained(90, 6), "layout": {"variant": "question-global", "segments": 6,
                                                                           "distractors": "bm25", "carry": True}}}},
               "readings": {"sliding": reading(76), "global": reading(70), "g60": reading(74), "g30": reading(72),
                            "s4": reading(71), "b4": reading(73), "global-carry": reading(75), "c6": reading(77)}}
    assert budget_curves(results, "default") == {
        "question-global, 12 segments": [(0.0, 70), (30, 72), (60, 74)],
        "question-global, 4 segments": [(0.0, 70), (30, 71)],
        "question-global, 4 segments (BM25 distractors)": [(0.0, 70), (30, 73)],
        "question-global, 6 segments (BM25 distractors), carrying the following text": [(0.0, 75), (90, 77)]}
    assert budget_curves(results, "none")["question-global, 4 segments"] == [(0.0, 69), (30, 70)]
    # a layout trained after another model (round 27: sliding-512 first) is not a point of the reader's curve
    results["reader"] = "qa-model/reader"
    for name in ("g60", "g30", "s4", "b4", "c6"):
        results["models"][name]["training"]["started_from"] = "qa-model/reader/"
    results["models"]["after"] = {"reading": "question-global",
                                  "training": {**trained(30, 12), "started_from": "runs/sliding-385steps"}}
    results["readings"]["after"] = reading(78)
    results["models"]["global"]["model"] = "qa-model/reader"
    results["models"]["global-carry"]["model"] = "qa-model/reader"
    results["models"]["sliding-trained-read-whole"] = {"model": "runs/sliding-385steps", "reading": "question-global",
                                                       "training": {}}
    results["readings"]["sliding-trained-read-whole"] = reading(60)
    assert budget_curves(results, "default")["question-global, 12 segments"] == [(0.0, 70), (30, 72), (60, 74)]


def test_the_lead_prior_adds_its_bonus_to_spans_in_the_first_paragraph_only(korean_tokenizer):
    from e7_paragraph_layout import LeadPrior

    from longbird.data.html import plain_document
    from longbird.lexical_prior import LexicalPrior
    from longbird.qa import SCORING_RULES, WindowCandidates, rank_answers

    row, spans, _ = next(_questions_over_their_paragraphs())
    lead_end = {row["id"]: spans[0][1]}
    features = features_for_rows(korean_tokenizer, [row], 512, 128, with_labels=False)
    documents = {row["id"]: plain_document(row["context"])}
    first = features[0]
    # a span in the first paragraph, the first token at or after its end (the separator), one in the last window
    lead = next(i for i, o in enumerate(first.offsets) if o is not None)
    boundary = next(i for i, o in enumerate(first.offsets) if o is not None and o[0] >= spans[0][1])
    last = features[-1]
    late = max(i for i, o in enumerate(last.offsets) if o is not None)
    offsets = {rule: 0.0 for rule in SCORING_RULES}
    windows = [WindowCandidates(first, [(1.5, boundary, boundary), (1.0, lead, lead)], dict(offsets), None),
               WindowCandidates(last, [(1.4, late, late)], dict(offsets), None)]

    def best(prior):
        return rank_answers(windows, documents, lexical=prior)[row["id"]][0]

    for prior in (None, LeadPrior(None, 0.4, lead_end)):  # 1.0 + 0.4 < 1.5: no bonus from the paragraph's end on
        answer = best(prior)
        assert answer.score == 1.5 and answer.start >= spans[0][1]
    moved = best(LeadPrior(None, 0.6, lead_end))
    assert moved.score == pytest.approx(1.6, rel=1e-12) and moved.start < spans[0][1]
    lexical = LexicalPrior(0.5, 32, frozenset(korean_tokenizer.all_special_ids))
    both, alone = LeadPrior(lexical, 0.6, lead_end).for_question(features), lexical.for_question(features)
    assert both(first, lead) == pytest.approx(alone(first, lead) + 0.6, rel=1e-12)
    assert both(first, boundary) == alone(first, boundary) and both(last, late) == alone(last, late)
    assert LeadPrior(None, 0.6, lead_end).weight == 0.6 and LeadPrior(lexical, 0.0, lead_end).weight == 0.5


def test_the_answer_paragraph_table_buckets_by_paragraph_and_pairs_with_the_baseline():
    from e7_paragraph_layout import by_answer_paragraph

    per = {"base": {"a": 100.0, "b": 0.0, "c": 50.0, "d": 40.0, "e": 60.0},
           "long": {"a": 50.0, "b": 100.0, "c": 50.0, "d": 0.0, "e": 100.0}}
    results = {"paragraph_of": {"a": 0, "b": 0, "c": 1, "d": 2, "e": 7}, "baseline": "base",
               "readings": {name: {"default": {"per_question": {q: {"f1": f1, "exact_match": f1}
                                                                for q, f1 in scores.items()}}}
                            for name, scores in per.items()}}
    lines = by_answer_paragraph(results)
    assert lines[2] == "| reading | 1st (2) | 2nd (1) | 3rd (1) | later (1) |"
    assert lines[4] == "| base | 50.0 | 50.0 | 40.0 | 60.0 |"
    assert lines[5] == "| long | 75.0 (+25.0) | 50.0 (+0.0) | 0.0 (-40.0) | 100.0 (+40.0) |"
    assert by_answer_paragraph({**results, "paragraph_of": None}) == []  # results written before round 24


def test_a_wrong_answer_is_a_reading_error_in_its_paragraph_and_a_ranking_error_elsewhere():
    from e7_answer_places import paragraph_index, places

    from longbird.qa import Answer

    starts = [0, 100, 250]
    assert [paragraph_index(starts, c) for c in (0, 99, 100, 249, 250, 900)] == [0, 0, 1, 1, 2, 2]
    predictions = {"a": Answer("x", 10, 12, 1.0, 0, None), "b": Answer("y", 120, 125, 1.0, 0, None),
                   "c": Answer("z", 260, 270, 1.0, 0, None), "d": None}
    scores = {"a": {"f1": 50.0}, "b": {"f1": 49.9}, "c": {"f1": 0.0}, "d": {"f1": 0.0}}
    gold = {"a": 2, "b": 1, "c": 0, "d": 0}
    assert places(predictions, scores, gold, dict.fromkeys(predictions, starts)) == {
        "a": "right", "b": "wrong, its paragraph", "c": "wrong, another paragraph", "d": "wrong, another paragraph"}


def test_the_learned_ranking_at_the_library_weights_ranks_as_the_library(korean_tokenizer):
    from e7_learned_ranking import LIBRARY, LearnedRanking, question_candidates

    from longbird.data.html import plain_document
    from longbird.lexical_prior import LexicalPrior
    from longbird.qa import SCORING_RULES, WindowCandidates, rank_answers

    row, spans, _ = next(_questions_over_their_paragraphs())
    features = features_for_rows(korean_tokenizer, [row], 512, 128, with_labels=False)
    documents = {row["id"]: plain_document(row["context"])}
    generator = random.Random(0)
    windows = []
    for feature in features:  # random spans and offsets: each window's null and normaliser differ
        tokens = [i for i, o in enumerate(feature.offsets) if o is not None]
        starts = generator.sample(tokens, 5)
        spans_ = [(generator.uniform(-2, 2), s, min(s + generator.randrange(4), tokens[-1])) for s in starts]
        windows.append(WindowCandidates(feature, spans_, {r: generator.uniform(-3, 3) for r in SCORING_RULES}, None))
    special = frozenset(korean_tokenizer.all_special_ids)
    lead_end = {row["id"]: spans[0][1]}
    learned = LearnedRanking(list(LIBRARY), {id(w.feature): w for w in windows}, special, lead_end)
    ours = rank_answers(windows, documents, top_k=5, lexical=learned)[row["id"]]
    library = rank_answers(windows, documents, top_k=5, lexical=LexicalPrior(0.3, 64, special))[row["id"]]
    assert [(a.start, a.end) for a in ours] == [(a.start, a.end) for a in library]
    assert [a.score for a in ours] == pytest.approx([a.score for a in library], rel=1e-12)
    # the candidates the fit reads: one per decoded span, their features as the ranking computes them
    raw, values, f1 = question_candidates(windows, documents, [row], special, lead_end)[row["id"]]
    assert len(raw) == len(values) == len(f1) == 5 * len(windows)
    assert ((f1 >= 0) & (f1 <= 100)).all() and set(values[:, 4].tolist()) <= {0.0, 1.0}
    library_scores = raw.double() + values.double() @ torch.tensor(LIBRARY, dtype=torch.float64)
    assert library_scores.max().item() == pytest.approx(library[0].score, rel=1e-12)


def test_the_fit_learns_the_weight_of_a_feature_that_marks_the_right_candidates():
    from e7_learned_ranking import FEATURES, LIBRARY, fit

    generator = torch.Generator().manual_seed(0)
    lead = FEATURES.index("lead")
    candidates = []
    for _ in range(40):  # three candidates a question, equal raw scores; the one in the lead is right
        values = torch.zeros(3, len(FEATURES))
        values[:, 0] = torch.randn(3, generator=generator) * 0.1
        right = int(torch.randint(3, (1,), generator=generator))
        values[right, lead] = 1.0
        f1 = torch.zeros(3)
        f1[right] = 100.0
        candidates.append((torch.zeros(3), values, f1))
    weights = fit(candidates)
    assert weights[lead] > LIBRARY[lead] + 1.0  # the lead now outweighs the noise in the null feature
    with pytest.raises(ValueError, match="no question has a candidate with F1 above 0"):
        fit([(torch.zeros(2), torch.zeros(2, len(FEATURES)), torch.zeros(2))])


def test_a_further_baseline_pairs_every_reading_in_a_section_of_its_own():
    """`--baseline first other`: every reading keeps its difference from the first baseline, and `other` gets a
    section of its own whose differences are the paired bootstrap of the same questions against it."""
    from e4_korquad_articles import BUCKETS
    from e7_paragraph_layout import against, by_article_length, pair_with

    from longbird.metrics.intervals import bucket_summary, paired_difference

    per = {"base": {"a1": 100.0, "a2": 0.0, "b1": 50.0, "b2": 10.0},
           "other": {"a1": 80.0, "a2": 40.0, "b1": 50.0, "b2": 30.0},
           "long": {"a1": 100.0, "a2": 100.0, "b1": 20.0, "b2": 0.0}}
    article_of = {"a1": "short", "a2": "short", "b1": "long article", "b2": "long article"}
    buckets = {"a1": "first 512", "a2": "beyond 512", "b1": "first 512", "b2": "beyond 512"}
    scores = {name: {"default": {q: {"f1": f1, "exact_match": f1} for q, f1 in s.items()}} for name, s in per.items()}
    results = {"article_tokens": {"short": 900, "long article": 5000}, "article_of": article_of,
               "baseline": "base", "other_baselines": ["other"], "readings": {}}
    for name, by_prior in scores.items():
        results["readings"][name] = {
            prior: {**bucket_summary(s, buckets, BUCKETS, None if name == "base" else scores["base"][prior],
                                     article_of), "per_question": s} for prior, s in by_prior.items()}
        if name != "other":
            pair_with(results["readings"][name], "other", scores["other"], buckets, article_of)
    long = results["readings"]["long"]["default"]
    # the first baseline's pairing is untouched, the further one is the same bootstrap against `other`
    ids = sorted(per["long"])
    clusters = [article_of[q] for q in ids]
    assert long["all"]["f1_vs_baseline"] == paired_difference(
        [per["long"][q] for q in ids], [per["base"][q] for q in ids], clusters=clusters)
    against_other = paired_difference([per["long"][q] for q in ids], [per["other"][q] for q in ids],
                                      clusters=clusters)
    assert long["all"]["f1_vs"]["other"] == against_other and against_other["difference"] == 5.0
    assert long["beyond 512"]["f1_vs"]["other"]["difference"] == (100 - 40 + 0 - 30) / 2
    assert "f1_vs" not in results["readings"]["other"]["default"]["all"]
    lines = against(results, "other")
    assert lines[0] == "### Against `other`"
    rows = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ") and " | default | " in line}
    low, high = against_other["low"], against_other["high"]
    assert rows["long"] == f"| long | default | 55.0 | +5.0 ({low:+.1f} to {high:+.1f}) | -5.0 / +15.0 |"
    assert rows["other"] == "| other | default | 50.0 | (the baseline) |  |"
    assert rows["base"].startswith("| base | default | 40.0 | -10.0 (")
    results["readings"]["long"]["lead"] = {"all": {"f1": 60.0}}  # a prior `other` was not read with: said, not paired
    assert "| long | lead | 60.0 | (`other` has no `lead` reading) |  |" in against(results, "other")
    # its bucket tables pair with `other`, the results' own with the first baseline
    length_table = lines[lines.index("") + 1 + lines[lines.index("") + 1:].index(""):]
    assert any(line == "| long | 100.0 (+40.0) | 10.0 (-30.0) |" for line in length_table)
    assert "| long | 100.0 (+50.0) | 10.0 (-20.0) |" in by_article_length(results)


def test_an_unknown_baseline_is_refused_before_any_reading(tmp_path, monkeypatch):
    import json

    import e7_paragraph_layout

    from longbird.data.korquad import read_korquad_v1_articles, split_by_title

    questions = len(split_by_title(read_korquad_v1_articles(KORQUAD / "KorQuAD_v1.0_dev.json")[0])["dev"])
    (tmp_path / "r.json").write_text(json.dumps({"questions": questions, "readings": {"sliding": {}}}))
    monkeypatch.setattr(sys, "argv", ["e7_paragraph_layout.py", "--reader", str(tmp_path / "no-reader"), "--report",
                                      "--name", "r", "--out", str(tmp_path), "--baseline", "sliding", "slidng-90"])
    with pytest.raises(SystemExit, match=r"--baseline slidng-90: no such reading in .*r\.json or in this run "
                                         r"\(readings: sliding\)"):
        e7_paragraph_layout.main()
