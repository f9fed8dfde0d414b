"""The record a trial's process hands the tune: what :class:`~lit_compute.tuning.recorder.TuneRecorder` measured,
written as JSON by the trial and read back by the tune (and kept in the journal as it was read)."""

from __future__ import annotations

from typing import Any, TypedDict


class Measurement(TypedDict, total=False):
    """One trial's measurement. Rates are per device; ``None`` where nothing was timed."""

    facts: dict[str, Any]  # the run's model and trainer facts (parameters, precision, batch, devices, ...)
    losses: list[float]  # the training loss of each step the numerics check reads
    loss_source: str | None  # where the losses came from (returned by training_step, logged as NAME); None: none
    timed_steps: int  # full steps timed in the steady state (after warm-up and settling)
    remainder_steps: int  # steps after the last full window, not timed
    steps_seen: int
    samples_per_sec: float | None
    ci: float | None  # relative 95% interval of the samples/s
    step_rates: list[float]  # samples/s (or tokens/s) of each timed steady-state step, for paired comparisons
    settling_steps: int  # timed steps before the step time settled, left out of every figure (MSER-5)
    data_wait: float | None  # share of the timed time spent waiting for data
    samples_per_step: float | None
    samples_per_batch: float | None
    skipped_steps: int  # optimizer steps a GradScaler skipped
    stop_reason: str | None  # why the trial stopped before the planned steps (None: it did not)
    peak_memory_gb: float | None
    other_cores: float | None  # cores other processes kept busy on average while the trial was timed
    cpu_count: int  # the machine's CPUs
    tokens_per_sec: float  # token batches: non-padding tokens per second
    tokens_ci: float | None
    tokens_per_batch: float
    flops_per_sample: float | None  # read back from the trial's TensorBoard run (FlopsLogger)
    val_metrics: dict[str, float]  # a drift check with --validate: the validation metrics after its steps
