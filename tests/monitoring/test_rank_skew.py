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


def _window_of(steps, size=8):
    """A StragglerWindow fed per-step (wait, forward) pairs of two ranks: a driven clock, one logging step each."""
    from lit_compute.monitoring.rank_skew import StragglerWindow

    window = StragglerWindow(size, 1.25)
    found = []
    for (wait0, fwd0), (wait1, fwd1) in steps:
        step = max(wait0 + fwd0, wait1 + fwd1) + 20.0
        window.add([wait0, wait1], [fwd0, fwd1], [0.0, 0.0], [0.0, 0.0], [step, step])
        found.append(window.straggler())
    return window, found


def test_one_five_fold_step_among_even_ones_is_a_spike_not_a_straggler():
    from lit_compute.monitoring.rank_skew import StragglerWindow

    even = ((2.0, 10.0), (2.0, 10.0))
    # rank 1 a hair slower at every step (the slowest in all of them), and once 5x
    steps = [((2.0, 10.0), (2.0, 10.1))] * 5 + [((2.0, 10.0), (2.0, 58.0))] + [((2.0, 10.0), (2.0, 10.1))] * 6
    _, found = _window_of(steps)
    assert found == [None] * 12
    _, found = _window_of([even] * 3 + [((2.0, 10.0), (50.0, 10.0))] + [even] * 8)
    assert found == [None] * 12
    # the single step is over the threshold on its own: what StepTimeMonitor counts as a spike
    window = StragglerWindow(8, 1.25)
    slowest = window.add([2.0, 2.0], [10.0, 58.0], [0.0, 0.0], [0.0, 0.0], [80.0, 80.0])
    assert window.spike(slowest, [80.0, 80.0])
    assert window.straggler() is None
    window, _ = _window_of([even] * 3 + [((2.0, 10.0), (50.0, 10.0))] + [even] * 4)
    assert window.full
    assert window.spikes(window.straggler()) == 1


def test_a_rank_slow_in_six_of_eight_steps_is_a_straggler_with_the_windows_medians():
    slow, fast = ((2.0, 10.0), (2.0, 40.0)), ((2.0, 10.0), (2.0, 10.0))
    _, found = _window_of([slow, fast, slow, slow, fast, slow, slow, slow])
    assert found[:7] == [None] * 7  # a full window first
    last = found[-1]
    assert (last.rank, last.cause, last.slowest_in, last.logs) == (1, "compute", 6, 8)
    assert last.skew == pytest.approx(42 / 12)
    advice = last.advice(2, 1.25)
    assert "rank 1 is a straggler" in advice
    assert "the slowest rank in 6 of the last 8 logging steps" in advice
    # the same rank slow in only half of a full window: nobody
    window, _ = _window_of([fast] * 4 + [slow] * 4)
    assert window.straggler() is None


def test_even_ranks_whose_skews_scatter_widely_name_nobody_and_a_steadily_slow_rank_is_still_named():
    """#70 item 2: two ranks sharing two busy cores scatter: one is the slower in 6 of 8 steps by 1.3-1.6x and the
    faster by as much in the other two (the lower median skew 1.3 is over 1.25). Its mean log skew's 95% interval
    reaches below the threshold: noise, nobody named. A rank about 2x slower at every step, as a slow device is, is
    named; so is one 2x slower in 6 of 8 steps and a little faster in the others over a window of 16 (over 8, the
    two fast steps leave its mean inside the scatter)."""
    noisy = [15.0, 13.0, 14.5, 7.0, 16.0, 6.5, 13.0, 12.9]
    window, found = _window_of([((0.0, 10.0), (0.0, f)) for f in noisy])
    assert window.full
    assert found[-1] is None
    steady = [20.0, 22.0, 19.0, 21.0, 23.0, 20.0, 18.0, 21.0]
    _, found = _window_of([((0.0, 10.0), (0.0, f)) for f in steady])
    assert found[-1] is not None
    assert found[-1].rank == 1
    assert found[-1].slowest_in == 8
    mostly = [20.0, 20.0, 9.0, 20.0, 20.0, 9.0, 20.0, 20.0]
    _, found = _window_of([((0.0, 10.0), (0.0, f)) for f in mostly])
    assert found[-1] is None
    _, found = _window_of([((0.0, 10.0), (0.0, f)) for f in mostly * 2], size=16)
    assert found[-1] is not None
    assert (found[-1].rank, found[-1].slowest_in) == (1, 12)


def test_a_window_with_too_few_steps_or_slow_by_turns_names_nobody():
    from lit_compute.monitoring.rank_skew import StragglerWindow

    slow0, slow1 = ((2.0, 40.0), (2.0, 10.0)), ((2.0, 10.0), (2.0, 40.0))
    _, found = _window_of([slow1] * 7)
    assert found == [None] * 7  # 7 logging steps: the window (8) is not full
    window, found = _window_of([slow1] * 2, size=2)
    assert found[-1].rank == 1  # a shorter window names sooner
    assert window.spikes(found[-1]) == 0  # the straggler's own steps are not spikes
    # each rank slow by turns, a full window: neither is the slowest most of the time
    window, _ = _window_of([slow0, slow1] * 6)
    assert window.straggler() is None
    with pytest.raises(ValueError, match="size=1"):
        StragglerWindow(1, 1.25)
