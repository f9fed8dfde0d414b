"""The training steps' FLOPs between two logging steps, as FlopsLogger sums them: the step in progress (over its
micro-batches), the last finished step, and the clean steps whose time gives the rate."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lit_compute.timeline import StepRecord

Values = tuple[int, int, int]  # model forward, model backward, hardware FLOPs


@dataclass
class TrainTally:
    """FLOPs of the training steps since the last logging step."""

    step: list[int] = field(default_factory=lambda: [0, 0, 0])  # the step in progress (model fwd, bwd, hardware)
    step_known: bool = True  # False once a batch of the step had unknown FLOPs
    step_bytes: int | None = 0  # bytes of the step in progress (None: a batch of unknown bytes)
    step_estimated: bool = False
    last: tuple[int, int, int | None] | None = None  # (model, hardware, samples) of the last finished step
    last_bytes: int | None = None
    last_estimated: bool = False
    window: list[tuple[StepRecord, int, int]] = field(default_factory=list)  # clean steps: (record, model, hardware)
    token_steps: list[StepRecord] = field(default_factory=list)  # every step's tokens (the padding fraction)

    def add_batch(self, values: Values | None, moved: int | None, estimated: bool) -> None:
        """A micro-batch of the step in progress: its FLOPs (None: unknown) and bytes."""
        if values is None:
            self.step_known = False
        else:
            self.step = [a + b for a, b in zip(self.step, values)]
        self.step_bytes = self.step_bytes + moved if self.step_bytes is not None and moved is not None else None
        self.step_estimated |= estimated

    def add_step_bytes(self, moved: int) -> None:
        """Bytes of the step in progress that no one micro-batch holds (the optimizer's step)."""
        if self.step_bytes is not None:
            self.step_bytes += moved

    def end_step(self, record: StepRecord) -> None:
        model, hardware = self.step[0] + self.step[1], self.step[2]
        known, self.step, self.step_known = self.step_known, [0, 0, 0], True
        self.last_bytes, self.step_bytes = self.step_bytes, 0
        self.last = (model, hardware, record.samples) if known else None
        self.last_estimated, self.step_estimated = self.step_estimated, False
        if known and record.clean:
            self.window.append((record, model, hardware))
        if record.tokens is not None and record.real_tokens is not None:
            self.token_steps.append(record)

    def take_rates(self) -> tuple[float, float, float, float | None]:
        """Model and hardware TFLOP/s over the clean steps since the last call (NaN when none), the seconds they
        were timed over, and the padding fraction of the token steps (None without tokens); starts a new window."""
        window, self.window = self.window, []
        token_steps, self.token_steps = self.token_steps, []
        positions = sum(r.tokens or 0 for r in token_steps)
        padding = 1.0 - sum(r.real_token_count() or 0 for r in token_steps) / positions if positions else None
        seconds = sum(sum(r.device_times()) for r, _, _ in window)
        if not (seconds > 0 and window):
            return math.nan, math.nan, 0.0, padding
        return (
            sum(m for _, m, _ in window) / seconds / 1e12,
            sum(h for _, _, h in window) / seconds / 1e12,
            seconds,
            padding,
        )

    def last_step_metrics(self, per_sample: float | None, any_estimated: bool) -> dict[str, float]:
        """The last finished step's ``compute/flops_per_step`` and its neighbours (none when its FLOPs are unknown);
        ``per_sample``: its model FLOPs per sample."""
        if self.last is None:
            return {}
        model, hardware, _ = self.last
        out = {"compute/flops_per_step": float(model), "compute/hardware_flops_per_step": float(hardware)}
        if self.last_bytes:
            out["compute/bytes_per_step"] = float(self.last_bytes)
        if per_sample is not None:
            out["compute/flops_per_sample"] = per_sample
        if any_estimated:
            out["compute/flops_estimated"] = float(self.last_estimated)
        return out


def global_rates(local: float, reduced: dict[str, float]) -> dict[str, float]:
    """A training logging event's global figures from its all-reduced sums (``flops``, ``tflops``): the step's global
    FLOPs where every rank knew its own, and this rank's and the global TFLOP/s where both are known."""
    out = {}
    if math.isfinite(reduced.get("flops", math.nan)):
        out["compute/global_flops_per_step"] = reduced["flops"]
    if math.isfinite(local) and math.isfinite(reduced.get("tflops", math.nan)):
        out.update({"compute/tflops_per_sec": local, "compute/global_tflops_per_sec": reduced["tflops"]})
    return out
