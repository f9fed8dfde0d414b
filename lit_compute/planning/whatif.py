"""``lit_compute.whatif``: the step time, throughput, MFU, memory fit and cost of a measured run on other hardware,
node counts and networks.

The run brings what a FLOP ratio lacks (:class:`RunFacts`, read from its TensorBoard folder): the FLOPs, bytes and
kernels of one training batch by op class (FlopsLogger's ``compute/op_classes``), the step split into data wait
and compute (StepTimeMonitor), the collectives' share and overlap (ProfilerWindow), the measured all-reduce
bandwidth (CommBenchmark) and the memory's parts (MemoryMonitor). A target step is then priced part by part:

- **compute**: per op class, the larger of its FLOPs over the chip's peak and its bytes over the chip's memory
  bandwidth (a roofline), at efficiencies (fractions of those peaks) plus a launch cost per kernel; an op on tensor
  cores also spends its FLOPs' worth of the SMs' own work (addresses, loads, the epilogue) at the chip's SMs x clock,
  in series, which a higher tensor rate per SM does not shorten (:func:`sm_rate`). On the run's own
  hardware the efficiency is *measured*: the one factor that makes the roofline of the run equal its measured
  compute time. Elsewhere it is :data:`DEFAULT_EFFICIENCY` (docs/whatif.md names the results it was set on). The
  micro-batch scales every class but the optimizer's step (and the matmuls' weight traffic), and an accumulated
  step runs every class once a micro-batch but the optimizer's, which steps once; the precision scales
  the bytes (two per value in bf16/fp16) and picks the peak of the compute dtype.
- **input**: the host's work for each batch, which a faster chip does not shorten. A loader in the training process
  (no workers) costs Lightning's fetch (fixed per batch) plus the loader's own cost per batch and per sample, timed
  apart from the run at two batch sizes (:mod:`lit_compute.planning.loader_cost`); a fixed cost is not multiplied
  by the micro-batch. On an accelerator the host fetches the next batch while the device runs the queued kernels,
  so the step is the longer of the two (the output says when the host is the bottleneck); on a CPU they add. A
  loader with workers prefetches, and the rate it fed at when the run waited for it is a ceiling on the throughput.
- **communication**: the gradients' all-reduce (DDP: ``2(N-1)/N`` of the gradient bytes per rank, ring) or FSDP2's
  gathers and reduce-scatter (``(N-1)/N`` of twice the parameters and once the gradients) over the slowest link
  (the chip's own within a node, the network across nodes), less the overlap with compute the run measured (none
  assumed when it measured none).
- **memory**: MemoryMonitor's parts scaled by precision, sharding and micro-batch against the chip's capacity.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_compute.formatting import first_line
from lit_compute.hardware.chips import LINKS, Chip, Link, chip_for_name
from lit_compute.hardware.dtypes import compute_dtype, half_weights

__all__ = [
    "CHECKED_FILE",
    "DEFAULT_EFFICIENCY",
    "Calibration",
    "Prediction",
    "RunFacts",
    "Scenario",
    "WhatifError",
    "calibrate",
    "checked_on",
    "pays_transposes",
    "precision_class",
    "predict",
    "read_run",
    "sm_rate",
    "with_loader_cost",
]

#: Fractions of the datasheet peaks a well-fed chip reaches, and the launch cost of one kernel, used for hardware the
#: run did not run on. The FLOP fractions and the launch cost were fitted by ``lit-compute bench whatif --fit-defaults``
#: on the fit set of ``lit_compute/bench/published_gpu.csv`` (16 published V100 and A100 results of NVIDIA
#: DeepLearningExamples: ResNet-50, ResNeXt-101-32x4d, EfficientNet-B0, BERT-large; least squares on the log of
#: the throughput): ``tensor``/``vector``/``tf32`` for matmuls and attention on half-precision tensor cores, without
#: them and on TF32 ones; ``conv_*`` the same for convolutions; ``grouped`` the fraction of that a grouped convolution
#: reaches, ``depthwise`` the fraction of the vector peak and of the bandwidth a depthwise one reaches; ``sm`` the
#: multiple of :func:`sm_rate` at which a tensor-core op's FLOPs pass through the SMs (V100: 1,024 tensor FLOP per SM
#: and clock, A100 2,048, Hopper 4,096, the GeForce cards 512: the fit's two generations set it). The file's
#: check set (other models, eight other chips, this project's H200 runs) is never fitted on; docs/whatif.md quotes
#: its errors. ``bandwidth`` is what BabelStream-class copies reach of HBM (about 85%); ``network`` what a ring
#: all-reduce reaches of a link (NCCL's tests: about 80%).
DEFAULT_EFFICIENCY = {
    "tensor": 0.967,
    "vector": 0.913,
    "tf32": 1.0,
    "conv_tensor": 0.457,
    "conv_vector": 0.735,
    "conv_tf32": 0.231,
    "grouped": 0.225,
    "depthwise": 0.192,
    "bandwidth": 0.85,
    "network": 0.8,
    "launch_s": 1e-06,
    "sm": 3.95,
}
_HEAVY = ("matmul", "conv", "conv_grouped", "attention")  # the op classes that run on tensor cores (not depthwise)
_DTYPE_BYTES = {"32": 4.0, "tf32": 4.0, "64": 8.0, "bf16-mixed": 2.0, "16-mixed": 2.0, "bf16-true": 2.0, "16-true": 2.0}


class WhatifError(ValueError):
    """A run folder without what a prediction needs, or a bad argument: the message names what to add or fix."""


@dataclass
class RunFacts:
    """What a measured run says (per device, per training batch unless said otherwise)."""

    path: Path
    by_class: dict[str, tuple[float, float, float]]  # op class -> (hardware FLOPs, bytes, kernels) per batch
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
    channels_first: tuple[float, float, float] = (0.0, 0.0, 0.0)
    #: bytes of the weights the convolutions' forward ops took per batch (each weight once a call): what a CPU sets up
    #: for its convolutions whatever the batch (:func:`conv_setup_seconds`)
    conv_weights: float = 0.0
    #: precision -> the op classes of one batch counted again at that precision on fake CPU tensors (autocast's
    #: casts included), at the run's micro-batch (:func:`lit_compute.planning.config_facts.with_counts_at`)
    recounted: dict[str, dict[str, tuple[float, float, float]]] = field(default_factory=dict)

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
            if chip.kind != "cpu" or not (chip.name == "this" or chip.extras.get("this")):
                return False
            here = chip.extras.get("device_name")
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

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node


@dataclass
class Calibration:
    """Fractions of the peaks: measured on the run's own hardware (one factor for FLOPs and bytes alike), or the
    defaults."""

    tensor: float
    vector: float
    bandwidth: float
    launch_s: float
    network: float
    source: str
    conv_tensor: float | None = None  # convolutions' own fractions (None: those of the matmuls)
    conv_vector: float | None = None
    tf32: float | None = None  # matmuls on TF32 tensor cores (None: the half-precision fraction)
    conv_tf32: float | None = None  # convolutions on TF32 tensor cores (None: conv_tensor)
    grouped: float = 1.0  # grouped convolutions reach this fraction of what dense ones reach
    depthwise: float = 1.0  # depthwise convolutions reach this fraction of the vector fraction and of the bandwidth
    #: the SMs' own work around a tensor-core op: its FLOPs at this multiple of :func:`sm_rate`, on top of the
    #: tensor cores' time (None: not priced, as on a run's own hardware, where one measured factor holds it)
    sm: float | None = None
    #: predictions add a CPU's convolution set-up apart (:func:`conv_setup_seconds`); False where the run's measured
    #: compute was not more than that set-up, so calibration could not take it out and the one factor holds it
    conv_setup: bool = True

    def efficiency(self, kind: str, tensor_cores: bool, tf32: bool = False) -> float:
        """The fraction of the FLOP peak an op class reaches: convolutions and matmuls each their own, on tensor
        cores (half precision, or TF32 when ``tf32``) or without (float32); grouped convolutions a fraction of the
        dense ones'; depthwise ones (no tensor cores) a fraction of the vector one; every other class the vector
        one."""
        if kind == "conv_depthwise":
            return self.vector * self.depthwise
        if kind in ("conv", "conv_grouped"):
            value = self.conv_tensor if tensor_cores else self.conv_vector
            if tensor_cores and tf32 and self.conv_tf32 is not None:
                value = self.conv_tf32
            if value is not None:
                return value * (self.grouped if kind == "conv_grouped" else 1.0)
        if tensor_cores and kind in _HEAVY:
            return self.tf32 if tf32 and self.tf32 is not None else self.tensor
        return self.vector


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


# -- reading a run ---------------------------------------------------------------------------------------------
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
        by_class={
            k: (float(v[0]), float(v[1]), float(v[2]) if len(v) > 2 else 0.0) for k, v in table["by_class"].items()
        },
        samples=int(table["samples"]),
        model_flops=float(table.get("model_flops", 0)),
        channels_first=_triple(table.get("channels_first_conv")),
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
        curves={
            op: [(float(size), gbps * 1e9) for size, gbps in run.scalars[f"comm/{op}_busbw_gbps"] if gbps > 0]
            for op in ("allreduce", "allgather", "reducescatter")
            if f"comm/{op}_busbw_gbps" in run.scalars
        },
        ddp_bucket_cap_mb=float(table.get("ddp_bucket_cap_mb") or 25.0),
        fsdp_units=int(table.get("fsdp_units") or 0),
        notes=notes,
    )


def _conv_weights(table: dict[str, Any]) -> float:
    """The forward convolutions' weight bytes per batch from a run's op-class record; from a record made before they
    were kept, which holds only the channels-first convolutions' weights (forward, data gradient and weight
    gradient: three times the forward's), a third of those."""
    if isinstance(table.get("conv_weights"), (int, float)):
        return float(table["conv_weights"])
    return _triple(table.get("channels_first_conv"))[1] / 3


