import math

import pytest
import torch

from longbird.positions import extend_position_table, taper_amplitudes


@pytest.fixture
def rows():
    return torch.randn(16, 6, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("schedule", ["exp", "power", "copy"])
@pytest.mark.parametrize("mode", ["scale", "centered"])
def test_rows_below_L_are_bit_identical(rows, schedule, mode):
    table = extend_position_table(rows, 56, schedule, mode, tau=2.0)
    assert table.shape == (56, 6)
    assert torch.equal(table[:16], rows)


def test_schedules_match_their_formulas():
    torch.testing.assert_close(taper_amplitudes(4, "exp", 2.0), torch.tensor([1, math.exp(-0.5), math.exp(-1), math.exp(-1.5)], dtype=torch.float64))
    torch.testing.assert_close(taper_amplitudes(4, "power", 2.0), torch.tensor([1, 0.5, 0.25, 0.125], dtype=torch.float64))
    torch.testing.assert_close(taper_amplitudes(3, "copy"), torch.ones(3, dtype=torch.float64))


def test_positions_beyond_L_follow_the_schedule(rows):
    scaled = extend_position_table(rows, 40, "power", "scale", tau=2.0)
    torch.testing.assert_close(scaled[16:32], 0.5 * rows)
    torch.testing.assert_close(scaled[32:40], 0.25 * rows[:8])
    centered = extend_position_table(rows, 40, "exp", "centered", tau=3.0)
    mean = rows.mean(0)
    torch.testing.assert_close(centered[16:32], mean + math.exp(-1 / 3) * (rows - mean))
    copied = extend_position_table(rows, 40, "copy", "scale")
    torch.testing.assert_close(copied[16:32], rows)


def test_bad_taper_arguments_name_the_value(rows):
    with pytest.raises(ValueError, match="schedule .* got 'cosine'"):
        extend_position_table(rows, 40, "cosine")
    with pytest.raises(ValueError, match="target length \\(8\\) is below"):
        extend_position_table(rows, 8)
    with pytest.raises(ValueError, match="tau must be > 0; got 0"):
        extend_position_table(rows, 40, tau=0)


@pytest.mark.parametrize("schedule", ["exp", "copy"])
@pytest.mark.parametrize("mode", ["scale", "centered"])
def test_repetitions_from_a_start_row_skip_the_rows_before_it(rows, schedule, mode):
    """start = s0: rows beyond L cycle over S[s0:] with period L - s0, repetition k scaled by a_k (k from 1)."""
    table = extend_position_table(rows, 50, schedule, mode, tau=2.0, start=4)
    assert table.shape == (50, 6) and torch.equal(table[:16], rows)
    amplitude = taper_amplitudes(4, schedule, 2.0).float()
    mean = rows.mean(0) if mode == "centered" else torch.zeros(6)
    for m in range(50 - 16):
        k, row = 1 + m // 12, 4 + m % 12
        torch.testing.assert_close(table[16 + m], mean + amplitude[k] * (rows[row] - mean))
    # start 0 is the plain law, bit for bit
    assert torch.equal(extend_position_table(rows, 50, schedule, mode, tau=2.0, start=0),
                       extend_position_table(rows, 50, schedule, mode, tau=2.0))


def test_a_start_outside_the_source_rows_is_refused(rows):
    with pytest.raises(ValueError, match="start must be a source row, 0 <= start < 16; got 16"):
        extend_position_table(rows, 40, start=16)
    assert torch.equal(extend_position_table(rows, 16, start=3), rows)
