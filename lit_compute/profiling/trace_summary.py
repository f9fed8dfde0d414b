"""Summaries of one profiler window computed from the profiler's own events (its Chrome trace)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass
class WindowSummary:
    """What one profiler window measured."""

    steps: list[int] = field(default_factory=list)
    step_time_ms: float | None = None
    dataloader_fraction: float | None = None
    peak_memory_mb: float | None = None
    gpu_idle_fraction: float | None = None
    comm_fraction: float | None = None
    comm_overlap_fraction: float | None = None
    comm_exposed_fraction: float | None = None

    def scalars(self) -> dict[str, float]:
        out = {
            "profiler/step_time_ms": self.step_time_ms,
            "profiler/dataloader_fraction": self.dataloader_fraction,
            "profiler/peak_memory_mb": self.peak_memory_mb,
            "profiler/gpu_idle_fraction": self.gpu_idle_fraction,
            "profiler/comm_fraction": self.comm_fraction,
            "profiler/comm_overlap_fraction": self.comm_overlap_fraction,
            "comm/exposed_fraction": self.comm_exposed_fraction,
        }
        return {k: float(v) for k, v in out.items() if v is not None}


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _clip(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _interval(e: dict[str, Any]) -> tuple[float, float]:
    return float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))


def exposure(
    comm: list[tuple[float, float]], compute: list[tuple[float, float]], lo: float, hi: float
) -> tuple[float | None, float | None, float | None]:
    """(share of the window in collectives, share of that overlapped by compute, share of the window in collectives
    that no compute hides) over merged intervals: a union, so collectives or kernels that overlap each other count
    once (summing their durations would count the overlap twice)."""
    if not comm or hi <= lo:
        return None, None, None
    comm, compute = _merge(_clip(comm, lo, hi)), _merge(_clip(compute, lo, hi))
    length = _length(comm)
    hidden = _intersection(comm, compute)
    return length / (hi - lo), (hidden / length if length > 0 else None), (length - hidden) / (hi - lo)


def _host_collectives(events: list[dict[str, Any]], lo: float, hi: float) -> tuple[float | None, ...]:
    """:func:`exposure` of a host backend's (gloo's) collectives against the ops on other threads (compute going on
    meanwhile); Nones when the window has no gloo collective."""
    comm_events = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("gloo:")]
    if not comm_events:
        return None, None, None
    comm_threads = {e.get("tid") for e in comm_events}
    compute = [
        _interval(e)
        for e in events
        if e.get("ph") == "X" and e.get("tid") not in comm_threads and str(e.get("name", "")).startswith("aten::")
    ]
    return exposure([_interval(e) for e in comm_events], compute, lo, hi)


def _profiler_steps(events: list[dict[str, Any]]) -> tuple[list[tuple[int, float, float]], list[float]]:
    """The ``ProfilerStep#N`` CPU ranges ``(N, start, end)`` and the ends of their GPU copies (see
    :func:`summarize_trace`)."""
    steps, gpu_ends = [], []
    for e in events:
        if e.get("ph") != "X" or not (m := _STEP.match(str(e.get("name", "")))):
            continue
        if str(e.get("cat", "")).lower().startswith("gpu_"):
            gpu_ends.append(float(e["ts"]) + float(e.get("dur", 0)))
        else:
            steps.append((int(m.group(1)), float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))))
    return steps, gpu_ends


def summarize_trace(trace: dict[str, Any] | str | Path) -> WindowSummary:
    """Step time, data-loader share, peak memory, GPU idle share, and the share of time in collectives and how
    much of it compute overlapped (NCCL kernels on GPU; gloo's collectives on host backends), of a Chrome trace."""
    data: dict[str, Any] = trace if isinstance(trace, dict) else json.loads(Path(trace).read_text())
    events = [e for e in data.get("traceEvents", []) if isinstance(e, dict)]
    # On CUDA, Kineto writes each ProfilerStep#N twice: the CPU range (cat "user_annotation") and its copy
    # on the GPU timeline (cat "gpu_user_annotation", first to last kernel of the step, usually later than
    # the CPU range because kernels run asynchronously). Steps and their times come from the CPU ranges; the
    # GPU copies extend the window to where the GPU finished the window's work.
    steps, gpu_ends = _profiler_steps(events)
    summary = WindowSummary()
    if not steps:
        return summary
    steps.sort()
    summary.steps = [s for s, _, _ in steps]
    lo, hi = min(s for _, s, _ in steps), max(e for _, _, e in steps)
    span = hi - lo
    summary.step_time_ms = sum(e - s for _, s, e in steps) / len(steps) / 1e3
    loader = _merge(
        [
            (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
            for e in events
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("enumerate(DataLoader)")
        ]
    )
    summary.dataloader_fraction = _length(_clip(loader, lo, hi)) / span if span > 0 else 0.0
    allocated = [
        float(e["args"]["Total Allocated"])
        for e in events
        if e.get("name") == "[memory]" and isinstance(e.get("args"), dict) and "Total Allocated" in e["args"]
    ]
    if allocated:
        summary.peak_memory_mb = max(allocated) / 2**20
    kernels = [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"]
    if kernels:
        spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in kernels]
        gpu_hi = max([hi] + gpu_ends)
        busy = _merge(_clip(spans, lo, gpu_hi))
        summary.gpu_idle_fraction = max(0.0, 1.0 - _length(busy) / (gpu_hi - lo)) if gpu_hi > lo else None
        comm = [s for s, e in zip(spans, kernels) if "nccl" in str(e.get("name", "")).lower()]
        compute = [s for s, e in zip(spans, kernels) if "nccl" not in str(e.get("name", "")).lower()]
        if comm:
            (summary.comm_fraction, summary.comm_overlap_fraction, summary.comm_exposed_fraction) = exposure(
                comm, compute, lo, gpu_hi
            )
            return summary
    summary.comm_fraction, summary.comm_overlap_fraction, summary.comm_exposed_fraction = _host_collectives(
        events, lo, hi
    )
    return summary


def host_collective_durations(trace: dict[str, Any] | str | Path) -> tuple[list[float], int]:
    """The durations (seconds) of a host backend's (gloo's) collectives inside the trace's profiled steps, in the
    order they started, and the number of steps: what :func:`transfer_time_per_step` pairs across ranks."""
    data: dict[str, Any] = trace if isinstance(trace, dict) else json.loads(Path(trace).read_text())
    events = [e for e in data.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    steps, _ = _profiler_steps(events)
    if not steps:
        return [], 0
    lo, hi = min(s for _, s, _ in steps), max(e for _, _, e in steps)
    comm = sorted(
        (float(e["ts"]), float(e.get("dur", 0)))
        for e in events
        if str(e.get("name", "")).startswith("gloo:") and lo <= float(e["ts"]) < hi
    )
    return [d / 1e6 for _, d in comm], len(steps)


def transfer_time_per_step(traces: Sequence[dict[str, Any] | str | Path]) -> float | None:
    """Seconds per step the collectives themselves took, from every rank's trace of the same steps: each collective's
    shortest duration over the ranks (the rank that arrived last waited for nobody; the others' extra time was
    waiting for it), summed over the window and divided by its steps. None when the ranks' traces do not hold the
    same collectives."""
    per_rank = [host_collective_durations(t) for t in traces]
    counts = {len(d) for d, _ in per_rank}
    steps = {n for _, n in per_rank}
    if len(per_rank) < 2 or len(counts) != 1 or 0 in counts or len(steps) != 1 or 0 in steps:
        return None
    return sum(min(ds) for ds in zip(*(d for d, _ in per_rank))) / steps.pop()
