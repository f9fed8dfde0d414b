"""CountBook without a Trainer: counts by signature, predictions, the failure budget, the checkpoint round-trip."""

from __future__ import annotations

from lit_compute.flops.count_book import CountBook
from lit_compute.flops.counting import FlopCount


def _sig(length: int, stage: str = "train") -> tuple:
    return (stage, (("input_ids", (4, length), "int64"),))


def _count(length: int) -> FlopCount:
    """An exact quadratic in the length, as attention is: forward 10 L^2 + 100 L, backward twice that."""
    forward = 10 * length**2 + 100 * length
    return FlopCount(
        forward=forward,
        backward=2 * forward,
        hardware=3 * forward,
        by_module={"model": 3 * forward},
        forward_by_module={"model": forward},
    )


def test_a_counted_signature_is_known_and_never_counted_again():
    book = CountBook()
    assert book.values(_sig(8)) is None
    assert book.wants_count(_sig(8))
    booked = book.record(_sig(8), _count(8))
    assert booked.values == (1440, 2880, 4320)
    assert not booked.prediction_missed
    assert book.values(_sig(8)) == (1440, 2880, 4320)
    assert not book.wants_count(_sig(8))
    assert book.counted == 1
    assert book.first_train is book.counts[_sig(8)]


def test_new_lengths_are_predicted_exactly_once_the_fit_has_enough_points():
    book = CountBook(verify_every=1000)
    for length in (8, 16, 24, 32, 40, 48):
        if book.values(_sig(length)) is None:
            book.record(_sig(length), _count(length))
    predicted = book.values(_sig(100))
    assert predicted == (10 * 100**2 + 100 * 100, 2 * (10 * 100**2 + 100 * 100), 3 * (10 * 100**2 + 100 * 100))
    assert (book.counted, book.predicted) == (5, 2)  # the sixth length and 100 were predicted


def test_a_wrong_prediction_is_reported_and_stops_prediction_for_that_structure():
    book = CountBook()
    for length in (8, 16, 24, 32, 40, 48):
        book.record(_sig(length), _count(length))
    wrong = FlopCount(forward=1, backward=1, hardware=1)
    assert book.record(_sig(56), wrong).prediction_missed
    assert book.values(_sig(64)) is None  # counted for real from now on


def test_failed_counts_use_up_the_budget_and_then_nothing_is_counted():
    book = CountBook(max_failures=2)
    empty = FlopCount(forward=0, backward=0, hardware=0, uncounted_ops=["aten.foo"])
    first = book.record(_sig(8), empty)
    assert first.values is None
    assert "aten.foo" in first.reason
    assert not first.exhausted
    assert book.values(_sig(8)) is None
    assert not book.wants_count(_sig(8))
    broken = FlopCount(forward=5, backward=5, hardware=5, errors=["mm: bad shape"])
    second = book.record(_sig(9), broken)
    assert second.exhausted
    assert second.reason == "mm: bad shape"
    assert book.exhausted
    assert not book.wants_count(_sig(10))


def test_state_round_trips_counts_and_the_module_table_through_lists():
    book = CountBook()
    book.record(_sig(8), _count(8))
    book.record(_sig(8, "val"), _count(8))
    state = book.state_dict()
    # a checkpoint stores signatures as lists (as torch.save/yaml give them back)
    state["counts"] = [[[sig[0], [[p, list(s), d] for p, s, d in sig[1]]], v] for sig, v in state["counts"]]
    again = CountBook()
    again.load_state_dict(state)
    assert again.values(_sig(8)) == (1440, 2880, 4320)
    assert again.values(_sig(8, "val")) == (1440, 2880, 4320)
    assert again.first_train.by_module == {"model": 4320}
    assert again.counted == 0


def test_a_signature_is_recounted_at_its_16th_64th_256th_occurrence():
    book = CountBook()
    book.record(_sig(8), _count(8))
    due = [n for n in range(1, 300) if book.values(_sig(8)) is not None and book.wants_recount(_sig(8))]
    assert due == [16, 64, 256]


def test_a_recount_that_differs_makes_the_signature_estimated_with_the_mean_of_real_counts():
    book = CountBook()
    first = FlopCount(forward=100, backward=200, hardware=300, by_module={"net": 300})
    book.record(_sig(8), first)
    assert book.values(_sig(8)) == (100, 200, 300)
    assert not book.estimated(_sig(8))
    other = FlopCount(forward=150, backward=300, hardware=450, by_module={"net": 300, "policy": 150, "policy.0": 150})
    booked = book.record(_sig(8), other)
    assert booked.values == (150, 300, 450)  # the recounted batch itself is exact
    assert booked.value_dependent == "two batches of the same shapes counted differently in `policy`"
    assert book.values(_sig(8)) == (125, 250, 375)
    assert book.any_estimated
    assert book.counts[_sig(8)] is first
    assert book.counted == 2
    broken = FlopCount(errors=["mm: bad"])
    assert book.record(_sig(8), broken).values == (100, 200, 300)
    assert book.failures == 0


def test_an_op_whose_flops_follow_values_flags_the_signature_at_once():
    book = CountBook()
    count = _count(8)
    count.value_dependent = {"aten._nested_tensor_from_mask": ["encoder"]}
    assert book.record(_sig(8, "val"), count).value_dependent == "_nested_tensor_from_mask in `encoder`"
    assert book.estimated(_sig(8, "val"))
    assert not book.estimated(_sig(8))


def test_the_optimizer_step_is_kept_apart_from_the_batches_and_added_to_an_accumulating_batch_s_table():
    import dataclasses

    book = CountBook()
    # a count's bytes are its op classes' (here 1,000 and 700)
    stepping = dataclasses.replace(_count(8), by_class={"gemm": (900, 700, 4), "optimizer": (30, 300, 2)})
    accumulating = dataclasses.replace(_count(16), by_class={"gemm": (1800, 700, 4)})
    assert book.optimizer_bytes is None
    assert stepping.bytes == 1_000
    assert book.with_optimizer(_sig(8), stepping) is stepping  # its own optimizer class, unchanged
    assert book.batch_bytes(_sig(8)) == 700  # the optimizer's 300 bytes are the step's, not the batch's
    assert book.optimizer_bytes == 300
    shown = book.with_optimizer(_sig(16), accumulating)
    assert shown.by_class == {"gemm": (1800, 700, 4), "optimizer": (30, 300, 2)}  # whatif prices a whole step
    assert book.batch_bytes(_sig(16)) == 700
    assert book.batch_bytes(None) is None
    book.optimizer_counted = True

    again = CountBook()  # a resumed run: nothing to count again for the optimizer
    again.load_state_dict(book.state_dict())
    assert again.optimizer_class == (30, 300, 2)
    assert again.optimizer_counted
    again.forget_optimizer()  # the model changed
    assert again.optimizer_class is None
    assert not again.optimizer_counted


def test_a_checkpoint_from_before_the_optimizer_flag_counts_its_step_as_counted_when_it_has_counts():
    book = CountBook()
    book.record(_sig(8), _count(8))
    state = book.state_dict()
    del state["optimizer_counted"], state["optimizer_class"]
    again = CountBook()
    again.load_state_dict(state)
    assert again.optimizer_counted
    assert again.optimizer_class is None
