"""The straggler finder, without a Trainer."""

import math

import pytest

from lit_compute.monitoring.rank_skew import find_straggler


def test_a_rank_that_waits_on_data_is_named_with_data():
    s = find_straggler([2.0, 2.0, 50.0, 2.0], [10.0, 10.0, 10.0, 10.0])
    assert (s.rank, s.cause) == (2, "data")
    assert s.skew == pytest.approx(60 / 12)
    assert s.extra_ms == pytest.approx(48)
    assert "rank 2 is a straggler" in s.advice(4, 1.25)
    assert "waited 48.0 ms longer" in s.advice(4, 1.25)


def test_a_rank_that_computes_longer_is_named_with_compute():
    s = find_straggler([2.0, 3.0], [10.0, 30.0])
    assert (s.rank, s.cause) == (1, "compute")
    assert "computed its forward 20.0 ms longer" in s.advice(2, 1.25)
    assert "Cause: compute" in s.advice(2, 1.25)


def test_even_ranks_have_skew_one_and_nothing_unknown_is_guessed():
    assert find_straggler([5.0, 5.0], [10.0, 10.0]).skew == pytest.approx(1.0)
    assert find_straggler([5.0, math.nan], [10.0, 10.0]) is None
    assert find_straggler([5.0], [10.0]) is None


def test_the_forwards_time_in_collectives_is_not_own_work():
    # FSDP2/tensor parallel: rank 0 waits 240 ms inside its forward's collectives for rank 1, which computed 240 ms
    # longer; both forwards last 250 ms, so the forward alone would call them even
    s = find_straggler([2.0, 2.0], [250.0, 250.0], forward_comm_ms=[241.0, 1.0], comm_ms=[245.0, 5.0])
    assert (s.rank, s.cause) == (1, "compute")
    assert s.extra_ms == pytest.approx(240)
    assert s.forward_ms == pytest.approx(249)
    assert s.median_forward_ms == pytest.approx(9)
    advice = s.advice(2, 1.25)
    assert "time blocked in collectives left out" in advice
    assert "The others spent 240.0 ms more per step blocked in collectives than it did" in advice
    # a slow loader on rank 1: rank 0's forward is the longer one (it waits inside it), yet rank 1 is named, data
    s = find_straggler([2.0, 242.0], [250.0, 10.0], forward_comm_ms=[241.0, 1.0])
    assert (s.rank, s.cause) == (1, "data")
    assert find_straggler([2.0, 242.0], [250.0, 10.0]).rank == 0  # what the forward alone said
    assert find_straggler([2.0, 2.0], [250.0, 250.0], forward_comm_ms=[241.0, math.nan]) is None


def test_slow_communication_is_named_only_when_every_rank_waits_in_collectives():
    from lit_compute.monitoring.rank_skew import communication_bound

    advice = communication_bound([120.0, 110.0], [300.0, 300.0], 0.25)
    assert advice
    assert "at least 110.0 ms of its 300.0 ms step (37%)" in advice
    assert "cannot say whose" in advice
    assert communication_bound([200.0, 10.0], [300.0, 300.0], 0.25) is None  # one rank waits: a straggler's sign
    assert communication_bound([120.0, math.nan], [300.0, 300.0], 0.25) is None
