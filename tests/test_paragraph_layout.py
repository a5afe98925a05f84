"""E7 round 20's paragraph layout (experiments/e7_paragraph_layout.py): one sequence per question over its whole
article, each paragraph a segment at the positions the paragraph reader gives it, reading the question and itself."""

from __future__ import annotations

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


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_article_token_sits_at_its_paragraph_window_position(korean_tokenizer, variant):
    rows = korquad1_dev_questions(100)[:3]
    paragraphs = {title: [span for span, _ in spans]
                  for title, spans in article_paragraphs(KORQUAD / "KorQuAD_v1.0_dev.json").items()}
    for row in rows:
        spans = paragraphs[row["title"]]
        layout = paragraph_layout(korean_tokenizer, row["id"], row["question"], row["context"], spans, variant,
                                  512, 128, 63)
        feature, groups = layout.feature, layout.groups
        # every token of the article is in the layout (by its last character, as in the article's own windows)
        ends = {o[1] for o in feature.offsets if o is not None}
        sliding = features_for_rows(korean_tokenizer, [row], 512, 128, with_labels=False)
        assert ends == {o[1] for f in sliding for o in f.offsets if o is not None}
        # each paragraph window of the reader, token for token, at the reader's positions
        windows = [piece for low, high in spans for piece in features_for_rows(
            korean_tokenizer, [{**row, "context": row["context"][low:high]}], 512, 128, with_labels=False)]
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
            assert feature.input_ids[null] == korean_tokenizer.cls_token_id and feature.position_ids[null] == 0
            assert all(feature.region_nulls[i] == null for i in members)
            reads = members if variant == "replicated" else members[1:]
            kept = range(len(window.input_ids)) if variant == "replicated" else range(first, len(window.input_ids))
            assert [feature.input_ids[i] for i in reads] == [window.input_ids[i] for i in kept]
            assert [feature.position_ids[i] for i in reads] == list(kept)
            assert max(feature.position_ids[i] for i in members) < 512


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
    with torch.no_grad(), masked(model, SegmentPlan.of(groups, "replicated")):
        together = model(input_ids=ids, position_ids=positions).start_logits[0]
    with torch.no_grad():
        alone = torch.cat([model(input_ids=w[None]).start_logits[0] for w in windows])
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=1e-5)
    assert model.config.full_attention_max_length == 64  # the context manager restores the config

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
