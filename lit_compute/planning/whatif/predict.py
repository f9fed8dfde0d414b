"""The predicted step: the parts priced for a scenario and composed, the bottleneck picked, the throughput, MFU,
memory fit and cost that follow (:class:`Prediction`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lit_compute.hardware.chips import ThisMachine
from lit_compute.hardware.dtypes import compute_dtype
from lit_compute.planning.whatif.calibration import Calibration
from lit_compute.planning.whatif.facts import RunFacts, Scenario
from lit_compute.planning.whatif.parts import comm, compute, host, memory

__all__ = ["Prediction", "predict"]


@dataclass
class Prediction:
    """One target's predicted step: its parts, throughput, MFU, bottleneck, memory fit and cost."""

    hardware: str
    nodes: int
    devices_per_node: int
    network: str
    precision: str
    micro_batch: int
    step_time_s: float
    compute_s: float
    input_s: float
    comm_s: float  # exposed (not overlapped)
    comm_total_s: float  # before overlap
    samples_per_s: float
    tokens_per_s: float | None
    mfu: float | None
    bottleneck: str
    fits: bool | None
    peak_memory_bytes: float | None
    cost_per_million: float | None
    notes: list[str] = field(default_factory=list)
    host_s: float = 0.0  # the host's input work per step (the loader in the process, Lightning's fetch), hidden or not
    dispatch_s: float = 0.0  # the host's eager dispatch of the step's kernels (an accelerator target), hidden or not

    def as_json(self) -> dict[str, Any]:
        """The prediction as the JSON output shows it (``cost`` is the cost per million samples)."""
        return {
            "hardware": self.hardware,
            "nodes": self.nodes,
            "devices_per_node": self.devices_per_node,
            "network": self.network,
            "precision": self.precision,
            "micro_batch": self.micro_batch,
            "step_time_s": self.step_time_s,
            "compute_s": self.compute_s,
            "input_s": self.input_s,
            "host_s": self.host_s,
            "dispatch_s": self.dispatch_s,
            "comm_s": self.comm_s,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "bottleneck": self.bottleneck,
            "fits": self.fits,
            "peak_memory_bytes": self.peak_memory_bytes,
            "cost": self.cost_per_million,
            "notes": list(self.notes),
        }

    @property
    def label(self) -> str:
        """The row as a reader names it: ``a100 8 x 8 over 100gbps``."""
        return f"{self.hardware} {self.nodes} x {self.devices_per_node}" + (
            f" over {self.network}" if self.nodes > 1 else ""
        )


def predict(run: RunFacts, scenario: Scenario, cal: Calibration, measured_links: bool = False) -> Prediction:
    """The target step of ``scenario`` for ``run`` at efficiencies ``cal``: the device's compute and the exposed
    collectives in series, beside the host's input work and dispatch (overlapped on an accelerator, added on a CPU);
    ``measured_links``: price the collectives at the bandwidths the run's CommBenchmark measured (the run's own
    machines) instead of the link table's."""
    device_part = compute.price(run, scenario, cal)
    host_part = host.price(run, scenario, cal, device_part.kernels)
    comm_part = comm.price(run, scenario, cal, measured_links)
    memory_part = memory.price(run, scenario, cal)
    step, bottleneck, said = _bottleneck(run, scenario, device_part, host_part, comm_part)
    samples_per_s, mfu, busy = _rates(run, scenario, step)
    price = scenario.price_per_hour
    return Prediction(
        hardware=scenario.chip.name,
        nodes=scenario.nodes,
        devices_per_node=scenario.devices_per_node,
        network=comm_part.link,
        precision=scenario.precision,
        micro_batch=scenario.micro_batch,
        step_time_s=step,
        compute_s=device_part.seconds,
        input_s=max(0.0, step - (device_part.seconds + comm_part.seconds)),
        comm_s=comm_part.seconds,
        comm_total_s=comm_part.total_s,
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * run.tokens_per_sample if run.tokens_per_sample else None,
        mfu=mfu,
        bottleneck=bottleneck,
        fits=memory_part.fits,
        peak_memory_bytes=memory_part.peak_bytes,
        cost_per_million=None if price is None else 1e6 / samples_per_s / 3600 * scenario.devices * price,
        notes=[*device_part.notes, *host_part.notes, *comm_part.notes, *said, *busy],
        host_s=host_part.seconds,
        dispatch_s=host_part.dispatch_s,
    )


def _rates(run: RunFacts, scenario: Scenario, step: float) -> tuple[float, float | None, list[str]]:
    """Samples per second over every data-parallel replica, the MFU against the chip's peak in the compute dtype
    (None where a peak measured under load is a lower bound: an MFU against it can pass 1), and that note."""
    samples_per_s = scenario.devices // max(1, run.tensor_parallel) * scenario.micro_batch * run.accumulate / step
    chip = scenario.chip
    dtype = compute_dtype(scenario.precision)
    if compute.tf32_cores(chip, scenario.precision) and compute.float32_math(run, scenario).any_tf32:
        dtype = "tf32"  # float32 on TF32 cores: against that peak, as FlopsLogger's MFU of such a run is
    peak = chip.peak(dtype) or chip.peak("float32")
    model_flops = run.model_flops * scenario.micro_batch / run.samples * run.accumulate
    busy = chip.busy if isinstance(chip, ThisMachine) else None
    if busy:
        return samples_per_s, None, [f"{chip.name}: {busy}; MFU is not given (run again on a quiet machine)"]
    return samples_per_s, model_flops / step / peak if peak else None, []


def _bottleneck(
    run: RunFacts, scenario: Scenario, device: compute.ComputePart, feed: host.HostPart, talk: comm.CommPart
) -> tuple[float, str, list[str]]:
    """The step's seconds, its bottleneck and what to say about it: an accelerator runs its queued kernels while the
    host fetches the next batch and dispatches (the step is the longer of the two), a CPU does both itself, one after
    the other; a loader with workers caps the rate; the exposed collectives bound a step they dominate."""
    accelerator = scenario.chip.kind != "cpu"
    on_device = device.seconds + talk.seconds
    step = max(on_device, feed.total_s) if feed.overlaps else on_device + feed.seconds
    bottleneck = device.bound_by
    if feed.total_s > (on_device if accelerator else max(device.seconds, talk.seconds)):
        bottleneck = feed.bound_by
    samples_per_step = scenario.micro_batch * run.accumulate
    if feed.loader_rate is not None and samples_per_step / feed.loader_rate > step:
        step, bottleneck = samples_per_step / feed.loader_rate, "input"
    elif talk.seconds > device.seconds and talk.seconds > feed.total_s:
        bottleneck = talk.bound_by
    said = []
    if accelerator and bottleneck in ("input", "host dispatch") and feed.total_s:
        said.append(feed.bottleneck_note(on_device, scenario.host_dispatch_s))
    return step, bottleneck, [*said, *([device.caveat] if device.caveat else [])]
