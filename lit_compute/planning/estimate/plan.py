"""What :func:`~lit_compute.planning.estimate.estimate` answers: a row per micro-batch (and rank), the plan around
them, and the one error it raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lit_compute.memory.tracker import PARTS, MemoryBreakdown
from lit_compute.planning.checkpoint_advice import Checkpointing


class EstimateError(ValueError):
    """An estimate that cannot be made (bad config, unknown device): the message names what and the fix."""


@dataclass
class EstimateRow:
    """The predicted peak of one training step per device at one micro-batch size."""

    micro_batch: int
    peak_bytes: int
    parts: dict[str, int]
    fits: bool | None
    rank: int = 0
    at: str = ""
    method: str = "traced on fake tensors"
    reserved_bytes: int | None = None  # CUDA: the caching allocator's reserved peak (model)

    def as_json(self) -> dict[str, Any]:
        return {
            "micro_batch": self.micro_batch,
            "peak_bytes": self.peak_bytes,
            **{f"{p}_bytes": self.parts.get(p, 0) for p in PARTS},
            "fits": self.fits,
            "rank": self.rank,
            "reserved_bytes": self.reserved_bytes,
        }


@dataclass
class Plan:
    """What :func:`estimate` found."""

    rows: list[EstimateRow]
    capacity_bytes: int | None
    capacity_source: str
    largest_fitting: int | None = None
    next_size: EstimateRow | None = None  # the next size up, predicted over the capacity
    checkpointing: list[Checkpointing] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checkpointing_useless: bool = False  # the state alone does not fit: recomputing activations cannot help
    largest_fitting_reserved: int | None = None  # CUDA: the largest whose modelled reserved peak fits

    def summary_json(self) -> dict[str, Any]:
        """What the plan found beyond its rows, for ``--json``'s last line."""
        return {
            "largest_fitting_micro_batch": self.largest_fitting,
            "largest_fitting_micro_batch_reserved": self.largest_fitting_reserved,
            "capacity_bytes": self.capacity_bytes,
            "next_size": self.next_size.as_json() if self.next_size else None,
            "notes": self.notes,
        }


def row(size: int, found: MemoryBreakdown, capacity: int | None, method: str = "traced on fake tensors") -> EstimateRow:
    return EstimateRow(
        micro_batch=size,
        peak_bytes=found.peak,
        parts=dict(found.parts),
        at=found.at,
        fits=None if capacity is None else found.peak <= capacity,
        method=method,
        reserved_bytes=found.reserved,
    )


def gb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e9:.3g} GB"
