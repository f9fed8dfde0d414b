"""Stragglers: which rank the others wait for, and whether it waits on data or computes longer (pure logic;
:class:`~lit_compute.monitoring.StepTimeMonitor` feeds it each logging step's per-rank times).

Under synchronous data parallelism every rank's step lasts as long as the slowest rank's: the others wait for
it inside the gradient all-reduce, so step times are nearly equal and name nobody. What differs is each rank's
*own work* before the first synchronisation: its data wait plus its forward (batch arrival to the first
backward). The straggler is the rank with the most own work; the skew is its own work over the median of the
other ranks'; the cause is the part (data wait or forward) by which it exceeds them most.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Straggler:
    rank: int
    skew: float  # own work of the slowest rank / the median of the other ranks'
    cause: str  # "data" or "compute"
    extra_ms: float  # own work beyond the other ranks' median, per step
    wait_ms: float
    forward_ms: float
    median_wait_ms: float
    median_forward_ms: float

    def advice(self, world_size: int, threshold: float) -> str:
        what = (f"waited {self.wait_ms - self.median_wait_ms:.1f} ms longer for its batches than the other ranks "
                f"({self.wait_ms:.1f} vs {self.median_wait_ms:.1f} ms per step, median)" if self.cause == "data" else
                f"computed its forward {self.forward_ms - self.median_forward_ms:.1f} ms longer than the other ranks "
                f"({self.forward_ms:.1f} vs {self.median_forward_ms:.1f} ms per step, median)")
        fix = ("its input pipeline is slower: check that rank's loader (num_workers per device, storage or "
               "network of its node, a shard with larger samples)" if self.cause == "data" else
               "its device is slower: a throttled or shared GPU, a noisy neighbour on its CPU, a slower node")
        return (f"StepTimeMonitor: rank {self.rank} is a straggler: its own work per step is {self.skew:.2f}x the "
                f"other ranks' median (threshold straggler_skew={threshold}); it {what}. The other {world_size - 1} "
                f"rank(s) wait for it at every gradient synchronisation, {self.extra_ms:.1f} ms per step. Cause: "
                f"{self.cause} - {fix}.")


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def find_straggler(wait_ms: Sequence[float], forward_ms: Sequence[float]) -> Straggler | None:
    """The slowest rank by own work (``wait + forward``), from per-rank means; None with fewer than two ranks or a
    rank that knows nothing (NaN)."""
    if len(wait_ms) < 2 or len(wait_ms) != len(forward_ms):
        return None
    if not all(math.isfinite(v) for v in (*wait_ms, *forward_ms)):
        return None
    own = [w + f for w, f in zip(wait_ms, forward_ms)]
    rank = max(range(len(own)), key=lambda r: own[r])
    others = [r for r in range(len(own)) if r != rank]
    median_own = _median([own[r] for r in others])
    median_wait, median_forward = _median([wait_ms[r] for r in others]), _median([forward_ms[r] for r in others])
    skew = own[rank] / median_own if median_own > 0 else (math.inf if own[rank] > 0 else 1.0)
    cause = "data" if wait_ms[rank] - median_wait >= forward_ms[rank] - median_forward else "compute"
    return Straggler(rank=rank, skew=skew, cause=cause, extra_ms=own[rank] - median_own, wait_ms=wait_ms[rank],
                     forward_ms=forward_ms[rank], median_wait_ms=median_wait, median_forward_ms=median_forward)