def _triple(value: Any) -> tuple[float, float, float]:
    """A run record's ``[a, b, c]`` as floats; zeros when the record has none (a run counted before it was kept)."""
    return (
        (float(value[0]), float(value[1]), float(value[2]))
        if isinstance(value, list) and len(value) == 3
        else (0.0, 0.0, 0.0)
    )


# -- the model -------------------------------------------------------------------------------------------------
def _value_bytes(precision: str, kind: str, cpu: bool = False) -> float:
    """Bytes per value an op class moves under a precision. Mixed precision: the matmuls' operands in the compute
    dtype; on GPUs autocast's outputs flow on in half (elementwise ops and norms too); on CPUs autocast runs norms in
    float32, so the elementwise ops around them stay float32 and casts are added (:func:`_autocast_casts`). The
    optimizer's step is float32 unless the weights themselves are half (``-true``)."""
    p = precision.lower()
    if p in ("32", "32-true", "tf32", "float32"):
        return 4.0
    if half_weights(p):
        return 2.0
    if kind == "optimizer":
        return 4.0
    if cpu and kind == "elementwise":
        return 4.0
    return 2.0


def _autocast_casts(run: RunFacts, precision: str, cpu: bool = False) -> tuple[float, float]:
    """(bytes, kernels) autocast adds to a step of mixed precision beyond what a float32 step moves: every trainable
    weight cast to the compute dtype for the forward and its gradient back (4 + 2 bytes each way); on CPUs also a cast
    kernel before and after every matmul (its float32 neighbours). Negative from a mixed run to a float32 target."""

    def mixed(p: str) -> bool:
        return p.lower().endswith("-mixed")

    sign = (1 if mixed(precision) else 0) - (1 if mixed(run.precision) else 0)
    if not sign:
        return 0.0, 0.0
    matmuls = sum(run.by_class.get(kind, (0, 0, 0))[2] for kind in _HEAVY)
    return sign * 12.0 * run.trainable / max(1, run.tensor_parallel), sign * (2.0 if cpu else 1.0) * matmuls


