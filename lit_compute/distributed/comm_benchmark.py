"""All-reduce bandwidth sweep (nccl-tests formulas) and the CommBenchmark callback."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from lit_compute._utils import MeasuringCallback, guarded, log_scalars, log_text, markdown_table

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
                    warmup: int = 3) -> list[AllReduceResult]:
    """Time ``all_reduce`` (sum, float32) over message sizes on the default process group.

    Bandwidths follow nccl-tests: algbw = bytes / time; busbw = algbw x 2(n-1)/n. The sweep stops early when
    ``seconds`` are used up; every rank takes the same decisions (rank 0's clock is broadcast). Must run on
    every rank.
    """
    world = dist.get_world_size()
    results = []
    deadline = time.perf_counter() + seconds
    for size in sizes:
        stop = torch.tensor([1.0 if time.perf_counter() > deadline else 0.0], device=device)
        dist.broadcast(stop, src=0)
        if stop.item():
            break
        buf = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(buf)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = (time.perf_counter() - start) / iters
        slowest = torch.tensor([elapsed], device=device, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        t = float(slowest.item())
        algbw = size / t / 1e9
        results.append(AllReduceResult(size, t * 1e6, algbw, algbw * 2 * (world - 1) / world))
    return results


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

    Runs on every rank (it is collective) when a process group exists; says so once and does nothing in a
    single process. Bus bandwidth uses the nccl-tests formula busbw = algbw x 2(n-1)/n.

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

    def __init__(self, max_mb: float = 64.0, seconds: float = 10.0) -> None:
        super().__init__()
        if max_mb <= 0:
            raise ValueError(f"CommBenchmark(max_mb={max_mb}) must be > 0")
        if seconds <= 0:
            raise ValueError(f"CommBenchmark(seconds={seconds}) must be > 0")
        self.max_mb = max_mb
        self.seconds = seconds
        self.results: list[AllReduceResult] = []

    @guarded
    def on_fit_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if not (dist.is_available() and dist.is_initialized()) or trainer.world_size < 2:
            self._warn_once("single", "CommBenchmark: no multi-process group in this run; nothing to measure.")
            return
        self.results = allreduce_sweep(trainer.strategy.root_device, default_sizes(self.max_mb), self.seconds)
        log_results(trainer, self.results, dist.get_backend())
