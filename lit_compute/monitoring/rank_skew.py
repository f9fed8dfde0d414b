"""Stragglers: which rank the others wait for, and whether it waits on data or computes longer (pure logic;
:class:`~lit_compute.monitoring.StepTimeMonitor` feeds it each logging step's per-rank times).

Under synchronous parallelism every rank's step lasts as long as the slowest rank's: the others wait for it inside
a collective, so step times are nearly equal and name nobody. What differs is each rank's *own work* in its
forward: its data wait plus its forward (batch arrival to the first backward) less the time it sat blocked in
collectives there (:mod:`lit_compute.collective_clock`: FSDP2's all-gathers and tensor parallelism's all-reduces
run inside the forward, and a fast rank waits in them for the slow one; under DDP the forward holds no gradient
synchronisation). The straggler is the rank with the most own work; the skew is its own work over the median of
the other ranks'; the cause is the part (data wait or compute) by which it exceeds them most, and the others'
extra time in collectives is where its cost shows.
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
    comm_ms: float = 0.0  # its time blocked in collectives per step (whole step)
    median_comm_ms: float = 0.0  # the other ranks' median

    def advice(self, world_size: int, threshold: float) -> str:
        what = (
            f"waited {self.wait_ms - self.median_wait_ms:.1f} ms longer for its batches than the other ranks "
            f"({self.wait_ms:.1f} vs {self.median_wait_ms:.1f} ms per step, median)"
            if self.cause == "data"
            else f"computed its forward {self.forward_ms - self.median_forward_ms:.1f} ms longer than the other ranks "
            f"({self.forward_ms:.1f} vs {self.median_forward_ms:.1f} ms per step, median, time blocked in "
            "collectives left out)"
        )
        waited = (
            f" The others spent {self.median_comm_ms - self.comm_ms:.1f} ms more per step blocked in collectives "
            f"than it did ({self.median_comm_ms:.1f} vs {self.comm_ms:.1f} ms, median): that is where they "
            "waited for it."
            if self.median_comm_ms - self.comm_ms > 0.5 * self.extra_ms > 0
            else ""
        )
        fix = (
            "its input pipeline is slower: check that rank's loader (num_workers per device, storage or "
            "network of its node, a shard with larger samples)"
            if self.cause == "data"
            else "its device is slower: a throttled or shared GPU, a noisy neighbour on its CPU, a slower node"
        )
        return (
            f"StepTimeMonitor: rank {self.rank} is a straggler: its own work per step is {self.skew:.2f}x the "
            f"other ranks' median (threshold straggler_skew={threshold}); it {what}. The other {world_size - 1} "
            f"rank(s) wait for it at every synchronisation, {self.extra_ms:.1f} ms per step.{waited} Cause: "
            f"{self.cause} - {fix}."
        )


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def find_straggler(
    wait_ms: Sequence[float],
    forward_ms: Sequence[float],
    forward_comm_ms: Sequence[float] | None = None,
    comm_ms: Sequence[float] | None = None,
) -> Straggler | None:
    """The slowest rank by own work (``wait + forward - forward_comm``: the forward less its time blocked in
    collectives), from per-rank means; None with fewer than two ranks or a rank that knows nothing (NaN).
    ``comm_ms`` (each rank's time in collectives over the whole step) only enters the advice."""
    n = len(wait_ms)
    forward_comm = list(forward_comm_ms) if forward_comm_ms is not None else [0.0] * n
    comm = list(comm_ms) if comm_ms is not None else list(forward_comm)
    if n < 2 or not len(forward_ms) == len(forward_comm) == len(comm) == n:
        return None
    if not all(math.isfinite(v) for v in (*wait_ms, *forward_ms, *forward_comm, *comm)):
        return None
    compute = [max(0.0, f - c) for f, c in zip(forward_ms, forward_comm)]
    own = [w + c for w, c in zip(wait_ms, compute)]
    rank = max(range(n), key=lambda r: own[r])
    others = [r for r in range(n) if r != rank]
    median_own = _median([own[r] for r in others])
    median_wait, median_compute = _median([wait_ms[r] for r in others]), _median([compute[r] for r in others])
    skew = own[rank] / median_own if median_own > 0 else (math.inf if own[rank] > 0 else 1.0)
    cause = "data" if wait_ms[rank] - median_wait >= compute[rank] - median_compute else "compute"
    return Straggler(
        rank=rank,
        skew=skew,
        cause=cause,
        extra_ms=own[rank] - median_own,
        wait_ms=wait_ms[rank],
        forward_ms=compute[rank],
        median_wait_ms=median_wait,
        median_forward_ms=median_compute,
        comm_ms=comm[rank],
        median_comm_ms=_median([comm[r] for r in others]),
    )


def communication_bound(comm_ms: Sequence[float], step_ms: Sequence[float], share: float) -> str | None:
    """Advice when the collectives themselves are slow: even the rank that waited least for the others (the one
    they wait for) spent more than ``share`` of the step blocked in collectives. None otherwise, or when a value is
    unknown. In a collective every rank finishes together, so a slow link costs every rank alike: it is named as
    the communication, never as one rank."""
    if len(comm_ms) < 2 or len(comm_ms) != len(step_ms) or not all(math.isfinite(v) for v in (*comm_ms, *step_ms)):
        return None
    least, step = min(comm_ms), max(step_ms)
    if step <= 0 or least <= share * step:
        return None
    return (
        f"StepTimeMonitor: the communication is slow, not one rank: every rank, even the one the others wait for "
        f"least, spent at least {least:.1f} ms of its {step:.1f} ms step ({least / step:.0%}) blocked in "
        f"collectives (threshold comm_fraction={share}). In a collective every rank finishes together, so a slow "
        "network or one rank's slower link costs all of them alike and the timings cannot say whose: measure the "
        "links (lit-compute bench allreduce, CommBenchmark in the run), overlap more (larger DDP buckets, FSDP2's "
        "reshard_after_forward=False), or send less (TunedDDPStrategy's comm_hook, a smaller tensor-parallel "
        "group)."
    )