def conv_setup_seconds(run: RunFacts, chip: Chip, precision: str) -> float:
    """Seconds a batch of ``run`` at ``precision`` spends setting up its convolutions on ``chip``, a CPU, whatever the
    micro-batch: oneDNN reorders each weight into its blocked layouts every call (the forward, the data gradient) and
    the weight gradient back. The forward convolutions' weights (:attr:`RunFacts.conv_weights`, in ``precision``'s
    bytes: bf16 under CPU autocast) at the chip's measured cost per weight byte in that dtype
    (``chip.extras["conv_setup"]``, :func:`lit_compute.hardware.this_machine.with_conv_setup`); 0 on an accelerator
    (cuDNN convolves the weight as it lies), without convolutions, or where the cost was not measured."""
    rates = chip.extras.get("conv_setup") if chip.kind == "cpu" else None
    rate = rates.get(compute_dtype(precision)) if isinstance(rates, dict) else None
    if not rate or not run.conv_weights:
        return 0.0
    scale = _value_bytes(precision, "conv", cpu=True) / _value_bytes(run.precision, "conv", cpu=True)
    return float(rate) * run.conv_weights * scale


def pays_transposes(chip: Chip, precision: str) -> bool:
    """Whether ``chip`` at ``precision`` transposes channels-first convolutions for its tensor cores: a GPU (cuDNN
    convolves 16-bit tensors channels-last) at fp16 or bf16; not a CPU, not float32 or TF32."""
    return chip.kind != "cpu" and precision_class(precision) == "16 bits"


