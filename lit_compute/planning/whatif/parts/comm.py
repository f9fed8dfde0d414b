"""The communication part: the collectives of one optimizer step per rank (DDP's bucketed all-reduce, FSDP2's
gathers and reduce-scatters) over the slowest link of the scenario, at the bus bandwidth the run measured on its own
machines or at the link's, slowed where a CPU's collective thread shares the computing cores, less the overlap with
compute the run measured."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lit_compute.hardware.chips import LINKS, Chip, Link
from lit_compute.hardware.dtypes import half_weights
from lit_compute.planning.whatif.calibration import Calibration
from lit_compute.planning.whatif.facts import RunFacts, Scenario
from lit_compute.planning.whatif.parts.compute import value_bytes
from lit_compute.planning.whatif.parts.part import Part

__all__ = ["CommPart", "host_contention", "messages", "price"]


@dataclass(frozen=True)
class CommPart(Part):
    """The collectives' exposed seconds per optimizer step (``seconds``), their time before overlap (``total_s``) and
    the link they run at (``link``, its name)."""

    total_s: float = 0.0
    link: str = ""


def price(run: RunFacts, scenario: Scenario, cal: Calibration, measured_links: bool = False) -> CommPart:
    """The collectives of one optimizer step of ``run`` on ``scenario``; ``measured_links``: at the bandwidths the
    run's CommBenchmark measured (the run's own machines) instead of the link table's."""
    notes = []
    link = _slowest_link(scenario)
    comm = _comm_seconds(run, scenario, link, cal, measured_links)
    overlap = run.comm_overlap if run.comm_overlap is not None else 0.0
    if comm and run.comm_overlap is None:
        notes.append("no overlap of collectives with compute assumed (the run measured none: add ProfilerWindow)")
    slowdown = host_contention(run, scenario)
    if comm and slowdown > 1.0 and overlap:
        comm *= 1.0 + overlap * (slowdown - 1.0)
        notes.append(
            f"collectives overlapped with compute run {slowdown:.2g}x slower: on a CPU their thread shares "
            "the cores with the computing ones"
        )
    return CommPart(comm * (1.0 - overlap), "communication", tuple(notes), comm, link.name)


def messages(run: RunFacts, scenario: Scenario) -> dict[str, list[float]]:
    """The collectives of one optimizer step per rank, by kind, as message sizes in bytes (nccl-tests' sizes: an
    all-reduce's buffer, an all-gather's and a reduce-scatter's whole output). DDP: the gradients in buckets (a first
    of 1 MiB, then ``bucket_cap_mb``); FSDP2: every unit's parameters gathered in forward and again in backward, its
    gradients reduce-scattered once."""
    tp = max(1, run.tensor_parallel)
    grad_bytes = run.trainable * (2.0 if half_weights(scenario.precision) else 4.0) / tp
    if run.sharded:
        units = max(1, run.fsdp_units)
        param_bytes = run.trainable * value_bytes(scenario.precision, "matmul") / tp
        return {"allgather": [param_bytes / units] * (2 * units), "reducescatter": [grad_bytes / units] * units}
    first, cap = float(2**20), run.ddp_bucket_cap_mb * 2**20
    sizes, left = [], grad_bytes
    for size in [first] + [cap] * int(math.ceil(max(0.0, grad_bytes - first) / cap)):
        if left <= 0:
            break
        sizes.append(min(size, left))
        left -= size
    return {"allreduce": sizes}


_BUS_FACTOR = {"allreduce": 2.0, "allgather": 1.0, "reducescatter": 1.0}  # x (n-1)/n: nccl-tests' bus factors


def _curve_busbw(curve: list[tuple[float, float]], size: float) -> float:
    """Bus bandwidth at a message size from a measured sweep (log-log interpolation; the ends held)."""
    points = sorted(curve)
    if size <= points[0][0]:
        return points[0][1] * size / points[0][0]  # below the smallest message: latency-bound, time held
    if size >= points[-1][0]:
        return points[-1][1]
    for (s0, b0), (s1, b1) in zip(points, points[1:]):
        if s0 <= size <= s1:
            t = math.log(size / s0) / math.log(s1 / s0)
            return math.exp(math.log(b0) + t * (math.log(b1) - math.log(b0)))
    return points[-1][1]


def _comm_seconds(run: RunFacts, scenario: Scenario, link: Link, cal: Calibration, measured: bool) -> float:
    """Seconds of collectives per optimizer step per rank, before overlap: each message at the run's measured
    bus bandwidth for its size (on the run's own machines) or at the link's bandwidth and latency."""
    ranks = scenario.devices // max(1, run.tensor_parallel)
    if ranks <= 1:
        return 0.0
    total = 0.0
    for kind, sizes in messages(run, scenario).items():
        factor = _BUS_FACTOR[kind] * (ranks - 1) / ranks
        curve = run.curves.get(kind) or run.curves.get("allreduce")
        for size in sizes:
            if measured and curve:
                total += size * factor / _curve_busbw(curve, size)
            else:
                hops = 2 * (ranks - 1) if kind == "allreduce" else ranks - 1
                total += size * factor / (link.bandwidth * cal.network) + hops * link.latency
    return total


def host_contention(run: RunFacts, scenario: Scenario) -> float:
    """How much slower a collective runs while it overlaps compute, on the run's own CPUs: a host backend (gloo)
    moves the bytes on a thread of the process, which then shares the rank's cores (the process's cores over the
    ranks of a node) with the ``torch threads`` computing the backward: ``(threads + 1) / cores``, at least 1. A GPU
    has its own engines for that (1.0); so does a CPU target other than the run's own (its cores are not known)."""
    if scenario.chip.kind != "cpu" or not run.runs_on(scenario.chip):
        return 1.0
    if not run.cpu_cores or not run.torch_threads:
        return 1.0
    ranks_per_node = max(1, min(scenario.devices_per_node, scenario.devices))
    cores = max(1.0, run.cpu_cores / ranks_per_node)
    return max(1.0, (run.torch_threads + 1) / cores)


def _slowest_link(scenario: Scenario) -> Link:
    """The link a step's ring collectives run at: the chips' own within one node; across nodes the slower of the
    network and, with several devices per node, the chips' own link (a ring crosses both: a node's PCIe or loopback
    can be slower than a 400 Gbit/s network)."""
    own = _node_link(scenario.chip)
    if scenario.nodes <= 1 or scenario.network is None:
        return own
    if scenario.devices_per_node > 1 and own.bandwidth < scenario.network.bandwidth:
        return own
    return scenario.network


def _node_link(chip: Chip) -> Link:
    return LINKS.get(chip.link) or LINKS["pcie4"]
