"""Short windows cut from the long layout (data/layout_cuts.py): every cut is the long window's head plus a span of
its tokens with their long-window positions and nulls, the cuts cover the long window, labels follow their tokens,
and the negative draw keeps every labelled cut; on whole KorQuAD 1.0 articles with the Korean source's tokenizer."""

import numpy as np
import pytest
from conftest import korquad1_dev_questions

from longbird.data.layout_cuts import LayoutCuts, span_starts
from longbird.data.null_regions import NullRegions
from longbird.data.windows import QAWindows

LONG, CUT, HEAD, OVERLAP = 2048, 512, 128, 128


@pytest.fixture(scope="module")
def articles():
    return korquad1_dev_questions(9)  # 45 questions over several whole articles, some beyond 2K tokens


@pytest.mark.parametrize("document,after,every", [((5, 40), 10, 7), ((12, 12), 10, 7), ((3, 9), 10, 7),
                                                  ((20, 60), 10, 4), ((10, 11), 10, 1)])
def test_null_indices_are_where_insertion_puts_the_nulls(document, after, every):
    length = document[1] + 2
    regions = NullRegions(every, after, -1)
    inserted = regions.insert(list(range(length)), [document[0] <= i < document[1] for i in range(length)])
    assert regions.null_indices(document).tolist() == inserted["nulls"]


def test_span_starts_overlap_by_about_the_asked_tokens_and_reach_the_end():
    nulls = NullRegions(128, 512, -1).null_indices((70, 3000))
    starts = span_starts(3000 + len(nulls), HEAD, CUT - HEAD, OVERLAP, 512, nulls)
    assert starts[0] == HEAD and starts[-1] + CUT - HEAD >= 3000 + len(nulls) > starts[-2] + CUT - HEAD
    steps = np.diff(starts)
    assert all(start < 512 or start in nulls for start in starts)  # in the first region or at a null
    assert np.all(np.abs(steps - (CUT - HEAD - OVERLAP)) <= 64), steps  # nulls every 129 tokens: within 64


@pytest.mark.parametrize("overlap", [0, 16, 63, 64, 128, 383])
def test_spans_leave_no_token_out_at_any_overlap(overlap):
    nulls = NullRegions(128, 512, -1).null_indices((70, 3000))
    length = 3000 + len(nulls)
    starts = span_starts(length, HEAD, CUT - HEAD, overlap, 512, nulls)
    covered = set(range(HEAD)).union(*(range(start, min(start + CUT - HEAD, length)) for start in starts))
    assert covered == set(range(length))


def test_a_span_shorter_than_a_region_is_refused_with_the_fix():
    nulls = NullRegions(128, 512, -1).null_indices((70, 3000))
    with pytest.raises(ValueError, match=r"does not reach the next regional null.*use longer cuts"):
        span_starts(3000 + len(nulls), HEAD, 100, 0, 512, nulls)


@pytest.fixture(scope="module")
def cuts(korean_tokenizer, articles):
    regions = NullRegions(128, 512, korean_tokenizer.cls_token_id)
    windows = QAWindows(korean_tokenizer, articles, LONG, 512, null_regions=regions)
    return windows, LayoutCuts(windows, CUT, HEAD, OVERLAP)


def test_every_cut_is_the_head_and_a_span_of_its_long_window_with_their_positions_and_nulls(korean_tokenizer,
                                                                                            cuts):
    windows, cut = cuts
    assert len(cut) == cut.windows > len(windows)  # nothing drawn away at negative_fraction 1; articles > 512 cut
    covered: dict[int, set[int]] = {}
    for index in range(len(cut)):
        long_index, start, first, last, _ = (int(x) for x in cut.items[index])
        item, long = cut[index], windows[long_index]
        if start < 0:  # a long window that fits one cut is the cut
            assert len(long["input_ids"]) <= CUT and item["input_ids"] == long["input_ids"]
            continue
        keep = [*range(HEAD), *range(start, min(start + CUT - HEAD, len(long["input_ids"])))]
        for key in ("input_ids", "position_ids", "attention_mask"):
            assert item[key] == [long[key][i] for i in keep], key
        assert len(item["input_ids"]) <= CUT
        # every token's null is in the cut: the same token of the long window, a [CLS] at position 0
        for token, null in enumerate(item["region_nulls"]):
            assert keep[null] == long["region_nulls"][keep[token]]
            assert item["input_ids"][null] == korean_tokenizer.cls_token_id and item["position_ids"][null] == 0
        # labels: the same tokens as the long window's label, exactly when the cut holds the whole answer (an answer
        # starting in the head labels the first cut only, and the window's other cuts are left out)
        answer = (long["start_positions"], long["end_positions"])
        holds = answer[0] > 0 and (answer[0] >= start or start == HEAD) and answer[1] < start + CUT - HEAD
        assert not (0 < answer[0] < HEAD and start != HEAD)
        assert bool(first) == holds
        if first:
            assert (keep[first], keep[last]) == answer
        covered.setdefault(long_index, set()).update(keep)
    for long_index, seen in covered.items():  # the cuts of a long window cover all of it
        if not 0 < windows[long_index]["start_positions"] < HEAD:  # (one cut only for an answer in the head)
            assert seen == set(range(len(windows[long_index]["input_ids"])))