def _transposes(run: RunFacts, chip: Chip, precision: str, ratio: float) -> tuple[float, float, float] | None:
    """(FLOPs, bytes, kernels) of the transposes a GPU runs at 16 bits for the run's channels-first convolutions, at
    ``ratio`` times the run's micro-batch: each tensor read and written once more (cuDNN convolves channels-last on
    tensor cores); None on a CPU, in float32 or TF32, or when every convolution is channels-last."""
    activations, weights, tensors = run.channels_first
    if not tensors or not pays_transposes(chip, precision):
        return None
    scale = _value_bytes(precision, "conv") / _value_bytes(run.precision, "conv")
    return 0.0, 2.0 * (activations * ratio + weights) * scale, tensors


def _scaled_classes(run: RunFacts, scenario: Scenario) -> dict[str, tuple[float, float, float]]:
    """The run's per-batch FLOPs, bytes and kernels by class at the scenario's micro-batch and precision (per
    device; a tensor-parallel run's shares stay shares)."""
    ratio = scenario.micro_batch / run.samples
    out = {}
    run_cpu, cpu = run.device.lower() in ("cpu", "this"), scenario.chip.kind == "cpu"
    # a CPU target at a precision the step was counted at again: those counts (CPU autocast's casts among them)
    recount = run.recounted.get(scenario.precision) if cpu else None
    table, source = (recount, scenario.precision) if recount else (run.by_class, run.precision)
    source_cpu = run_cpu or bool(recount)  # the recount is traced under CPU autocast
    weight_bytes = 3.0 * run.trainable * _value_bytes(source, "matmul", source_cpu) / max(1, run.tensor_parallel)
    # the weights' traffic (read in forward and backward, their gradient written) does not grow with the batch: it is
    # booked to the convolutions first, the rest to the matmuls (the classes do not say whose weights are whose)
    for kind, (flops, moved, kernels) in sorted(table.items(), key=lambda item: not item[0].startswith("conv")):
        if kind == "optimizer":
            f, b = flops, moved
        elif kind.startswith("conv") or kind == "matmul":
            fixed = min(moved, weight_bytes)
            weight_bytes -= fixed
            f, b = flops * ratio, fixed + (moved - fixed) * ratio
        elif kind == "elementwise" and recount and source.lower().endswith("-mixed"):
            # autocast's weight casts (each weight once per forward, its gradient back: 12 bytes) are per step
            fixed = min(moved, 12.0 * run.trainable / max(1, run.tensor_parallel))
            f, b = flops * ratio, fixed + (moved - fixed) * ratio
        else:
            f, b = flops * ratio, moved * ratio
        b *= _value_bytes(scenario.precision, kind, cpu) / _value_bytes(source, kind, source_cpu)
        out[kind] = (f, b, kernels)
    transposes = _transposes(run, scenario.chip, scenario.precision, ratio)
    if transposes:
        out["transpose"] = transposes
    if recount:
        return out
    casts, kernels = _autocast_casts(run, scenario.precision, cpu)
    if casts or kernels:
        f, b, k = out.get("elementwise", (0.0, 0.0, 0.0))
        out["elementwise"] = (f, max(0.0, b + casts), max(0.0, k + kernels))
    return out


def sm_rate(chip: Chip) -> float:
    """The rate the SMs do the work around a tensor-core op at (FLOP/s): SMs x clock x 1,024, a V100 SM's tensor
    FLOP a clock. A chip without SM figures (a TPU, a CPU, a row of your own without ``sms``) is taken at an
    A100's ratio, half its 16-bit peak."""
    if chip.sm_clock:
        return chip.sm_clock * 1e9 * 1024
    return (chip.peak("bfloat16") or chip.peak("float16") or chip.peak("float32") or 0.0) / 2


