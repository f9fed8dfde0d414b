"""CountBook: FLOP counts by batch signature, predicted shapes, a failure budget and a checkpoint round-trip.

The pure bookkeeping behind :class:`~lit_compute.flops.FlopsLogger`, apart from the Lightning hooks that feed it
(as Fabric's ``Throughput`` lives apart from ``ThroughputMonitor``), so it is tested without a Trainer.
A *signature* is :func:`lit_compute._batch.signature`'s ``(stage, ((path, shape, dtype), ...))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lit_compute.flops.counting import FlopCount
from lit_compute.flops.predict import ShapePredictor

__all__ = ["CountBook", "Recorded", "Values"]

#: ``(model forward, model backward, hardware)`` FLOPs of one batch.
Values = tuple[int, int, int]


@dataclass(frozen=True)
class Recorded:
    """What :meth:`CountBook.record` made of a finished count."""

    values: Values | None  # None: the count failed (nothing to log for this signature)
    reason: str = ""  # why it failed
    exhausted: bool = False  # this failure used up the budget: counting is now off
    prediction_missed: bool = False  # the predictor's guess for this signature was wrong (prediction now off for it)


class CountBook:
    """Exact counts by signature (None where counting failed), predictions of new shapes from counted ones, and
    a budget of failed counts after which nothing more is counted.

    Args:
        predict_shapes: Predict new signatures of a structure counted several times
            (:class:`~lit_compute.flops.predict.ShapePredictor`).
        max_failures: Failed counts after which :meth:`wants_count` is always False.
        verify_every: Count one predicted shape in this many for real, to check the fit.
        tolerance: Relative miss above which prediction is turned off for a structure.
    """

    def __init__(self, predict_shapes: bool = True, max_failures: int = 3, verify_every: int = 25,
                 tolerance: float = 1e-3) -> None:
        self.predict_shapes = predict_shapes
        self.max_failures = max_failures
        self.counts: dict[tuple, FlopCount | None] = {}
        self.counted = 0  # counts finished (failed ones included)
        self.predicted = 0  # batches whose values were predicted
        self.failures = 0
        self.first_train: FlopCount | None = None  # the first training count (the per-module table)
        self._predictor = ShapePredictor(verify_every=verify_every, tolerance=tolerance)

    @property
    def exhausted(self) -> bool:
        """True once ``max_failures`` counts failed: nothing more is counted."""
        return self.failures >= self.max_failures

    def values(self, sig: tuple) -> Values | None:
        """Known or predicted values of a signature; None when it must be counted (or counting failed)."""
        if sig in self.counts:
            c = self.counts[sig]
            return None if c is None else (c.forward, c.backward, c.hardware)
        if self.predict_shapes:
            guess = self._predictor.predict(sig)
            if guess is not None:
                self.predicted += 1
                return guess
        return None

    def wants_count(self, sig: tuple) -> bool:
        """Whether a batch of this signature should be counted (call after :meth:`values` returned None)."""
        return sig not in self.counts and not self.exhausted

    def record(self, sig: tuple, count: FlopCount) -> Recorded:
        """Book a finished count of ``sig``. A count with no FLOPs or with formula errors is a failure."""
        self.counted += 1
        if count.total == 0 or count.errors:
            self.failures += 1
            self.counts[sig] = None
            reason = "; ".join(count.errors[:3]) or (
                f"no matmul, convolution or attention ran ({', '.join(count.uncounted_ops) or 'no op with a formula'})"
            )
            return Recorded(None, reason=reason, exhausted=self.failures == self.max_failures)
        self.counts[sig] = count
        values = (count.forward, count.backward, count.hardware)
        missed = self.predict_shapes and not self._predictor.add(sig, values)
        if sig[0] == "train" and self.first_train is None:
            self.first_train = count
        return Recorded(values, prediction_missed=missed)

    # -- checkpoints ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        table = self.first_train
        return {
            "counts": [[sig, [c.forward, c.backward, c.hardware]] for sig, c in self.counts.items() if c is not None],
            "table": None if table is None else {"forward": table.forward, "backward": table.backward,
                                                 "by_module": table.by_module,
                                                 "forward_by_module": table.forward_by_module},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for sig, (fwd, bwd, hw) in state_dict.get("counts", []):
            sig = _as_tuple(sig)
            self.counts[sig] = FlopCount(forward=int(fwd), backward=int(bwd), hardware=int(hw))
            self._predictor.add(sig, (int(fwd), int(bwd), int(hw)))
        table = state_dict.get("table")
        if table:
            self.first_train = FlopCount(forward=table["forward"], backward=table["backward"],
                                         by_module=dict(table["by_module"]),
                                         forward_by_module=dict(table["forward_by_module"]))


def _as_tuple(x: Any) -> Any:
    """Signatures come back from checkpoints as lists; make them tuples again (hashable)."""
    if isinstance(x, (list, tuple)):
        return tuple(_as_tuple(v) for v in x)
    return x
