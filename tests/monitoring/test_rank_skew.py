"""The straggler finder, without a Trainer."""

import math

import pytest

from lit_compute.monitoring.rank_skew import find_straggler


def test_a_rank_that_waits_on_data_is_named_with_data():
    s = find_straggler([2.0, 2.0, 50.0, 2.0], [10.0, 10.0, 10.0, 10.0])
    assert (s.rank, s.cause) == (2, "data")
    assert s.skew == pytest.approx(60 / 12) and s.extra_ms == pytest.approx(48)
    assert "rank 2 is a straggler" in s.advice(4, 1.25) and "waited 48.0 ms longer" in s.advice(4, 1.25)


def test_a_rank_that_computes_longer_is_named_with_compute():
    s = find_straggler([2.0, 3.0], [10.0, 30.0])
    assert (s.rank, s.cause) == (1, "compute")
    assert "computed its forward 20.0 ms longer" in s.advice(2, 1.25) and "Cause: compute" in s.advice(2, 1.25)


def test_even_ranks_have_skew_one_and_nothing_unknown_is_guessed():
    assert find_straggler([5.0, 5.0], [10.0, 10.0]).skew == pytest.approx(1.0)
    assert find_straggler([5.0, math.nan], [10.0, 10.0]) is None
    assert find_straggler([5.0], [10.0]) is None