def _roofline(
    classes: dict[str, tuple[float, float, float]], chip: Chip, precision: str, cal: Calibration
) -> tuple[float, float, float]:
    """(seconds, of which compute-bound, of which bandwidth-bound) of one batch on ``chip``."""
    dtype = compute_dtype(precision)
    tensor_peak = chip.peak(dtype) or chip.peak("float32") or 0.0
    vector_peak = chip.peak("float32") or tensor_peak
    if not tensor_peak:
        raise WhatifError(
            f"{chip.name} has no {dtype} peak in the table ({', '.join(sorted(chip.peaks))}); choose "
            "another --precision or add the peak with --hardware-file"
        )
    total = flops_bound = bytes_bound = 0.0
    for kind, (flops, moved, kernels) in classes.items():
        # fused attention runs on tensor cores in half precision only: flash attention takes fp16/bf16, and float32
        # (TF32 allowed or not) falls back to the memory-efficient kernel on the vector units
        heavy = kind in _HEAVY and not (kind == "attention" and dtype == "tf32")
        own = (chip.peak_of(kind.split("_")[0], dtype) or tensor_peak) if heavy else vector_peak
        peak = own * cal.efficiency(kind, heavy and dtype != "float32", dtype == "tf32")
        t_flops = flops / peak if flops else 0.0
        bandwidth = chip.bandwidth * cal.bandwidth * (cal.depthwise if kind == "conv_depthwise" else 1.0)
        t_bytes = moved / bandwidth if moved else 0.0
        seconds = max(t_flops, t_bytes) + kernels * cal.launch_s
        if cal.sm and flops and heavy and dtype != "float32":  # tensor cores: the SMs' own share, in series
            on_sms = flops / (cal.sm * sm_rate(chip))
            t_flops, seconds = t_flops + on_sms, seconds + on_sms
        total += seconds
        if t_flops >= t_bytes:
            flops_bound += seconds
        else:
            bytes_bound += seconds
    return total, flops_bound, bytes_bound


def _step_roofline(
    classes: dict[str, tuple[float, float, float]], chip: Chip, precision: str, cal: Calibration, accumulate: int
) -> tuple[float, float, float]:
    """(seconds, of which compute-bound, of which bandwidth-bound) of one optimizer step: ``accumulate`` batches of
    every class but the optimizer's, which steps once."""
    batch = {k: v for k, v in classes.items() if k != "optimizer"}
    once = {k: v for k, v in classes.items() if k == "optimizer"}
    per_batch, step = _roofline(batch, chip, precision, cal), _roofline(once, chip, precision, cal)
    n = max(1, accumulate)
    return per_batch[0] * n + step[0], per_batch[1] * n + step[1], per_batch[2] * n + step[2]


def _step_kernels(classes: dict[str, tuple[float, float, float]], accumulate: int) -> float:
    """The kernels of one optimizer step (the optimizer's once, the others' ``accumulate`` times)."""
    return sum(k * (1 if kind == "optimizer" else max(1, accumulate)) for kind, (_, _, k) in classes.items())


def calibrate(run: RunFacts, chip: Chip) -> Calibration:
    """The efficiency of the run on its own hardware: the one fraction of the peaks (FLOPs and bytes alike, no launch
    cost) that makes the roofline of one measured step equal its measured compute time (step minus data wait, minus
    the collectives the profiler saw not overlapped)."""
    if run.step_s is None:
        raise WhatifError(
            f"{run.path} has no measured step time (time/step_ms): train with lit_compute.StepTimeMonitor "
            "to calibrate on this hardware"
        )
    exposed = 0.0
    if run.comm_fraction is not None:
        exposed = run.comm_fraction * (1.0 - (run.comm_overlap or 0.0)) * run.step_s
    measured = run.step_s - (run.wait_s or 0.0) - exposed
    # the convolutions' set-up on a CPU does not grow with the batch: measured apart, so the factor is of the rest
    setup = conv_setup_seconds(run, chip, run.precision) * max(1, run.accumulate)
    apart = setup < measured
    if apart:
        measured -= setup
    unit = Calibration(1.0, 1.0, 1.0, 0.0, DEFAULT_EFFICIENCY["network"], "")
    classes = dict(run.by_class)
    if transposes := _transposes(run, chip, run.precision, 1.0):
        classes["transpose"] = transposes
    ideal = _step_roofline(classes, chip, run.precision, unit, run.accumulate)[0]
    if measured <= 0 or ideal <= 0:
        raise WhatifError(f"{run.path}: the measured compute time is {measured * 1e3:.3g} ms; nothing to calibrate on")
    factor = ideal / measured
    source = f"measured on {run.path.name}: {100 * factor:.3g}% of the peaks"
    if not apart:
        source += (
            f" (the convolutions' set-up measured on this CPU, {setup * 1e3:,.4g} ms, is not less than the run's "
            f"measured compute, {measured * 1e3:,.4g} ms: the one factor holds it, not priced apart)"
        )
    return Calibration(factor, factor, factor, 0.0, DEFAULT_EFFICIENCY["network"], source, conv_setup=apart)


