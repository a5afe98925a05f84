"""Which windows are read together (`data.batching.plan_batches`): longest first, bounded in windows and padded
tokens, and a window joins a batch only if it is at least `min_fill` of the batch's longest (padding costs about what
real tokens cost). Prediction (`qa.score_windows`) reads in that order and still returns every window in the order
given, with the outputs it gets alone."""

from __future__ import annotations

import itertools

import pytest

from longbird.data.batching import MIN_BATCH_FILL, plan_batches
from longbird.qa import score_windows
from longbird.reader import Reader
from test_qa_cli import tiny_qa, tiny_source  # noqa: F401  (fixtures)


def test_a_much_shorter_window_is_not_padded_into_a_long_batch():
    # the long reader's 4,096-token document: a full window and a 2,096-token one
    assert plan_batches([4096, 2096], max_windows=4) == [[0], [1]]
    assert MIN_BATCH_FILL == 0.75
    # 400 >= 0.75 x 512 joins, 380 does not; ties keep the given order
    assert plan_batches([380, 512, 400, 512], max_windows=8) == [[1, 3, 2], [0]]
    assert plan_batches([300, 512, 30, 512, 490, 35, 700, 400, 512], max_tokens=1_536) == [
        [6], [1, 3, 8], [4, 7], [0], [5, 2]]


@pytest.mark.parametrize("max_windows, max_tokens", [(1, None), (2, None), (3, 1_000), (None, 1_536), (None, 100)])
def test_every_window_once_longest_first_within_the_bounds(max_windows, max_tokens):
    lengths = [300, 512, 30, 512, 490, 35, 700, 400, 512]
    batches = plan_batches(lengths, max_windows=max_windows, max_tokens=max_tokens)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    flat = [lengths[i] for batch in batches for i in batch]
    assert flat == sorted(lengths, reverse=True)
    for batch in batches:
        longest = lengths[batch[0]]
        assert all(lengths[i] >= MIN_BATCH_FILL * longest for i in batch)
        if len(batch) > 1:
            assert max_windows is None or len(batch) <= max_windows
            assert max_tokens is None or len(batch) * longest <= max_tokens
    # filled as far as the bounds allow: the window opening each batch could not have joined the one before
    for before, after in itertools.pairwise(batches):
        longest, joining = lengths[before[0]], lengths[after[0]]
        assert ((max_windows is not None and len(before) + 1 > max_windows)
                or (max_tokens is not None and (len(before) + 1) * longest > max_tokens)
                or joining < MIN_BATCH_FILL * longest)


def test_a_batch_holds_at_least_one_window():
    with pytest.raises(ValueError, match="at least one window"):
        plan_batches([10], max_windows=0)


def test_prediction_returns_windows_in_order_as_read_alone(tiny_qa):
    reader = Reader(tiny_qa)
    features = []
    for repeat in (60, 7, 25):  # documents of several windows, the last window of each shorter
        features += reader.prepare("대한민국의 수도는?", "서울은 대한민국의 수도이다. " * repeat).features
    lengths = [len(feature.input_ids) for feature in features]
    assert len(set(lengths)) > 2 and plan_batches(lengths, max_windows=8) != [list(range(len(features)))]
    batched = score_windows(reader.model, features, batch_size=8)
    alone = score_windows(reader.model, features, batch_size=1)
    for got, expected, feature in zip(batched, alone, features):
        assert got.feature is feature and expected.feature is feature
        assert [span[1:] for span in got.spans] == [span[1:] for span in expected.spans]
        # the same row padded into another batch: fp32 sums in another layout, ~1e-6 on logits of size ~1
        assert [span[0] for span in got.spans] == pytest.approx([span[0] for span in expected.spans], abs=1e-4)
