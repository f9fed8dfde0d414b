"""All-reduce bandwidth sweep (nccl-tests formulas) and the CommBenchmark callback."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

import torch
import torch.distributed as dist
from typing_extensions import override

from lit_compute._validate import Check, validated
from lit_compute.callback import MeasuringCallback, guarded
from lit_compute.formatting import markdown_table
from lit_compute.timeline import timeline_for
from lit_compute.writer import log_scalars, log_text

if TYPE_CHECKING:
    import lightning.pytorch as pl


@dataclass
class AllReduceResult:
    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


def default_sizes(max_mb: float) -> list[int]:
    """Message sizes from 4 KiB up to ``max_mb`` MiB, by factors of 4."""
    sizes, size = [], 4096
    while size <= max_mb * 2**20:
        sizes.append(size)
        size *= 4
    return sizes


def allreduce_sweep(device: torch.device, sizes: list[int], seconds: float = 10.0, iters: int = 20,
                    warmup: int = 3, group: Any = None) -> list[AllReduceResult]:
    """Time ``all_reduce`` (sum, float32) over message sizes on ``group`` (default: the default process group).

    Bandwidths follow nccl-tests: algbw = bytes / time; busbw = algbw x 2(n-1)/n. The sweep stops early when
    ``seconds`` are used up; every rank takes the same decisions (rank 0's clock is broadcast). Must run on
    every rank.
    """
    world = dist.get_world_size(group)
    results = []
    deadline = time.perf_counter() + seconds
    for size in sizes:
        stop = torch.tensor([1.0 if time.perf_counter() > deadline else 0.0], device=device)
        dist.broadcast(stop, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        if stop.item():
            break
        buf = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(buf, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = (time.perf_counter() - start) / iters
        slowest = torch.tensor([elapsed], device=device, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
        t = float(slowest.item())
        algbw = size / t / 1e9
        results.append(AllReduceResult(size, t * 1e6, algbw, algbw * 2 * (world - 1) / world))
    return results


def timed_sweep(trainer: Any, sizes: list[int], seconds: float) -> list[AllReduceResult]:
    """:func:`allreduce_sweep` as instrument time of the trainer's timeline, on a process group of its own whose
    timeout bounds the wait if one rank fails mid-sweep (so the others raise instead of hanging)."""
    timeout = timedelta(seconds=max(60.0, 6 * seconds))
    with timeline_for(trainer).instrument("comm_benchmark"):
        group = dist.new_group(timeout=timeout)
        try:
            return allreduce_sweep(trainer.strategy.root_device, sizes, seconds, group=group)
        finally:
            dist.destroy_process_group(group)


def results_table(results: list[AllReduceResult]) -> str:
    return markdown_table(
        ["size (bytes)", "time (us)", "algbw (GB/s)", "busbw (GB/s)"],
        [[r.size_bytes, f"{r.time_us:.1f}", f"{r.algbw_gbps:.3f}", f"{r.busbw_gbps:.3f}"] for r in results],
    )


def log_results(trainer: pl.Trainer, results: list[AllReduceResult], backend: str) -> None:
    for r in results:
        log_scalars(trainer, {"comm/allreduce_busbw_gbps": r.busbw_gbps, "comm/allreduce_algbw_gbps": r.algbw_gbps},
                    step=r.size_bytes)
    log_text(trainer, "comm/allreduce_table",
             f"all_reduce sweep, backend {backend}, world size {trainer.world_size} (step = message bytes)\n\n"
             + results_table(results), step=0)


class CommBenchmark(MeasuringCallback):
    """At fit start, measure all-reduce bandwidth over message sizes (bounded in time) and log it.

    Runs on every rank (it is collective) when a process group exists, on a process group of its own with a
    bounded timeout, as instrument time of the shared timeline (left out of every step and throughput
    figure); says so once and does nothing in a single process. Bus bandwidth uses the nccl-tests formula busbw = algbw x 2(n-1)/n.

    Logged metrics:
        - ``comm/allreduce_busbw_gbps``, ``comm/allreduce_algbw_gbps``: per message size (the step is the size
          in bytes).
        - text ``comm/allreduce_table``: size, time, algbw, busbw.

    Args:
        max_mb: Largest message (MiB).
        seconds: Time budget of the sweep.

    Example:
        >>> cb = CommBenchmark(max_mb=4, seconds=5)
    """

    @validated
    def __init__(self, max_mb: Annotated[float, Check(gt=0, hint="MiB")] = 64.0,
                 seconds: Annotated[float, Check(gt=0)] = 10.0) -> None:
        super().__init__()
        self.max_mb = max_mb
        self.seconds = seconds
        self.results: list[AllReduceResult] = []

    @override
    @guarded
    def on_fit_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if not (dist.is_available() and dist.is_initialized()) or trainer.world_size < 2:
            self._warn_once("single", "CommBenchmark: no multi-process group in this run; nothing to measure.")
            return
        self.results = timed_sweep(trainer, default_sizes(self.max_mb), self.seconds)
        log_results(trainer, self.results, dist.get_backend())