def default_calibration() -> Calibration:
    d = DEFAULT_EFFICIENCY
    return Calibration(
        d["tensor"],
        d["vector"],
        d["bandwidth"],
        d["launch_s"],
        d["network"],
        "defaults (docs/whatif.md: fitted on the fit set of published GPU results)",
        d["conv_tensor"],
        d["conv_vector"],
        d["tf32"],
        d["conv_tf32"],
        d["grouped"],
        d["depthwise"],
        d["sm"],
    )


#: the check rows of ``published_gpu.csv`` priced at :data:`DEFAULT_EFFICIENCY`, as ``lit-compute bench whatif --only
#: gpu --errors`` wrote them (their command, commit and efficiencies inside): what :func:`checked_on` quotes
CHECKED_FILE = Path(__file__).resolve().parents[1] / "bench" / "published_gpu_errors.json"


def precision_class(precision: str) -> str:
    """What decides which of a chip's peaks a precision runs at: "16 bits" (fp16 or bf16), "TF32" or "float32"."""
    dtype = compute_dtype(precision)
    return "16 bits" if dtype in ("float16", "bfloat16") else "TF32" if dtype == "tf32" else "float32"


def checked_on(chip: str, precision: str, path: Path = CHECKED_FILE) -> str | None:
    """What the default efficiencies missed the published results of ``chip`` at ``precision`` (16 bits, TF32 or
    float32) they were not fitted on by: a note for a prediction at the defaults on that chip (whose label the note
    follows), which is only as good as those. Says so too when the defaults were fitted on that chip and precision,
    or when no result checks them there. None when the file is missing or was written at other efficiencies."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("efficiencies") != DEFAULT_EFFICIENCY:
        return None
    bits = precision_class(precision)
    rows = [r for r in data["rows"] if r["chip"] == chip and precision_class(r["precision"]) == bits]
    fitted = any(c == chip and precision_class(p) == bits for c, p in data.get("fitted_on", []))
    where = f"at {bits}, whatif's default efficiencies"
    source = f"lit-compute bench whatif at {data['commit']}, docs/whatif.md"
    fitted_here = " were fitted on this chip's published results" if fitted else ""
    if not rows:
        return (
            f"{where}{fitted_here}; no other result checks them there ({source})"
            if fitted
            else f"at {bits}, no published result checks whatif's default efficiencies on this chip ({source}): take "
            "the figures as unchecked"
        )
    errors = sorted(((r["predicted"] / r["published"] - 1) * 100, r["model"]) for r in rows)
    if len(errors) <= 4:
        found = ", ".join(f"{model} {error:+.1f}%" for error, model in errors)
    else:
        found = (
            f"median {statistics.median(e for e, _ in errors):+.1f}%, from {errors[0][0]:+.1f}% "
            f"({errors[0][1]}) to {errors[-1][0]:+.1f}% ({errors[-1][1]})"
        )
    missed = (
        f"{fitted_here}; they missed {len(rows)} other(s) they were not fitted on by"
        if fitted
        else f" missed {len(rows)} published result(s) of this chip they were not fitted on by"
    )
    return f"{where}{missed}: {found} (+: predicted faster than published; {source})"


def messages(run: RunFacts, scenario: Scenario) -> dict[str, list[float]]:
    """The collectives of one optimizer step per rank, by kind, as message sizes in bytes (nccl-tests' sizes: an
    all-reduce's buffer, an all-gather's and a reduce-scatter's whole output). DDP: the gradients in buckets (a first
    of 1 MiB, then ``bucket_cap_mb``); FSDP2: every unit's parameters gathered in forward and again in backward, its
    gradients reduce-scattered once."""
    tp = max(1, run.tensor_parallel)
    grad_bytes = run.trainable * (2.0 if half_weights(scenario.precision) else 4.0) / tp
    if run.sharded:
        units = max(1, run.fsdp_units)
        param_bytes = run.trainable * _value_bytes(scenario.precision, "matmul") / tp
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


def predict(run: RunFacts, scenario: Scenario, cal: Calibration, measured_links: bool = False) -> Prediction:
    """The target step of ``scenario`` for ``run`` at efficiencies ``cal`` (see the module docstring).
    ``measured_links``: price the collectives at the bandwidths the run's CommBenchmark measured (the run's own
    machines) instead of the link table's."""
    chip = scenario.chip
    notes: list[str] = []
    classes = _scaled_classes(run, scenario)
    compute, flops_bound, bytes_bound = _step_roofline(classes, chip, scenario.precision, cal, run.accumulate)
    samples_per_step = scenario.micro_batch * run.accumulate
    setup = conv_setup_seconds(run, chip, scenario.precision) * max(1, run.accumulate) if cal.conv_setup else 0.0
    if setup:
        compute += setup
        rate = chip.extras["conv_setup"][compute_dtype(scenario.precision)]
        notes.append(
            f"{setup * 1e3:.3g} ms of the step sets up the convolutions whatever the micro-batch: on a CPU "
            "oneDNN reorders each weight into its blocked layouts every call "
            f"({setup / max(1, run.accumulate) / rate / 1e6:.3g} MB "
            f"of weights a batch at {rate * 1e9:.3g} ns a byte, measured on this CPU)"
        )
    if "transpose" in classes:
        spent = _roofline({"transpose": classes["transpose"]}, chip, scenario.precision, cal)[0] * run.accumulate
        notes.append(
            f"{spent * 1e3:.3g} ms of the device's step transposes channels-first convolutions' tensors for "
            "the tensor cores (cuDNN convolves 16-bit tensors channels-last): lit_compute.speedup.ChannelsLast "
            "saves it"
        )
    # input: the host's work for each batch that a faster chip does not shorten
    host, loader_rate = _host_input(run, scenario, notes)
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
    exposed = comm * (1.0 - overlap)
    device = compute + exposed
    # an accelerator runs its queued kernels while the host fetches the next batch: the step is the longer of the two;
    # a CPU does both itself, one after the other
    accelerator = chip.kind != "cpu"
    # on the run's own chip the measured wait is already the part of the host's work the device did not hide (and
    # its measured compute already holds any wait for the host's dispatch)
    overlaps = accelerator and not run.runs_on(chip)
    # eager mode: the host runs Python, autograd and the dispatcher for every kernel before the device can run it
    kernels = _step_kernels(classes, run.accumulate)
    dispatch = kernels * scenario.host_dispatch_s if overlaps else 0.0
    step = max(device, host + dispatch) if overlaps else device + host
    bottleneck = "compute" if flops_bound >= bytes_bound else "memory bandwidth"
    if host + dispatch > (device if accelerator else max(compute, exposed)):
        bottleneck = "input" if host >= dispatch else "host dispatch"
    if loader_rate is not None and samples_per_step / loader_rate > step:
        step, bottleneck = samples_per_step / loader_rate, "input"
    elif exposed > compute and exposed > host + dispatch:
        bottleneck = "communication"
    if accelerator and bottleneck in ("input", "host dispatch") and host + dispatch:
        parts = (
            [
                f"{dispatch * 1e3:.3g} ms dispatching {kernels:,.0f} eager kernels "
                f"({scenario.host_dispatch_s * 1e6:.3g} us each)"
            ]
            if dispatch
            else []
        )
        measured = run.step_s is not None and run.wait_s is not None  # a run's wait holds Lightning's fetch too
        parts += [f"{host * 1e3:.3g} ms of loading" + (" and Lightning's own work" if measured else "")] if host else []
        notes.append(
            f"the host is the bottleneck: {' and '.join(parts)} per step against {device * 1e3:.3g} ms on "
            "the device"
            + (
                "; fewer, larger kernels (torch.compile, CUDA graphs, a larger micro-batch) would shorten it"
                if dispatch > host
                else ""
            )
        )
    if (
        not accelerator
        and not setup
        and scenario.micro_batch != run.samples
        and any(kind.startswith("conv") and flops for kind, (flops, _, _) in classes.items())
    ):
        side = "slow (an upper bound)" if scenario.micro_batch > run.samples else "fast (a lower bound)"
        notes.append(
            f"on a CPU a convolution's time grows less than its FLOPs with the batch, which one efficiency "
            f"per class does not follow (docs/whatif.md, This CPU): micro-batch {scenario.micro_batch} "
            f"against the run's {run.samples} leans {side}"
        )
    replicas = scenario.devices // max(1, run.tensor_parallel)
    samples_per_s = replicas * samples_per_step / step
    peak = chip.peak(compute_dtype(scenario.precision)) or chip.peak("float32")
    model_flops = run.model_flops * scenario.micro_batch / run.samples * run.accumulate
    mfu = model_flops / step / peak if peak else None
    if chip.extras.get("busy"):  # a peak measured under load is a lower bound: an MFU against it can pass 1
        mfu = None
        notes.append(f"{chip.name}: {chip.extras['busy']}; MFU is not given (run again on a quiet machine)")
    fits, peak_memory = _memory(run, scenario)
    cost = None
    if scenario.price_per_hour is not None:
        cost = 1e6 / samples_per_s / 3600 * scenario.devices * scenario.price_per_hour
    return Prediction(
        hardware=chip.name,
        nodes=scenario.nodes,
        devices_per_node=scenario.devices_per_node,
        network=link.name,
        precision=scenario.precision,
        micro_batch=scenario.micro_batch,
        step_time_s=step,
        compute_s=compute,
        input_s=max(0.0, step - device),
        host_s=host,
        dispatch_s=dispatch,
        comm_s=exposed,
        comm_total_s=comm,
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * run.tokens_per_sample if run.tokens_per_sample else None,
        mfu=mfu,
        bottleneck=bottleneck,
        fits=fits,
        peak_memory_bytes=peak_memory,
        cost_per_million=cost,
        notes=notes,
    )


