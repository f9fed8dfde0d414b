"""CountBook: FLOP counts by batch signature, predicted shapes, a failure budget and a checkpoint round-trip.

The pure bookkeeping behind :class:`~lit_compute.flops.FlopsLogger`, apart from the Lightning hooks that feed it
(as Fabric's ``Throughput`` lives apart from ``ThroughputMonitor``), so it is tested without a Trainer.
A *signature* is :func:`lit_compute._batch.signature`'s ``(stage, ((path, shape, dtype), ...))``.
"""

from __future__ import annotations

import dataclasses
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
    value_dependent: str = ""  # newly found: this signature's FLOPs depend on the batch's values (why, in words)


#: Occurrences of an exactly counted signature at which it is counted again, to catch FLOPs that depend on a
#: batch's values rather than its shapes (a data-dependent branch): a handful of counts over a whole run (16, 64,
#: 256...: the first after the warm-up steps every benchmark and short run leaves out anyway).
RECOUNT_AT = frozenset(4**k for k in range(2, 13))


class CountBook:
    """Exact counts by signature (None where counting failed), predictions of new shapes from counted ones, and
    a budget of failed counts after which nothing more is counted.

    **Value-dependent FLOPs.** A signature is *estimated* when its FLOPs depend on the batch's values: found at
    once when a count ran an op that makes them so (:data:`~lit_compute.flops.counting.VALUE_DEPENDENT_OPS`), or
    when a recount of the same signature (at its 16th, 64th, 256th... occurrence, :data:`RECOUNT_AT`) differs from
    the earlier ones. Its values are then the mean of every real count of it, and :meth:`estimated` says why.

    Args:
        predict_shapes: Predict new signatures of a structure counted several times
            (:class:`~lit_compute.flops.predict.ShapePredictor`).
        max_failures: Failed counts after which :meth:`wants_count` is always False.
        verify_every: Count one predicted shape in this many for real, to check the fit.
        tolerance: Relative miss above which prediction is turned off for a structure.
    """

    def __init__(
        self, predict_shapes: bool = True, max_failures: int = 3, verify_every: int = 25, tolerance: float = 1e-3
    ) -> None:
        self.predict_shapes = predict_shapes
        self.max_failures = max_failures
        self.counts: dict[tuple, FlopCount | None] = {}
        self.counted = 0  # counts finished (failed ones included)
        self.predicted = 0  # batches whose values were predicted
        self.failures = 0
        self.first_train: FlopCount | None = None  # the first training count (the per-module table)
        self._predictor = ShapePredictor(verify_every=verify_every, tolerance=tolerance)
        self._seen: dict[tuple, int] = {}  # lookups of each exactly counted signature
        self._samples: dict[tuple, list[Values]] = {}  # every real count of each signature
        self._estimated: dict[tuple, str] = {}  # signature -> why its FLOPs depend on the batch's values
        self._bytes: dict[tuple, int] = {}  # a batch's own bytes, by exactly counted training signature
        # the optimizer's op class ``(flops, bytes, kernels)`` from the last count whose batch stepped: the op-class
        # table of an accumulating batch's count (no optimizer step in it) carries it, since whatif prices a step
        # from that table; kept in the checkpoint, so a resumed run counts nothing again for it
        self.optimizer_class: tuple[int, int, int] | None = None
        self.optimizer_counted = False  # a batch that stepped the optimizer was counted (once is enough)

    @property
    def exhausted(self) -> bool:
        """True once ``max_failures`` counts failed: nothing more is counted."""
        return self.failures >= self.max_failures

    def values(self, sig: tuple) -> Values | None:
        """Known or predicted values of a signature; None when it must be counted (or counting failed)."""
        if sig in self.counts:
            c = self.counts[sig]
            if c is None:
                return None
            self._seen[sig] = self._seen.get(sig, 0) + 1
            samples = self._samples.get(sig)
            if sig in self._estimated and samples:
                return tuple(round(sum(v[i] for v in samples) / len(samples)) for i in range(3))  # type: ignore[return-value]
            return (c.forward, c.backward, c.hardware)
        if self.predict_shapes:
            guess = self._predictor.predict(sig)
            if guess is not None:
                self.predicted += 1
                return (guess[0], guess[1], guess[2])
        return None

    def wants_count(self, sig: tuple) -> bool:
        """Whether a batch of this signature should be counted (call after :meth:`values` returned None)."""
        return sig not in self.counts and not self.exhausted

    def wants_recount(self, sig: tuple) -> bool:
        """Whether a batch of this exactly counted signature should be counted again (call after :meth:`values`
        returned its values): at its 16th, 64th, 256th... occurrence."""
        return self.counts.get(sig) is not None and self._seen.get(sig, 0) in RECOUNT_AT and not self.exhausted

    def estimated(self, sig: tuple) -> str:
        """Why the FLOPs of this signature depend on the batch's values ("" when they do not)."""
        return self._estimated.get(sig, "")

    @property
    def any_estimated(self) -> bool:
        return bool(self._estimated)

    def record(self, sig: tuple, count: FlopCount) -> Recorded:
        """Book a finished count of ``sig``. A count with no FLOPs or with formula errors is a failure."""
        self.counted += 1
        earlier = self.counts.get(sig)
        if (count.total == 0 or count.errors) and earlier is not None:  # a failed recount: keep what is known
            return Recorded((earlier.forward, earlier.backward, earlier.hardware))
        if count.total == 0 or count.errors:
            self.failures += 1
            self.counts[sig] = None
            reason = "; ".join(count.errors[:3]) or (
                f"no matmul, convolution or attention ran ({', '.join(count.uncounted_ops) or 'no op with a formula'})"
            )
            return Recorded(None, reason=reason, exhausted=self.failures == self.max_failures)
        values = (count.forward, count.backward, count.hardware)
        self._samples.setdefault(sig, []).append(values)
        why = ""
        if sig not in self._estimated:
            if count.value_dependent:
                why = "; ".join(
                    f"{op.removeprefix('aten.')} in {', '.join(f'`{p}`' for p in paths[:3])}"
                    for op, paths in sorted(count.value_dependent.items())
                )
            elif earlier is not None and (earlier.forward, earlier.backward, earlier.hardware) != values:
                changed = _changed_modules(earlier, count)
                why = "two batches of the same shapes counted " + (
                    "differently in " + ", ".join(f"`{p}`" for p in changed[:3]) if changed else "differently"
                )
            if why:
                self._estimated[sig] = why
        if earlier is not None:  # a recount: the first count keeps the module table and the predictor's point
            return Recorded(values, value_dependent=why)
        self.counts[sig] = count
        missed = self.predict_shapes and not why and not self._predictor.add(sig, values)
        if sig[0] == "train" and self.first_train is None:
            self.first_train = count
        return Recorded(values, prediction_missed=missed, value_dependent=why)

    # -- the optimizer's step -------------------------------------------------------------------------
    def with_optimizer(self, sig: tuple, count: FlopCount) -> FlopCount:
        """A booked training count as the op-class table shows it: the optimizer's op class taken from a count whose
        batch stepped, or added to an accumulating batch's count from the last one that did; the batch's own bytes
        (the optimizer's are the step's, :attr:`optimizer_bytes`) kept for :meth:`batch_bytes`."""
        optimizer = count.by_class.get("optimizer")
        self._bytes[sig] = count.bytes - int(optimizer[1] if optimizer else 0)
        if optimizer is not None:
            self.optimizer_class = optimizer
        elif self.optimizer_class is not None:
            count = dataclasses.replace(count, by_class={**count.by_class, "optimizer": self.optimizer_class})
        return count

    def batch_bytes(self, sig: tuple | None) -> int | None:
        """The bytes a batch of this exactly counted training signature moves, its optimizer's step left out."""
        return self._bytes.get(sig) if sig is not None else None

    @property
    def optimizer_bytes(self) -> int | None:
        """The bytes one optimizer step moves (once a step, an accumulated one's too); None before it was counted."""
        return int(self.optimizer_class[1]) if self.optimizer_class is not None else None

    def forget_optimizer(self) -> None:
        """The model changed: its optimizer's step is counted again."""
        self.optimizer_class, self.optimizer_counted = None, False

    # -- checkpoints ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        table = self.first_train
        return {
            "optimizer_class": self.optimizer_class,
            "optimizer_counted": self.optimizer_counted,
            "counts": [[sig, [c.forward, c.backward, c.hardware]] for sig, c in self.counts.items() if c is not None],
            "table": None
            if table is None
            else {
                "forward": table.forward,
                "backward": table.backward,
                "by_module": table.by_module,
                "forward_by_module": table.forward_by_module,
            },
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for sig, (fwd, bwd, hw) in state_dict.get("counts", []):
            sig = _as_tuple(sig)
            self.counts[sig] = FlopCount(forward=int(fwd), backward=int(bwd), hardware=int(hw))
            self._predictor.add(sig, (int(fwd), int(bwd), int(hw)))
        kept = state_dict.get("optimizer_class")
        self.optimizer_class = (int(kept[0]), int(kept[1]), int(kept[2])) if kept else None
        # a checkpoint from before the flag: a run with counts had counted its optimizer's step
        self.optimizer_counted = bool(state_dict.get("optimizer_counted", bool(state_dict.get("counts"))))
        table = state_dict.get("table")
        if table:
            self.first_train = FlopCount(
                forward=table["forward"],
                backward=table["backward"],
                by_module=dict(table["by_module"]),
                forward_by_module=dict(table["forward_by_module"]),
            )


def _changed_modules(a: FlopCount, b: FlopCount) -> list[str]:
    """The outermost modules whose counts differ between two counts (``policy``, not its layers)."""
    paths = sorted(p for p in set(a.by_module) | set(b.by_module) if a.by_module.get(p) != b.by_module.get(p))
    return [p for p in paths if not any(p.startswith(q + ".") for q in paths)]


def _as_tuple(x: Any) -> Any:
    """Signatures come back from checkpoints as lists; make them tuples again (hashable)."""
    if isinstance(x, (list, tuple)):
        return tuple(_as_tuple(v) for v in x)
    return x
