"""What every part of a predicted step returns: its seconds, what bounds it, and what it wants the user told."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Part"]


@dataclass(frozen=True)
class Part:
    """One physical effect's share of a target step, per optimizer step and device. ``bound_by`` names what limits it
    as the output's bottleneck column says it ("compute", "memory bandwidth", "input", "host dispatch",
    "communication"); ``notes`` are said beside the prediction, in order."""

    seconds: float
    bound_by: str
    notes: tuple[str, ...] = ()
