"""Collective bandwidth sweeps (all-reduce, all-gather, reduce-scatter; nccl-tests formulas) over the world and
each device-mesh dimension, and the CommBenchmark callback."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal

import torch
import torch.distributed as dist
from typing_extensions import override

from lit_compute._compat import device_mesh
from lit_compute._validate import Check, validated
from lit_compute.callback import MeasuringCallback, guarded
from lit_compute.formatting import markdown_table
from lit_compute.timeline import timeline_for
from lit_compute.writer import log_scalars, log_text

if TYPE_CHECKING:
    import lightning.pytorch as pl


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
# nccl-tests' bus-bandwidth factors (doc/PERFORMANCE.md): busbw = algbw x factor(n), comparable across collectives
_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}


@dataclass
class CollectiveResult:
    """One message size of a sweep. ``size_bytes`` is the whole buffer, as nccl-tests counts it: the reduced
    tensor (all-reduce), the gathered output (all-gather), the input that is scattered (reduce-scatter)."""

    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    op: str = "all_reduce"
    group: str = "world"


AllReduceResult = CollectiveResult  # the name before all-gather and reduce-scatter were measured


def default_sizes(max_mb: float) -> list[int]:
    """Message sizes from 4 KiB up to ``max_mb`` MiB, by factors of 4."""
    sizes, size = [], 4096
    while size <= max_mb * 2**20:
        sizes.append(size)
        size *= 4
    return sizes


def _runner(op: str, size: int, world: int, device: torch.device, group: Any) -> Any:
    """A closure issuing one ``op`` on a ``size``-byte float32 buffer (divisible by the group's size)."""
    n = max(world, (size // 4) // world * world)
    if op == "all_reduce":
        buf = torch.ones(n, dtype=torch.float32, device=device)
        return lambda: dist.all_reduce(buf, group=group)
    shard = torch.ones(n // world, dtype=torch.float32, device=device)
    full = torch.ones(n, dtype=torch.float32, device=device)
    if op == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(full, shard, group=group)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return lambda: scatter(shard, full, group=group)


def collective_sweep(
    op: str,
    device: torch.device,
    sizes: list[int],
    seconds: float = 10.0,
    iters: int = 20,
    warmup: int = 3,
    group: Any = None,
    group_name: str = "world",
) -> list[CollectiveResult]:
    """Time ``op`` (``"all_reduce"``, ``"all_gather"`` or ``"reduce_scatter"``; sum, float32) over message sizes on
    ``group`` (default: the default process group).

    Bandwidths follow nccl-tests: algbw = bytes / time; busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for
    all-gather and reduce-scatter. The sweep stops early when ``seconds`` are used up; every rank takes the same
    decisions (the group's first rank's clock is broadcast) and the slowest rank's time counts. Must run on every
    rank of ``group``.
    """
    if op not in COLLECTIVES:
        raise ValueError(f"collective_sweep(op={op!r}) must be one of {list(COLLECTIVES)}")
    world = dist.get_world_size(group)
    first = dist.get_global_rank(group, 0) if group is not None else 0
    results = []
    deadline = time.perf_counter() + seconds
    for size in sizes:
        stop = torch.tensor([1.0 if time.perf_counter() > deadline else 0.0], device=device)
        dist.broadcast(stop, src=first, group=group)
        if stop.item():
            break
        call = _runner(op, size, world, device, group)
        for _ in range(warmup):
            call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(iters):
            call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = (time.perf_counter() - start) / iters
        slowest = torch.tensor([elapsed], device=device, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
        t = float(slowest.item())
        algbw = size / t / 1e9
        results.append(CollectiveResult(size, t * 1e6, algbw, algbw * _BUS_FACTOR[op](world), op, group_name))
    return results


def allreduce_sweep(
    device: torch.device, sizes: list[int], seconds: float = 10.0, iters: int = 20, warmup: int = 3, group: Any = None
) -> list[CollectiveResult]:
    """:func:`collective_sweep` of ``all_reduce`` (busbw = algbw x 2(n-1)/n)."""
    return collective_sweep("all_reduce", device, sizes, seconds, iters, warmup, group)


def mesh_groups(trainer: Any) -> list[tuple[str, list[list[int]]]]:
    """The strategy's device-mesh dimensions with more than one rank (``ModelParallelStrategy``'s
    ``data_parallel`` and ``tensor_parallel``), each with the rank lists of its groups; [] without a mesh or
    with a one-dimensional one (the world group measures it already). The same on every rank."""
    mesh, names = device_mesh(trainer)
    if mesh is None or len(names) < 2:
        return []
    ranks = mesh.mesh
    out = []
    for i, name in enumerate(names):
        if ranks.shape[i] > 1:
            out.append((name, ranks.movedim(i, -1).reshape(-1, ranks.shape[i]).tolist()))
    return out


def timed_sweep(
    trainer: Any, sizes: list[int], seconds: float, collectives: tuple[str, ...] = ("all_reduce",)
) -> list[CollectiveResult]:
    """Each of ``collectives`` swept over the world and over every mesh dimension (:func:`mesh_groups`), sharing
    ``seconds``, as instrument time of the trainer's timeline, on process groups of their own whose timeout bounds
    the wait if one rank fails mid-sweep (so the others raise instead of hanging)."""
    timeout = timedelta(seconds=max(60.0, 6 * seconds))
    device = trainer.strategy.root_device
    dims = mesh_groups(trainer)
    share = seconds / (len(collectives) * (1 + len(dims)))
    results: list[CollectiveResult] = []
    with timeline_for(trainer).instrument("comm_benchmark"):
        group = dist.new_group(timeout=timeout)
        try:
            for op in collectives:
                results += collective_sweep(op, device, sizes, share, group=group)
        finally:
            dist.destroy_process_group(group)
        for name, rank_lists in dims:
            mine, groups = dist.new_subgroups_by_enumeration(rank_lists, timeout=timeout)
            try:
                for op in collectives:
                    results += collective_sweep(op, device, sizes, share, group=mine, group_name=name)
            finally:
                for g in groups:
                    dist.destroy_process_group(g)
    return results


def results_table(results: list[CollectiveResult]) -> str:
    multi = len({(r.op, r.group) for r in results}) > 1
    head = ["collective", "group"] if multi else []
    return markdown_table(
        head + ["size (bytes)", "time (us)", "algbw (GB/s)", "busbw (GB/s)"],
        [
            ([r.op, r.group] if multi else [])
            + [r.size_bytes, f"{r.time_us:.1f}", f"{r.algbw_gbps:.3f}", f"{r.busbw_gbps:.3f}"]
            for r in results
        ],
    )


def _tag(r: CollectiveResult, kind: str) -> str:
    op = "allreduce" if r.op == "all_reduce" else r.op.replace("_", "")
    where = "" if r.group == "world" else f"{r.group}/"
    return f"comm/{where}{op}_{kind}_gbps"


def log_results(trainer: pl.Trainer, results: list[CollectiveResult], backend: str) -> None:
    for r in results:
        log_scalars(trainer, {_tag(r, "busbw"): r.busbw_gbps, _tag(r, "algbw"): r.algbw_gbps}, step=r.size_bytes)
    world = [r for r in results if r.op == "all_reduce" and r.group == "world"]
    if world:
        log_text(
            trainer,
            "comm/allreduce_table",
            f"all_reduce sweep, backend {backend}, world size {trainer.world_size} (step = message bytes)\n\n"
            + results_table(world),
            step=0,
        )
    if len(world) < len(results):
        log_text(
            trainer,
            "comm/collectives_table",
            f"collective sweeps, backend {backend}, world size {trainer.world_size}; groups: world and each "
            "device-mesh dimension (step = message bytes; busbw by nccl-tests' factors)\n\n" + results_table(results),
            step=0,
        )


def gradient_allreduce_estimate(
    pl_module: Any, results: list[CollectiveResult], world: int
) -> tuple[int, float] | None:
    """``(gradient bytes per step, estimated ms)`` of all-reducing this model's trainable parameters' gradients at the
    bus bandwidth measured for the largest world all-reduce (time = bytes x 2(n-1)/n / busbw); None without one."""
    measured = [r for r in results if r.op == "all_reduce" and r.group == "world" and r.busbw_gbps > 0]
    if not measured or world < 2:
        return None
    grad_bytes = sum(p.numel() * p.element_size() for p in pl_module.parameters() if p.requires_grad)
    busbw = max(measured, key=lambda r: r.size_bytes).busbw_gbps
    return grad_bytes, grad_bytes * 2 * (world - 1) / world / (busbw * 1e9) * 1e3


class CommBenchmark(MeasuringCallback):
    """At fit start, measure collective bandwidth over message sizes (bounded in time) and log it.

    Sweeps all-reduce, all-gather and reduce-scatter (what DDP and FSDP2 do: DDP all-reduces gradients, FSDP2
    all-gathers parameters and reduce-scatters gradients) over the world, and under ``ModelParallelStrategy``
    over each device-mesh dimension too (``data_parallel`` and ``tensor_parallel`` groups separately). Runs on
    every rank (it is collective) when a process group exists, on process groups of its own with a bounded
    timeout, as instrument time of the shared timeline (left out of every step and throughput figure); says so
    once and does nothing in a single process. Bus bandwidth uses nccl-tests' factors: busbw = algbw x 2(n-1)/n
    for all-reduce, x (n-1)/n for all-gather and reduce-scatter.

    What it means for this model: the gradient bytes of a step (``comm/gradient_bytes``) all-reduced at the
    measured bus bandwidth take ``comm/grad_allreduce_ms`` per step (``lit-compute report`` compares it with the
    step time and says what bandwidth would keep communication under a fifth of the step).

    Logged metrics:
        - ``comm/allreduce_busbw_gbps``, ``comm/allreduce_algbw_gbps``, ``comm/allgather_*``,
          ``comm/reducescatter_*``: per message size (the step is the size in bytes); per mesh dimension under
          ``comm/<dimension>/``.
        - ``comm/gradient_bytes``, ``comm/grad_allreduce_ms``: the model's gradient bytes per step and the time to
          all-reduce them at the measured bandwidth (step 0).
        - text ``comm/allreduce_table`` (world all-reduce) and ``comm/collectives_table`` (every sweep).

    Args:
        max_mb: Largest message (MiB).
        seconds: Time budget of all the sweeps together.
        collectives: Which collectives to sweep.

    Example:
        >>> cb = CommBenchmark(max_mb=4, seconds=5)
    """

    @validated
    def __init__(
        self,
        max_mb: Annotated[float, Check(gt=0, hint="MiB")] = 64.0,
        seconds: Annotated[float, Check(gt=0)] = 10.0,
        collectives: list[Literal["all_reduce", "all_gather", "reduce_scatter"]] | None = None,
    ) -> None:
        super().__init__()
        self.max_mb = max_mb
        self.seconds = seconds
        chosen = list(COLLECTIVES) if collectives is None else list(collectives)
        bad = [c for c in chosen if c not in COLLECTIVES]
        if bad or not chosen:
            raise ValueError(
                f"CommBenchmark(collectives={collectives!r}) must be a non-empty list of {list(COLLECTIVES)}"
            )
        self.collectives = chosen
        self.results: list[CollectiveResult] = []

    @override
    @guarded
    def on_fit_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if not (dist.is_available() and dist.is_initialized()) or trainer.world_size < 2:
            self._warn_once("single", "CommBenchmark: no multi-process group in this run; nothing to measure.")
            return
        self.results = timed_sweep(trainer, default_sizes(self.max_mb), self.seconds, tuple(self.collectives))
        log_results(trainer, self.results, dist.get_backend())
        estimate = gradient_allreduce_estimate(pl_module, self.results, trainer.world_size)
        if estimate is not None:
            log_scalars(
                trainer, {"comm/gradient_bytes": float(estimate[0]), "comm/grad_allreduce_ms": estimate[1]}, step=0
            )