def _host_input(run: RunFacts, scenario: Scenario, notes: list[str]) -> tuple[float, float | None]:
    """(seconds of host input work per step, the feed-rate ceiling of a loader with workers or None).

    A loader without workers runs in the training process: the run's measured wait per batch is Lightning's fetch and
    hooks (fixed per batch) plus the loader's own cost, timed apart at two batch sizes (:mod:`loader_cost`): per
    batch and per sample. At the target's micro-batch: the fixed part, the loader's per-batch cost and its per-sample
    cost times the samples. Without the loader's timing the whole wait is priced per batch (a note says so). A loader
    with workers prefetches: when the run waited for it, the rate it fed at is a ceiling. Facts without a measured
    step (a config counted before any run) have only the loader's timing: in the process it is the host's time, with
    workers each worker loads whole batches at that cost, side by side (the ceiling)."""
    if run.wait_s is None or not run.step_s:
        if run.loader is None:
            return 0.0, None
        per_batch = run.loader.at(scenario.micro_batch)
        if run.loader_workers:
            return 0.0, run.loader_workers * scenario.micro_batch / per_batch if per_batch > 0 else None
        return per_batch * max(1, run.accumulate), None
    if run.loader_workers == 0:
        waited = run.wait_s / max(1, run.accumulate)  # per batch
        if run.loader is not None:
            fixed = max(0.0, waited - run.loader.at(run.samples))
            per_batch = fixed + run.loader.at(scenario.micro_batch)
        else:
            per_batch = waited
            if scenario.micro_batch != run.samples:
                notes.append(
                    "the loader's cost per sample is not known (its loader was not timed apart): the run's "
                    "data wait is priced per batch, at any micro-batch"
                )
        return per_batch * run.accumulate, None
    if run.wait_s > 0.05 * run.step_s:
        return 0.0, run.samples_per_step / run.step_s  # the run waited for it: the rate it fed at
    return 0.0, None


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


def _memory(run: RunFacts, scenario: Scenario) -> tuple[bool | None, float | None]:
    """MemoryMonitor's parts of the run scaled to the scenario, against the chip's memory (None without them)."""
    if not run.memory or not math.isfinite(scenario.chip.memory):
        return None, None
    ratio = scenario.micro_batch / run.samples
    value = _value_bytes(scenario.precision, "elementwise") / _value_bytes(run.precision, "elementwise")
    weights = (2.0 if half_weights(scenario.precision) else 4.0) / (2.0 if half_weights(run.precision) else 4.0)
    shards = max(1, scenario.devices // max(1, run.tensor_parallel)) if run.sharded else 1
    run_shards = run.data_parallel if run.sharded else 1
    kept = (
        (run.memory["parameters"] + run.memory["gradients"] + run.memory["optimizer"]) * weights * run_shards / shards
    )
    peak = kept + (run.memory["activations"] + run.memory["other"]) * ratio * value
    return peak <= scenario.chip.memory, peak