def test_the_start_loss_sees_every_region_of_a_cut(cuts):
    """The regional start loss bounds the regions of a row by `NullRegions.max_regions` (no host read in a compiled
    step): the bound holds for every cut, and a cut whose answer lies in a span region gets the same loss and a
    gradient at the gold start as with the regions counted from the batch."""
    import torch

    from longbird.data.null_regions import is_null
    from longbird.region_losses import regional_start_loss

    _, cut = cuts
    config = type("Config", (), {"qa_null_every": 128, "full_attention_max_length": 512})()
    items = [cut[i] for i in range(len(cut))]
    for item in items:
        nulls = is_null(torch.tensor(item["region_nulls"]))
        assert int(nulls.sum()) <= NullRegions.max_regions(config, len(item["input_ids"]))
    spanned = [item for item in items if item["start_positions"] and item["region_nulls"][item["start_positions"]]]
    assert spanned  # answers beyond the first region
    item = spanned[0]
    length = len(item["input_ids"])
    logits = torch.randn(1, length, generator=torch.Generator().manual_seed(0), requires_grad=True)
    region_nulls = torch.tensor([item["region_nulls"]])
    valid = torch.ones(1, length, dtype=torch.bool)
    target = torch.tensor([item["start_positions"]])
    bounded = regional_start_loss(logits, region_nulls, valid, target, NullRegions.max_regions(config, length))
    counted = regional_start_loss(logits, region_nulls, valid, target)
    torch.testing.assert_close(bounded, counted, rtol=0, atol=0)
    (gradient,) = torch.autograd.grad(bounded, logits)
    assert gradient[0, item["start_positions"]] < 0 and gradient[0, HEAD:].abs().sum() > 0


def test_every_answer_is_labelled_in_some_cut_and_the_negative_draw_keeps_those(cuts):
    windows, cut = cuts
    labelled = {int(i) for i, _, first, _, _ in cut.items if first}
    answered = {i for i in range(len(windows)) if windows[i]["start_positions"]}
    assert labelled == answered  # answers are short against a 384-token span with 128 tokens of overlap
    positives = LayoutCuts(windows, CUT, HEAD, OVERLAP, negative_fraction=0.0)
    assert positives.windows == cut.windows and len(positives) == int(np.count_nonzero(cut.items[:, 2]))
    assert all(positives[i]["start_positions"] > 0 for i in range(len(positives)))
    some = LayoutCuts(windows, CUT, HEAD, OVERLAP, negative_fraction=0.3, seed=1)
    assert len(positives) < len(some) < len(cut)
    assert some.lengths() == [len(some[i]["input_ids"]) for i in range(len(some))]


def test_cuts_refuse_a_head_or_overlap_that_leaves_no_span(cuts):
    windows, _ = cuts
    with pytest.raises(ValueError, match=r"head .* must be shorter than the cut"):
        LayoutCuts(windows, 128, 128, 0)
    with pytest.raises(ValueError, match=r"overlap in 0\.\.383"):
        LayoutCuts(windows, CUT, HEAD, 384)


def test_finetune_qa_trains_on_cuts_with_long_positions_and_records_them(tmp_path, monkeypatch):
    """finetune-qa --cut-windows: every training input is at most a cut long, some carry positions past the cut
    (their long-window positions), the record names the cuts, and a teacher beside the cuts is refused."""
    import json

    from test_qa_cli import PAGES, write_tiny_source
    from typer.testing import CliRunner

    from longbird.cli import app
    from longbird.heads import LongBirdForQuestionAnswering

    seen = []
    forward = LongBirdForQuestionAnswering.forward

    def recorded(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, *args, **kwargs):
        seen.append((input_ids.shape[1], None if position_ids is None else int(position_ids.max())))
        return forward(self, input_ids, attention_mask, token_type_ids, position_ids, *args, **kwargs)

    monkeypatch.setattr(LongBirdForQuestionAnswering, "forward", recorded)
    runner = CliRunner()
    source = write_tiny_source(tmp_path / "source")
    common = ["--model", str(source), "--preset", "kobigbird", "--max-length", "256", "--train", str(PAGES[0]),
              "--max-steps", "3", "--batch-size", "4", "--negative-fraction", "0.5"]
    result = runner.invoke(app, ["finetune-qa", *common, "--out", str(tmp_path / "cut"), "--cut-windows", "96",
                                 "--cut-overlap", "16"])
    assert result.exit_code == 0, result.output
    assert len(seen) == 3 and all(length <= 96 for length, _ in seen)
    assert max(top for _, top in seen) >= 96  # long-window positions, not 0..95
    record = json.loads((tmp_path / "cut" / "longbird_finetune.json").read_text())
    assert record["cut_windows"] == 96 and record["cut_overlap"] == 16 and record["training_windows"] > 0
