"""How busy other processes kept the machine's CPUs: the whole machine's busy time (``/proc/stat``) less this
process's and its children's (DataLoader workers), between two samples."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuSample:
    wall: float  # time.monotonic()
    busy_s: float | None  # core-seconds the machine's CPUs were busy since boot (None: no /proc/stat)
    own_s: float | None  # core-seconds of this process and its live children (None: psutil missing)


def _machine_busy_s() -> float | None:
    try:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # user..steal; guest time is inside user


def _own_s() -> float | None:
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    total = sum(me.cpu_times()[:4])  # user, system, and the reaped children's
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])
    return total


def cpu_sample() -> CpuSample:
    return CpuSample(time.monotonic(), _machine_busy_s(), _own_s())


def others_cores(start: CpuSample, end: CpuSample) -> float | None:
    """Cores other processes kept busy on average between two samples (None when unknown); CPUs this process was
    not allowed to use count too, as they are the machine's."""
    wall = end.wall - start.wall
    if wall <= 0 or None in (start.busy_s, end.busy_s, start.own_s, end.own_s):
        return None
    busy = (end.busy_s or 0.0) - (start.busy_s or 0.0)
    own = (end.own_s or 0.0) - (start.own_s or 0.0)
    return max(0.0, (busy - own) / wall)
