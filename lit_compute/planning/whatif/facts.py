"""What a measured run says and what a prediction targets: :class:`RunFacts` (read from a run folder by
:func:`read_run`), :class:`Scenario`, and :class:`OpCost`, the FLOPs, bytes and kernels of one op class."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from lit_compute.flops.kernel_shapes import KernelShape
from lit_compute.formatting import first_line
from lit_compute.hardware.chips import Chip, Link, ThisMachine, chip_for_name
from lit_compute.hardware.dtypes import Float32Math

__all__ = ["NO_COST", "ChannelsFirst", "OpCost", "RunFacts", "Scenario", "WhatifError", "read_run", "with_loader_cost"]


class OpCost(NamedTuple):
    """What one op class costs per training batch (or per step, for the optimizer's): its hardware FLOPs, the bytes
    its ops read and wrote, and its kernels (one per op)."""

    flops: float
    bytes: float
    kernels: float

    @classmethod
    def of(cls, value: Any) -> OpCost:
        """A run record's ``[flops, bytes]`` or ``[flops, bytes, kernels]`` (kernels 0 where a record has none)."""
        return cls(float(value[0]), float(value[1]), float(value[2]) if len(value) > 2 else 0.0)


#: no cost at all: what an op class a run did not run costs
NO_COST = OpCost(0.0, 0.0, 0.0)


class ChannelsFirst(NamedTuple):
    """The channels-first 2-D convolutions of one batch (:func:`lit_compute.flops.counting.channels_first_tensors`):
    the bytes of their activations and of their weights, and how many tensors."""

    activation_bytes: float
    weight_bytes: float
    tensors: float


class WhatifError(ValueError):
    """A run folder without what a prediction needs, or a bad argument: the message names what to add or fix."""


@dataclass
class RunFacts:
    """What a measured run says (per device, per training batch unless said otherwise)."""

    path: Path
    by_class: dict[str, OpCost]  # op class -> its cost per batch (the optimizer's: per step)
    samples: int  # per batch (micro-batch)
    model_flops: float  # per batch
    accumulate: int = 1
    parameters: int = 0
    trainable: int = 0
    parameter_bytes: int = 0
    precision: str = "32-true"
    device: str = "cpu"  # as torch names it ("NVIDIA H200") or "cpu"
    chip: str | None = None  # the device's key in the hardware table (None: a CPU, or a device the table lacks)
    cpu: str | None = None  # the CPU's model name
    world_size: int = 1
    data_parallel: int = 1
    tensor_parallel: int = 1
    strategy: str = ""
    step_s: float | None = None  # measured mean step time
    wait_s: float | None = None  # measured data wait per step
    tokens_per_sample: float | None = None
    comm_fraction: float | None = None
    comm_overlap: float | None = None
    busbw: float | None = None  # bytes/s, CommBenchmark's all-reduce bus bandwidth (its largest message)
    curves: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # collective -> (bytes, busbw B/s)
    ddp_bucket_cap_mb: float = 25.0
    fsdp_units: int = 0
    memory: dict[str, float] | None = None  # MemoryMonitor's parts at the peak, bytes
    loader_workers: int | None = None
    cpu_cores: int | None = None  # the cores each process could run on (its affinity)
    torch_threads: int | None = None  # the compute threads of each process
    devices_per_node: int = 1
    notes: list[str] = field(default_factory=list)  # what reading the run found (several runs, a cut-short file)
    loader: Any = None  # LoaderCost: the in-process loader's cost per batch and per sample, timed apart (None: unknown)
    #: the channels-first 2-D convolutions' (activation bytes, weight bytes, tensors) per batch, which a GPU transposes
    #: for its tensor cores at 16 bits (:func:`lit_compute.flops.counting.channels_first_tensors`)
    channels_first: ChannelsFirst = ChannelsFirst(0.0, 0.0, 0.0)
    #: bytes of the weights the convolutions' forward ops took per batch (each weight once a call): what a CPU sets up
    #: for its convolutions whatever the batch (:func:`conv_setup_seconds`)
    conv_weights: float = 0.0
    #: precision -> the op classes of one batch counted again at that precision on fake CPU tensors (autocast's
    #: casts included), at the run's micro-batch (:func:`lit_compute.planning.config_facts.with_counts_at`)
    recounted: dict[str, dict[str, OpCost]] = field(default_factory=dict)
    #: torch's float32 switches as the run had them (None: the run did not record them; torch's defaults are priced)
    float32_math: Float32Math | None = None
    compiled: bool | None = None  # the LightningModule ran torch.compile'd (its counts are eager's)
    #: the GEMMs of one batch by class and shape (:mod:`lit_compute.flops.kernel_shapes`): priced as tiles and waves
    #: on a GPU's SMs; empty for a run counted before they were kept (its classes are then priced as a whole)
    kernels: tuple[KernelShape, ...] = ()

    def __post_init__(self) -> None:
        # the records from plain sequences too (a caller's tuples, a checkpoint's lists): the parts read them by name
        self.by_class = {kind: OpCost.of(cost) for kind, cost in self.by_class.items()}
        self.channels_first = ChannelsFirst(*(float(v) for v in self.channels_first))
        self.recounted = {p: {k: OpCost.of(c) for k, c in table.items()} for p, table in self.recounted.items()}
        self.kernels = tuple(KernelShape.of(k) for k in self.kernels)

    @property
    def samples_per_step(self) -> int:
        return self.samples * self.accumulate

    @property
    def sharded(self) -> bool:
        return "ModelParallel" in self.strategy and self.data_parallel > 1

    def runs_on(self, chip: Chip) -> bool:
        """Whether ``chip`` is the hardware this run ran on, so its measured step calibrates the prediction: a GPU run
        on the chip of its table row (``h200-sxm`` for a run on an "NVIDIA H200"), a CPU run on this machine's
        measured CPU when it is the same CPU model (or the run did not record one)."""
        if self.device.lower() in ("cpu", "this"):
            if chip.kind != "cpu" or not (chip.name == "this" or isinstance(chip, ThisMachine)):
                return False
            here = chip.device_name or None if isinstance(chip, ThisMachine) else None
            return self.cpu is None or here is None or here == self.cpu
        own = self.chip or chip_for_name(self.device)
        return own is not None and chip.name == own


@dataclass
class Scenario:
    """A target: chip, precision, micro-batch, nodes x devices per node, the network between nodes, a price."""

    chip: Chip
    precision: str
    micro_batch: int
    nodes: int = 1
    devices_per_node: int = 1
    network: Link | None = None
    price_per_hour: float | None = None  # per device
    host_dispatch_s: float = 0.0  # the host's eager cost per kernel (an accelerator target; 0: not priced)
    float32_math: Float32Math | None = None  # --tf32 on|off: float32 on TF32 cores or not (None: as the run had it)

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node


# -- reading a run ---------------------------------------------------------------------------------------------
def _float32_math(record: Any) -> Float32Math | None:
    """The record's float32 switches; None for a run recorded before they were kept."""
    if record.cudnn_allow_tf32 is None or record.matmul_tf32 is None:
        return None
    return Float32Math(bool(record.cudnn_allow_tf32), bool(record.matmul_tf32))


def read_run(path: str | Path) -> RunFacts:
    """The facts of a run folder (a TensorBoard version folder): its record (``run.json``, or an 0.3.0 run's tables)
    and its measured figures. Raises :class:`WhatifError` naming the component to add when the counted op-class
    table is missing."""
    from lit_compute.report.runs import ReportError, find_runs, load_run

    folder = Path(path)
    try:
        runs = find_runs(folder)
        run = load_run(runs[-1])
    except ReportError as err:
        raise WhatifError(str(err).replace("lit-compute report: ", "")) from None
    notes = list(run.notes)
    if len(runs) > 1:
        last = runs[-1].relative_to(folder) if runs[-1] != folder else runs[-1]
        notes.append(
            f"{folder} holds {len(runs)} runs: priced the last, {last} (name a version folder to price another)"
        )
    record = run.record
    table = record.op_classes if record is not None else None
    if record is None or not table:
        raise WhatifError(
            f"{folder} has no counted op-class table (compute/op_classes): train with "
            "lit_compute.FlopsLogger (and StepTimeMonitor for the measured step time) and point "
            "lit-compute whatif at that run"
        )
    accumulate = int(table.get("accumulate_grad_batches") or 1)
    if accumulate > 1 and "optimizer" not in table["by_class"] and int(table.get("trainable_parameters", 0)):
        notes.append(
            "its counted batch stepped no optimizer (an accumulated step's first batch, as FlopsLogger before "
            "0.4 counted it): the optimizer's step is not priced; a run with this FlopsLogger counts it"
        )
    step_ms, wait_ms = run.mean_step_ms, run.total("time/data_wait_ms")
    samples_rate, token_rate = run.total("time/samples_per_sec"), run.total("time/tokens_per_sec")
    busbw = run.last("comm/allreduce_busbw_gbps")
    memory = None
    if "memory/peak_gb" in run.scalars:
        step, _ = max(run.scalars["memory/peak_gb"], key=lambda p: p[1])
        memory = {
            p: dict(run.scalars.get(f"memory/{p}_gb", [])).get(step, 0.0) * 1e9
            for p in ("parameters", "gradients", "optimizer", "activations", "other")
        }
    return RunFacts(
        path=run.path,
        by_class={k: OpCost.of(v) for k, v in table["by_class"].items()},
        samples=int(table["samples"]),
        model_flops=float(table.get("model_flops", 0)),
        channels_first=_channels_first(table.get("channels_first_conv")),
        accumulate=accumulate,
        conv_weights=_conv_weights(table),
        parameters=int(table.get("parameters", 0)),
        trainable=int(table.get("trainable_parameters", 0)),
        parameter_bytes=int(table.get("parameter_bytes", 0)),
        precision=str(table.get("precision") or record.precision),
        device=record.device,
        chip=record.chip,
        cpu=record.cpu,
        world_size=record.world_size,
        data_parallel=record.data_parallel,
        tensor_parallel=record.tensor_parallel,
        strategy=record.strategy,
        step_s=step_ms / 1e3 if step_ms else None,
        wait_s=wait_ms / 1e3 if wait_ms is not None else None,
        tokens_per_sample=token_rate / samples_rate if token_rate and samples_rate else None,
        comm_fraction=run.mean("profiler/comm_fraction"),
        comm_overlap=run.mean("profiler/comm_overlap_fraction"),
        busbw=busbw * 1e9 if busbw else None,
        memory=memory,
        loader_workers=record.loader_workers,
        cpu_cores=record.cpu_cores,
        torch_threads=record.torch_threads,
        devices_per_node=record.devices_per_node,
        float32_math=_float32_math(record),
        compiled=record.compiled,
        curves={
            op: [(float(size), gbps * 1e9) for size, gbps in run.scalars[f"comm/{op}_busbw_gbps"] if gbps > 0]
            for op in ("allreduce", "allgather", "reducescatter")
            if f"comm/{op}_busbw_gbps" in run.scalars
        },
        ddp_bucket_cap_mb=float(table.get("ddp_bucket_cap_mb") or 25.0),
        fsdp_units=int(table.get("fsdp_units") or 0),
        kernels=tuple(KernelShape.of(k) for k in table.get("kernels") or ()),
        notes=notes,
    )


def _conv_weights(table: dict[str, Any]) -> float:
    """The forward convolutions' weight bytes per batch from a run's op-class record; from a record made before they
    were kept, which holds only the channels-first convolutions' weights (forward, data gradient and weight
    gradient: three times the forward's), a third of those."""
    if isinstance(table.get("conv_weights"), (int, float)):
        return float(table["conv_weights"])
    return _channels_first(table.get("channels_first_conv")).weight_bytes / 3


def _channels_first(value: Any) -> ChannelsFirst:
    """A run record's ``[activation bytes, weight bytes, tensors]``; zeros when the record has none (a run counted
    before it was kept)."""
    if isinstance(value, list) and len(value) == 3:
        return ChannelsFirst(float(value[0]), float(value[1]), float(value[2]))
    return ChannelsFirst(0.0, 0.0, 0.0)


def with_loader_cost(run: RunFacts) -> RunFacts:
    """``run`` with its in-process loader timed apart when it had no workers and waited for data, timed once and kept
    in the run folder (:func:`~lit_compute.planning.loader_cost.kept_loader_cost`; a note gives the figures and where
    they are kept); a note where that cannot be done (no config in the run folder, a loader that does not build
    here)."""
    if run.loader_workers != 0 or not run.wait_s or run.loader is not None:
        return run
    from lit_compute.planning.loader_cost import kept_loader_cost

    try:
        run.loader, note = kept_loader_cost(run.path, run.samples)
        run.notes.append(note)
    except Exception as err:  # noqa: BLE001 - the user's data code: the reason in one line, priced without it
        run.notes.append(f"the loader could not be timed apart ({first_line(err)}): its data wait is priced per batch")
    return run
