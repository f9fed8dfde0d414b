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

A straggler is slow most of the time, not once: :class:`StragglerWindow` names a rank only when it was the slowest
in most of a full window of logging steps, its median skew over them is above the threshold, and so is its mean
skew beyond the noise (the 95% interval of the mean of its log skews); a rank over the threshold at one logging step
without that is a spike.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from lit_compute.intervals import mean_lower_bound


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
    slowest_in: int = 0  # the logging steps of the window in which it was the slowest (0: one logging step)
    logs: int = 0  # the logging steps of that window

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
        window = (
            f", the slowest rank in {self.slowest_in} of the last {self.logs} logging steps (medians over them)"
            if self.logs
            else ""
        )
        return (
            f"StepTimeMonitor: rank {self.rank} is a straggler: its own work per step is {self.skew:.2f}x the "
            f"other ranks' median (threshold straggler_skew={threshold}){window}; it {what}. The other "
            f"{world_size - 1} "
            f"rank(s) wait for it at every synchronisation, {self.extra_ms:.1f} ms per step.{waited} Cause: "
            f"{self.cause} - {fix}."
        )


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _own_work(wait_ms: Sequence[float], forward_ms: Sequence[float], forward_comm_ms: Sequence[float]) -> list[float]:
    """Each rank's own work: its data wait and its forward less the forward's time blocked in collectives."""
    return [w + max(0.0, f - c) for w, f, c in zip(wait_ms, forward_ms, forward_comm_ms)]


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
    own = [w + c for w, c in zip(wait_ms, compute)]  # as _own_work, with compute kept for the cause
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


class StragglerWindow:
    """The per-rank times of the last ``size`` logging steps, and the straggler they show, if any.

    :meth:`add` takes one logging step's per-rank means (as :func:`find_straggler` does) and returns that step's
    slowest rank. :meth:`straggler` names a rank only when the window is full (``size`` logging steps), the rank
    was the slowest in more than half of them, and over them its lower median skew is above ``threshold`` and its
    lower median extra own work above ``least_share`` of the slowest step (the lower median of an even count is the
    smaller middle value: over 8 steps, 5 of them over), and the lower end of the 95% Student t interval of the mean
    of its log skews over the window above the threshold's log: one slow step among even ones (a spike: a page fault,
    a garbage collection, a checkpoint on one node) names nobody, and neither does the noise of even ranks, whose
    slowest rank is over the threshold at some steps and changes between them, nor a rank a little slower at most
    steps of a window whose skews scatter as widely as even ranks' do. A shorter window (2 steps at
    least) names sooner on less evidence. The advice's figures are the window's per-rank medians."""

    def __init__(self, size: int, threshold: float, least_share: float = 0.05) -> None:
        if size < 2:
            raise ValueError(f"StragglerWindow: size={size}; a window needs 2 logging steps or more")
        self.size, self.threshold, self.least_share = size, threshold, least_share
        # (wait, forward, forward_comm, comm, step) per rank, and the slowest rank, of each logging step
        self._logs: deque[tuple[list[list[float]], Straggler]] = deque(maxlen=size)

    def add(
        self,
        wait_ms: Sequence[float],
        forward_ms: Sequence[float],
        forward_comm_ms: Sequence[float],
        comm_ms: Sequence[float],
        step_ms: Sequence[float],
    ) -> Straggler | None:
        """Record one logging step; its slowest rank (None, and nothing recorded, when a value is unknown)."""
        slowest = find_straggler(wait_ms, forward_ms, forward_comm_ms, comm_ms)
        if slowest is not None:
            series = [list(wait_ms), list(forward_ms), list(forward_comm_ms), list(comm_ms), list(step_ms)]
            self._logs.append((series, slowest))
        return slowest

    def spike(self, slowest: Straggler, step_ms: Sequence[float]) -> bool:
        """Whether one logging step's slowest rank is over the threshold on its own."""
        return slowest.skew > self.threshold and slowest.extra_ms > self.least_share * max(step_ms)

    @property
    def full(self) -> bool:
        return len(self._logs) == self.size

    def spikes(self, named: Straggler | None) -> int:
        """The logging steps of the window whose slowest rank was over the threshold and is not ``named``, the
        straggler :meth:`straggler` found (None: nobody)."""
        return sum(
            self.spike(slowest, series[4]) and (named is None or slowest.rank != named.rank)
            for series, slowest in self._logs
        )

    def straggler(self) -> Straggler | None:
        """The rank the window shows slow most of the time, with the window's medians; None otherwise."""
        logs = len(self._logs)
        if logs < self.size:
            return None
        rank, slowest_in = Counter(s.rank for _, s in self._logs).most_common(1)[0]
        if 2 * slowest_in <= logs:
            return None
        medians = [
            [_median([series[k][r] for series, _ in self._logs]) for r in range(len(self._logs[-1][0][0]))]
            for k in range(5)
        ]
        found = find_straggler(*medians[:4])
        skews, extras = [], []
        for series, _ in self._logs:
            own = _own_work(*series[:3])
            others = _median([own[r] for r in range(len(own)) if r != rank])
            skews.append(own[rank] / others if others > 0 else math.inf)
            extras.append(own[rank] - others)
        skew, extra = sorted(skews)[(logs - 1) // 2], sorted(extras)[(logs - 1) // 2]  # the lower medians
        if found is None or found.rank != rank or skew <= self.threshold:
            return None
        # and slower beyond the noise: the 95% interval of its mean log skew lies above the threshold's log
        if mean_lower_bound([math.log(max(min(k, 1e6), 1e-6)) for k in skews]) <= math.log(self.threshold):
            return None
        if extra <= self.least_share * max(medians[4]):
            return None
        return replace(found, skew=skew, extra_ms=extra, slowest_in=slowest_in, logs=logs)


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
