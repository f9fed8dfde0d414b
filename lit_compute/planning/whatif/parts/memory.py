"""The memory part: MemoryMonitor's parts of the run at its peak scaled by precision, sharding and micro-batch to the
scenario, against the chip's capacity."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lit_compute.hardware.dtypes import half_weights
from lit_compute.planning.whatif.calibration import Calibration
from lit_compute.planning.whatif.facts import RunFacts, Scenario
from lit_compute.planning.whatif.parts.compute import value_bytes
from lit_compute.planning.whatif.parts.part import Part

__all__ = ["MemoryPart", "price"]


@dataclass(frozen=True)
class MemoryPart(Part):
    """The predicted peak (``peak_bytes``) and whether it fits the chip (``fits``); None for both without the run's
    memory parts. Takes no time (``seconds`` 0)."""

    fits: bool | None = None
    peak_bytes: float | None = None


def price(run: RunFacts, scenario: Scenario, cal: Calibration) -> MemoryPart:
    """The peak memory of ``run`` on ``scenario`` (``cal`` is not needed)."""
    fits, peak = _memory(run, scenario)
    return MemoryPart(0.0, "memory", (), fits, peak)


def _memory(run: RunFacts, scenario: Scenario) -> tuple[bool | None, float | None]:
    """MemoryMonitor's parts of the run scaled to the scenario, against the chip's memory (None without them)."""
    if not run.memory or not math.isfinite(scenario.chip.memory):
        return None, None
    ratio = scenario.micro_batch / run.samples
    value = value_bytes(scenario.precision, "elementwise") / value_bytes(run.precision, "elementwise")
    weights = (2.0 if half_weights(scenario.precision) else 4.0) / (2.0 if half_weights(run.precision) else 4.0)
    shards = max(1, scenario.devices // max(1, run.tensor_parallel)) if run.sharded else 1
    run_shards = run.data_parallel if run.sharded else 1
    kept = (
        (run.memory["parameters"] + run.memory["gradients"] + run.memory["optimizer"]) * weights * run_shards / shards
    )
    peak = kept + (run.memory["activations"] + run.memory["other"]) * ratio * value
    return peak <= scenario.chip.memory, peak
