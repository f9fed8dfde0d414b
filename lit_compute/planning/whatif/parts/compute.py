"""The compute part: every op class of the run's batch scaled to the target's micro-batch and precision, each priced
on the target chip as a roofline (the larger of its FLOPs over the chip's peak and its bytes over its bandwidth, at
the calibration's efficiencies, plus a launch cost per kernel), the tensor-core ops' share of the SMs in series, a
CPU's convolution set-up apart, and the transposes a GPU adds for channels-first convolutions at 16 bits. Also the
calibration on the run's own hardware: the one factor that makes the run's roofline equal its measured compute."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from lit_compute.hardware.chips import Chip, ThisMachine
from lit_compute.hardware.dtypes import Float32Math, compute_dtype, half_weights
from lit_compute.planning.whatif.calibration import (
    DEFAULT_EFFICIENCY,
    TENSOR_CORE_CLASSES,
    Calibration,
    precision_class,
)
from lit_compute.planning.whatif.facts import NO_COST, OpCost, RunFacts, Scenario, WhatifError
from lit_compute.planning.whatif.parts.kernels import KernelWork, scaled_kernels
from lit_compute.planning.whatif.parts.part import Part

__all__ = [
    "ComputePart",
    "calibrate",
    "conv_setup_seconds",
    "float32_math",
    "pays_transposes",
    "price",
    "scaled_classes",
    "sm_rate",
    "step_kernels",
    "tf32_cores",
    "value_bytes",
]


class Roofline(NamedTuple):
    """The seconds of a batch or a step on a chip, and how many of them are compute-bound and bandwidth-bound."""

    seconds: float
    flops_bound_s: float
    bytes_bound_s: float


@dataclass(frozen=True)
class ComputePart(Part):
    """The device's compute per optimizer step: ``seconds`` (the convolutions' set-up on a CPU included), bound by
    "compute" or "memory bandwidth" (whichever holds more of the roofline's time); its ``kernels``; ``caveat``: what
    the user is told after the step's bottleneck (a CPU's convolutions at another micro-batch), if anything."""

    kernels: float = 0.0
    caveat: str | None = None


def price(run: RunFacts, scenario: Scenario, cal: Calibration) -> ComputePart:
    """The compute of one optimizer step of ``run`` on ``scenario``'s chip at ``cal``'s efficiencies."""
    chip, precision, notes = scenario.chip, scenario.precision, []
    classes = scaled_classes(run, scenario)
    math = float32_math(run, scenario)
    works = _kernel_works(run, scenario.micro_batch / run.samples, chip, precision, math)
    seconds, flops_bound, bytes_bound = _step_roofline(classes, chip, precision, cal, run.accumulate, math, works)
    if tf32_cores(chip, precision) and any(cost.flops for kind, cost in classes.items() if kind in TENSOR_CORE_CLASSES):
        why = (
            "as --tf32 asks"
            if scenario.float32_math
            else "the run's own torch switches"
            if run.float32_math
            else "torch's defaults: the run did not record its switches"
        )
        notes.append(
            f"float32 on {chip.name} (TF32 tensor cores): {math.describe()} ({why}); --tf32 on|off prices them the "
            "other way"
        )
    setup = conv_setup_seconds(run, chip, precision) * max(1, run.accumulate) if cal.conv_setup else 0.0
    if setup:
        seconds += setup
        rate = _setup_rate(chip, precision) or 0.0
        notes.append(
            f"{setup * 1e3:.3g} ms of the step sets up the convolutions whatever the micro-batch: on a CPU "
            "oneDNN reorders each weight into its blocked layouts every call "
            f"({setup / max(1, run.accumulate) / rate / 1e6:.3g} MB "
            f"of weights a batch at {rate * 1e9:.3g} ns a byte, measured on this CPU)"
        )
    if "transpose" in classes:
        spent = _roofline({"transpose": classes["transpose"]}, chip, precision, cal)[0] * run.accumulate
        notes.append(
            f"{spent * 1e3:.3g} ms of the device's step transposes channels-first convolutions' tensors for "
            "the tensor cores (cuDNN convolves 16-bit tensors channels-last): lit_compute.speedup.ChannelsLast "
            "saves it"
        )
    caveat = None
    convolves = any(kind.startswith("conv") and cost.flops for kind, cost in classes.items())
    if chip.kind == "cpu" and not setup and scenario.micro_batch != run.samples and convolves:
        side = "slow (an upper bound)" if scenario.micro_batch > run.samples else "fast (a lower bound)"
        caveat = (
            f"on a CPU a convolution's time grows less than its FLOPs with the batch, which one efficiency "
            f"per class does not follow (docs/whatif.md, This CPU): micro-batch {scenario.micro_batch} "
            f"against the run's {run.samples} leans {side}"
        )
    bound_by = "compute" if flops_bound >= bytes_bound else "memory bandwidth"
    return ComputePart(seconds, bound_by, tuple(notes), step_kernels(classes, run.accumulate), caveat)


def value_bytes(precision: str, kind: str, cpu: bool = False) -> float:
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
    matmuls = sum(run.by_class.get(kind, NO_COST).kernels for kind in TENSOR_CORE_CLASSES)
    return sign * 12.0 * run.trainable / max(1, run.tensor_parallel), sign * (2.0 if cpu else 1.0) * matmuls


def conv_setup_seconds(run: RunFacts, chip: Chip, precision: str) -> float:
    """Seconds a batch of ``run`` at ``precision`` spends setting up its convolutions on ``chip``, a CPU, whatever the
    micro-batch: oneDNN reorders each weight into its blocked layouts every call (the forward, the data gradient) and
    the weight gradient back. The forward convolutions' weights (:attr:`RunFacts.conv_weights`, in ``precision``'s
    bytes: bf16 under CPU autocast) at the chip's measured cost per weight byte in that dtype
    (:attr:`~lit_compute.hardware.chips.ThisMachine.conv_setup`,
    :func:`lit_compute.hardware.this_machine.with_conv_setup`); 0 on an accelerator
    (cuDNN convolves the weight as it lies), without convolutions, or where the cost was not measured."""
    rate = _setup_rate(chip, precision)
    if not rate or not run.conv_weights:
        return 0.0
    scale = value_bytes(precision, "conv", cpu=True) / value_bytes(run.precision, "conv", cpu=True)
    return float(rate) * run.conv_weights * scale


def _setup_rate(chip: Chip, precision: str) -> float | None:
    """This CPU's measured convolution set-up per weight byte in ``precision``'s compute dtype; None elsewhere."""
    if chip.kind != "cpu" or not isinstance(chip, ThisMachine):
        return None
    return chip.conv_setup.get(compute_dtype(precision))


def pays_transposes(chip: Chip, precision: str) -> bool:
    """Whether ``chip`` at ``precision`` transposes channels-first convolutions for its tensor cores: a GPU (cuDNN
    convolves 16-bit tensors channels-last) at fp16 or bf16; not a CPU, not float32 or TF32."""
    return chip.kind != "cpu" and precision_class(precision) == "16 bits"


def _transposes(run: RunFacts, chip: Chip, precision: str, ratio: float) -> OpCost | None:
    """(FLOPs, bytes, kernels) of the transposes a GPU runs at 16 bits for the run's channels-first convolutions, at
    ``ratio`` times the run's micro-batch: each tensor read and written once more (cuDNN convolves channels-last on
    tensor cores); None on a CPU, in float32 or TF32, or when every convolution is channels-last."""
    first = run.channels_first
    if not first.tensors or not pays_transposes(chip, precision):
        return None
    scale = value_bytes(precision, "conv") / value_bytes(run.precision, "conv")
    return OpCost(0.0, 2.0 * (first.activation_bytes * ratio + first.weight_bytes) * scale, first.tensors)


def scaled_classes(run: RunFacts, scenario: Scenario) -> dict[str, OpCost]:
    """The run's per-batch FLOPs, bytes and kernels by class at the scenario's micro-batch and precision (per
    device; a tensor-parallel run's shares stay shares)."""
    ratio = scenario.micro_batch / run.samples
    out: dict[str, OpCost] = {}
    run_cpu, cpu = run.device.lower() in ("cpu", "this"), scenario.chip.kind == "cpu"
    # a CPU target at a precision the step was counted at again: those counts (CPU autocast's casts among them)
    recount = run.recounted.get(scenario.precision) if cpu else None
    table, source = (recount, scenario.precision) if recount else (run.by_class, run.precision)
    source_cpu = run_cpu or bool(recount)  # the recount is traced under CPU autocast
    weight_bytes = 3.0 * run.trainable * value_bytes(source, "matmul", source_cpu) / max(1, run.tensor_parallel)
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
        b *= value_bytes(scenario.precision, kind, cpu) / value_bytes(source, kind, source_cpu)
        out[kind] = OpCost(f, b, kernels)
    transposes = _transposes(run, scenario.chip, scenario.precision, ratio)
    if transposes:
        out["transpose"] = transposes
    if recount:
        return out
    casts, kernels = _autocast_casts(run, scenario.precision, cpu)
    if casts or kernels:
        elementwise = out.get("elementwise", NO_COST)
        out["elementwise"] = OpCost(
            elementwise.flops, max(0.0, elementwise.bytes + casts), max(0.0, elementwise.kernels + kernels)
        )
    return out


def sm_rate(chip: Chip) -> float:
    """The rate the SMs do the work around a tensor-core op at (FLOP/s): SMs x clock x 1,024, a V100 SM's tensor
    FLOP a clock. A chip without SM figures (a TPU, a CPU, a row of your own without ``sms``) is taken at an
    A100's ratio, half its 16-bit peak."""
    if chip.sm_clock:
        return chip.sm_clock * 1e9 * 1024
    return (chip.peak("bfloat16") or chip.peak("float16") or chip.peak("float32") or 0.0) / 2


def float32_math(run: RunFacts, scenario: Scenario) -> Float32Math:
    """Where float32 work runs on TF32 cores for this prediction: as ``--tf32`` asks, else as the run's switches were,
    else torch's defaults."""
    return scenario.float32_math or run.float32_math or Float32Math()


def tf32_cores(chip: Chip, precision: str) -> bool:
    """Whether float32 work at ``precision`` may run on ``chip``'s TF32 tensor cores (an accelerator whose table row
    has a TF32 peak: Ampere and newer), as torch's switches decide
    (:class:`~lit_compute.hardware.dtypes.Float32Math`)."""
    return compute_dtype(precision) == "float32" and chip.kind != "cpu" and bool(chip.peak("tf32"))


def _kernel_works(
    run: RunFacts, ratio: float, chip: Chip, precision: str, math: Float32Math | None
) -> dict[str, tuple[KernelWork, ...]]:
    """The run's GEMMs by class at ``ratio`` times its micro-batch, quantized on ``chip``'s SMs in the cores
    ``precision`` (and torch's float32 switches) puts each class on: what :func:`_roofline` prices kernel by kernel.
    Empty on a CPU, on a chip without an SM count, or for a run counted before its kernels were kept."""
    if chip.kind == "cpu" or not chip.sms or not run.kernels:
        return {}
    tf32, base, math = tf32_cores(chip, precision), compute_dtype(precision), math or Float32Math()
    works = {}
    for kind in TENSOR_CORE_CLASSES:
        dtype = math.column(kind) if tf32 else base
        cores = "simt" if dtype == "float32" or (kind == "attention" and dtype == "tf32") else "tensor"
        size = value_bytes(precision, kind)
        if found := scaled_kernels(run.kernels, kind, ratio, size, chip.sms, cores):
            works[kind] = found
    return works


def _roofline(
    classes: dict[str, OpCost],
    chip: Chip,
    precision: str,
    cal: Calibration,
    math: Float32Math | None = None,
    works: dict[str, tuple[KernelWork, ...]] | None = None,
) -> Roofline:
    """The seconds of one batch on ``chip``, and how many of them are compute-bound and bandwidth-bound; float32 work
    on TF32 tensor cores where ``math`` (torch's switches: its defaults when None) puts it and the chip has them. A
    class with its GEMMs in ``works`` is priced kernel by kernel (each the larger of its tiles' waves and its bytes),
    the rest of its FLOPs at the peak; every other class as one roofline."""
    base = compute_dtype(precision)
    tf32 = tf32_cores(chip, precision)
    math = math or Float32Math()
    tensor_peak = chip.peak(base) or chip.peak("float32") or 0.0
    vector_peak = chip.peak("float32") or tensor_peak
    if not tensor_peak:
        raise WhatifError(
            f"{chip.name} has no {base} peak in the table ({', '.join(sorted(chip.peaks))}); choose "
            "another --precision or add the peak with --hardware-file"
        )
    total = flops_bound = bytes_bound = 0.0
    for kind, (flops, moved, kernels) in classes.items():
        dtype = math.column(kind) if tf32 else base
        # fused attention runs on tensor cores in half precision only: flash attention takes fp16/bf16, and float32
        # (TF32 allowed or not) falls back to the memory-efficient kernel on the vector units
        heavy = kind in TENSOR_CORE_CLASSES and not (kind == "attention" and dtype == "tf32")
        own = (chip.peak_of(kind.split("_")[0], dtype) or tensor_peak) if heavy else vector_peak
        peak = own * cal.efficiency(kind, heavy and dtype != "float32", dtype == "tf32")
        t_flops = flops / peak if flops else 0.0
        bandwidth = chip.bandwidth * cal.bandwidth * (cal.depthwise if kind == "conv_depthwise" else 1.0)
        t_bytes = moved / bandwidth if moved else 0.0
        seconds = max(t_flops, t_bytes) + kernels * cal.launch_s
        gemms = (works or {}).get(kind)
        if gemms and flops:
            each = [(w.quantized / peak, w.bytes / bandwidth) for w in gemms]
            rest = max(0.0, flops - sum(w.flops for w in gemms)) / peak
            t_flops = sum(f for f, b in each if f >= b) + rest
            t_bytes = sum(b for f, b in each if f < b)
            seconds = t_flops + t_bytes + kernels * cal.launch_s
        if cal.sm and flops and heavy and dtype != "float32":  # tensor cores: the SMs' own share, in series
            on_sms = flops / (cal.sm * sm_rate(chip))
            t_flops, seconds = t_flops + on_sms, seconds + on_sms
        total += seconds
        if t_flops >= t_bytes:
            flops_bound += seconds
        else:
            bytes_bound += seconds
    return Roofline(total, flops_bound, bytes_bound)


def _step_roofline(
    classes: dict[str, OpCost],
    chip: Chip,
    precision: str,
    cal: Calibration,
    accumulate: int,
    math: Float32Math | None = None,
    works: dict[str, tuple[KernelWork, ...]] | None = None,
) -> Roofline:
    """The seconds (and of them the compute-bound and the bandwidth-bound) of one optimizer step: ``accumulate``
    batches of every class but the optimizer's, which steps once."""
    batch = {k: v for k, v in classes.items() if k != "optimizer"}
    once = {k: v for k, v in classes.items() if k == "optimizer"}
    per_batch, step = _roofline(batch, chip, precision, cal, math, works), _roofline(once, chip, precision, cal, math)
    n = max(1, accumulate)
    return Roofline(
        per_batch.seconds * n + step.seconds,
        per_batch.flops_bound_s * n + step.flops_bound_s,
        per_batch.bytes_bound_s * n + step.bytes_bound_s,
    )


def step_kernels(classes: dict[str, OpCost], accumulate: int) -> float:
    """The kernels of one optimizer step (the optimizer's once, the others' ``accumulate`` times)."""
    return sum(cost.kernels * (1 if kind == "optimizer" else max(1, accumulate)) for kind, cost in classes.items())


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
    works = _kernel_works(run, 1.0, chip, run.precision, run.float32_math)
    ideal = _step_roofline(classes, chip, run.precision, unit, run.accumulate, run.float32_math, works).seconds
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
