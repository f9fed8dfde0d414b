"""One evaluation run's FLOPs, samples and clean time, as FlopsLogger sums them for ``compute/val_*``."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class EvalTally:
    """One evaluation run's FLOPs, samples and clean time. Every batch's FLOPs count in the per-step and per-sample
    figures, counted batches included; a counted batch's time is instrument time, so the rate is taken over the
    other batches."""

    start: float = 0.0  # raw clock at the run's start
    instrument: float = 0.0  # the timeline's instrument total at the run's start
    flops: int = 0
    samples: int = 0
    batches: int = 0
    timed_flops: int = 0  # FLOPs of the batches that were not counted (their time is the run's clean time)
    valid: bool = True  # False once a batch's FLOPs were unknown
    estimated: bool = False  # True once a batch's FLOPs were an estimate (a value-dependent signature)
    excluded: float = 0.0  # seconds of counted batches

    def add_batch(
        self, values: tuple[int, int, int] | None, samples: int, counted_s: float | None, estimated: bool
    ) -> None:
        """A batch's FLOPs (None: unknown, the run's figures are then unknown) and samples; ``counted_s``: the seconds
        of a batch counted for real (instrument time: its FLOPs count, its time and FLOPs are left out of the rate)."""
        if counted_s is not None:
            self.excluded += counted_s
        if values is None:
            self.valid = False
            return
        self.flops += values[0]
        self.samples += samples
        self.batches += 1
        if counted_s is None:
            self.timed_flops += values[0]
        self.estimated |= estimated

    def tflops(self, raw_now: float, instrument_now: float) -> float:
        """Model TFLOP/s over the run's clean time; NaN when unknown."""
        if not (self.timed_flops and self.valid):
            return math.nan
        elapsed = raw_now - self.start - (instrument_now - self.instrument) - self.excluded
        return self.timed_flops / elapsed / 1e12 if elapsed > 0 else math.nan

    def per_step_metrics(self, prefix: str, per_sample: float | None, any_estimated: bool) -> dict[str, float]:
        """``compute/{prefix}_flops_per_step`` and its neighbours, when every batch's FLOPs were known."""
        if not (self.batches and self.valid):
            return {}
        out = {f"compute/{prefix}_flops_per_step": self.flops / self.batches}
        if per_sample is not None:
            out[f"compute/{prefix}_flops_per_sample"] = per_sample
        if any_estimated:
            out[f"compute/{prefix}_flops_estimated"] = float(self.estimated)
        return out
