"""The peak policy: which per-device peak FLOP/s MFU and HFU are measured against (:class:`PeakPolicy`), the table
peak of a CUDA device for a run's dtype (:func:`peak_flops`), and float32's peak weighed by cuDNN's and the matmuls'
separate TF32 switches (:func:`weigh_tf32`).

The figures themselves live in the hardware room: the chip table with its sources
(:mod:`lit_compute.hardware.chips`), the measured and cached peak (:mod:`lit_compute.hardware.this_machine`). The
names imported from there below are re-exported for 0.3.0's imports.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import torch

from lit_compute.formatting import flops_rate
from lit_compute.hardware.chips import CHIPS, MEMORY_TABLE, PEAK_TABLE, chip_for_name
from lit_compute.hardware.dtypes import dtype_key, precision_dtype, tf32_enabled
from lit_compute.hardware.measure import QUIET_CPU_SHARE, PeakMeasurement, measure_peak, measure_peak_flops
from lit_compute.hardware.this_machine import MeasuredPeak, cached_peak_flops

__all__ = [
    "MEMORY_TABLE",
    "PEAK_TABLE",
    "QUIET_CPU_SHARE",
    "MeasuredPeak",
    "PeakMeasurement",
    "PeakPolicy",
    "cached_peak_flops",
    "chip_for_name",
    "dtype_key",
    "measure_peak",
    "measure_peak_flops",
    "peak_flops",
    "precision_dtype",
    "tf32_enabled",
    "weigh_tf32",
    "weigh_tf32_switches",
]


def peak_flops(
    device: torch.device | str | int | None,
    dtype: torch.dtype | str = torch.float32,
    flops_by_op: dict[str, int] | None = None,
) -> float | None:
    """Dense peak FLOP/s of a GPU for ``dtype``, from :data:`PEAK_TABLE`; None when unknown (CPUs included).

    Args:
        device: A CUDA ``torch.device``/index (its name is read with ``torch.cuda.get_device_name``), or a
            device name string such as ``"NVIDIA H200"``.
        dtype: The dtype the matmuls run in. float32 counts against the TF32 peak where TF32 is enabled.
        flops_by_op: FLOPs per op (:attr:`FlopCount.by_op`). For float32, convolutions and matmuls have separate
            TF32 switches (cuDNN's is on by default, matmul's off), so the peak is the one that makes the
            time add up: ``total / sum(flops_op / peak_op)``. Without it, float32 counts against TF32 when either
            switch is on.

    Example:
        >>> peak_flops("NVIDIA H200", torch.bfloat16) / 1e12
        989.4
    """
    if isinstance(device, str) and not re.fullmatch(r"(cuda|cpu|meta|mps)(:\d+)?", device):
        name = device
    else:
        dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cpu")
        if dev.type != "cuda" or not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name(dev)
    chip = chip_for_name(name)
    if chip is None:
        return None
    peaks = CHIPS[chip].peaks

    def peak(kind: str) -> float | None:
        key = dtype_key(dtype, "cuda", kind)
        # before Ampere there are no TF32 units: torch's TF32 switches change nothing there
        return peaks.get(key) or (peaks.get("float32") if key == "tf32" else None)

    if dtype_key(dtype, "cpu") != "float32" or not flops_by_op:
        return peak("any")
    return weigh_tf32(flops_by_op, peak("conv"), peak("matmul")) or peak("any")


def weigh_tf32(flops_by_op: dict[str, int], conv_peak: float | None, other_peak: float | None) -> float | None:
    """The float32 peak that makes the time add up when convolutions run at ``conv_peak`` and the other ops at
    ``other_peak`` (cuDNN's and the matmuls' TF32 switches are separate): ``total / sum(flops_op / peak_op)``;
    None without both peaks or without FLOPs."""
    conv = sum(f for op, f in flops_by_op.items() if "convolution" in op)
    other = sum(flops_by_op.values()) - conv
    if not conv_peak or not other_peak or conv + other <= 0:
        return None
    return (conv + other) / (conv / conv_peak + other / other_peak)


def weigh_tf32_switches(flops_by_op: dict[str, int], peak_of: Callable[[bool], float | None]) -> float | None:
    """:func:`weigh_tf32` with the peaks as the switches are now: ``peak_of(tf32)`` is the float32 peak with TF32
    on or off, asked once per distinct setting of cuDNN's and the matmuls' switches."""
    peaks = {on: peak_of(on) for on in {tf32_enabled("conv"), tf32_enabled("matmul")}}
    return weigh_tf32(flops_by_op, peaks[tf32_enabled("conv")], peaks[tf32_enabled("matmul")])


class PeakPolicy:
    """Which per-device peak FLOP/s MFU and HFU are measured against, and what happens when it cannot be right.

    ``peak`` is :class:`~lit_compute.FlopsLogger`'s argument: ``"table"`` (:data:`PEAK_TABLE`; float32 on CUDA
    weighed by the count's TF32-eligible ops, :meth:`refine`), ``"measure"`` (:func:`cached_peak_flops`),
    ``"remeasure"`` (measured again at set-up) or ``"none"``; ``peak_flops`` overrides it. MFU is computed here
    and nowhere else (:meth:`utilisation`): a figure above 1 is never logged. A measured peak that a run beats is
    measured again (once per run, with ``at_least``); a table or given peak that a run beats is reported.

    Attributes:
        value: The peak in FLOP/s per device (None: no MFU).
        source: Where it came from, in words (logged with the run).
    """

    def __init__(self, peak: str = "table", peak_flops: float | None = None) -> None:
        self.peak, self.peak_flops = peak, peak_flops
        self.value: float | None = None
        self.source = ""
        self.device: torch.device | None = None
        self.dtype: torch.dtype = torch.float32
        self._refined = self._rechecked = False

    @property
    def measured(self) -> bool:
        return self.peak_flops is None and self.peak in ("measure", "remeasure")

    def resolve(self, device: torch.device, dtype: torch.dtype) -> MeasuredPeak | None:
        """Find the peak for a run on ``device`` in ``dtype``; the measurement when it was measured."""
        self.device, self.dtype, self._refined, self._rechecked = device, dtype, False, False
        self.value, self.source = None, ""
        if self.peak_flops is not None:
            self.value, self.source = float(self.peak_flops), "given as FlopsLogger(peak_flops=...)"
            return None
        if self.peak == "none":
            return None
        if self.measured:  # float32 on CUDA: TF32's peak when either switch is on, until refine() weighs them
            measured = cached_peak_flops(device, dtype, remeasure=self.peak == "remeasure", tf32=self._tf32("any"))
            self.value, self.source = measured.flops, measured.describe()
            return measured
        self.value = peak_flops(device, dtype)
        if self.value is not None:
            self.source = f"the peak table ({str(dtype).removeprefix('torch.')})"
        return None

    def notes(self, measured: MeasuredPeak | None) -> tuple[str | None, list[tuple[str, str]]]:
        """What :meth:`resolve` found, for the user: the line naming a measured peak, and (key, message) warnings
        for a peak measured on a busy machine or no table peak."""
        device, dtype = self.device, self.dtype
        if measured is not None:
            line = (
                f"FlopsLogger: peak {flops_rate(measured.flops / 1e12)} ({dtype}, {device}), {measured.describe()}"
                + (" (peak='remeasure' measures again)" if measured.cached else "")
            )
            busy = (
                []
                if measured.quiet
                else [
                    (
                        "busy-peak",
                        "FlopsLogger: the peak was measured while other processes "
                        f"used the CPUs ({measured.describe()}); MFU is against it for this run "
                        "only.",
                    )
                ]
            )
            return line, busy
        if self.value is None and self.peak == "table" and device is not None:
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{device.type} device"
            return None, [
                (
                    "no-peak",
                    f"FlopsLogger(peak='table') has no peak for {name} in {dtype}; MFU is not logged. "
                    "Use FlopsLogger(peak='measure') to measure one, or peak_flops=<FLOP/s> to set it.",
                )
            ]
        return None, []

    def _tf32(self, kind: str) -> bool | None:
        """Whether float32 work of ``kind`` runs on TF32 units here (None: not float32 on CUDA)."""
        if self.device is None or self.device.type != "cuda" or self.dtype != torch.float32:
            return None
        return tf32_enabled(kind)

    def refine(self, flops_by_op: dict[str, int]) -> None:
        """float32 on CUDA: convolutions and matmuls have separate TF32 switches (cuDNN's on by default, the
        matmuls' off); weigh the table's or the measured peaks by the count."""
        if self.peak not in ("table", "measure", "remeasure") or self.peak_flops is not None or self._refined:
            return
        if self._tf32("any") is None or self.device is None:
            return
        self._refined = True
        if self.peak == "table":
            value = peak_flops(self.device, torch.float32, flops_by_op)
        else:
            device = self.device
            value = weigh_tf32_switches(flops_by_op, lambda on: cached_peak_flops(device, torch.float32, tf32=on).flops)
            if value:
                self.source += (
                    f"; convolutions against the {'TF32' if self._tf32('conv') else 'float32'} peak, "
                    f"other ops against the {'TF32' if self._tf32('matmul') else 'float32'} one, "
                    "weighed by their counted FLOPs"
                )
        if value:
            self.value = value

    def utilisation(self, tflops: float, hw_tflops: float, devices: int) -> tuple[dict[str, float], str | None]:
        """``compute/mfu``, ``compute/hfu`` and ``compute/peak_tflops`` for achieved model and hardware TFLOP/s
        summed over ``devices``, and a warning when a figure would exceed 1 (then none is returned). A measured
        peak is measured again first (once per run): a cached peak measured under load is replaced."""
        if not self.value or not math.isfinite(tflops) or devices < 1:
            return {}, None
        metrics = self._metrics(tflops, hw_tflops, devices)
        if metrics["compute/mfu"] <= 1 and metrics.get("compute/hfu", 0.0) <= 1:
            return metrics, None
        over = max(metrics["compute/mfu"], metrics.get("compute/hfu", 0.0))
        achieved = max(tflops, hw_tflops if math.isfinite(hw_tflops) else 0.0) / devices * 1e12
        said = (
            f"this device achieved {flops_rate(achieved / 1e12)}, {over:.3f}x the peak of "
            f"{flops_rate(self.value / 1e12)} ({self.source})"
        )
        if self.measured and not self._rechecked and self.device is not None:
            self._rechecked = True
            again = cached_peak_flops(self.device, self.dtype, at_least=achieved, tf32=self._tf32("any"))
            self.value, self.source = max(again.flops, self.value), again.describe()
            metrics = self._metrics(tflops, hw_tflops, devices)
            if metrics["compute/mfu"] <= 1 and metrics.get("compute/hfu", 0.0) <= 1:
                return metrics, (
                    f"FlopsLogger: {said}: that peak was wrong. Measured again: "
                    f"{flops_rate(self.value / 1e12)} ({self.source}); MFU is against it from now on."
                )
            said += f", and {flops_rate(self.value / 1e12)} measured again ({self.source})"
        fix = (
            "set FlopsLogger(peak_flops=...) to the device's real peak"
            if not self.measured
            else "run on a quiet machine with peak='remeasure'"
        )
        return {}, (
            f"FlopsLogger: MFU would be over 100%: {said}. MFU and HFU are not logged while the peak is "
            f"below what the device achieves; {fix}, or check the FLOP count."
        )

    def _metrics(self, tflops: float, hw_tflops: float, devices: int) -> dict[str, float]:
        peak = self.value / 1e12  # type: ignore[operator]
        out = {"compute/peak_tflops": peak, "compute/mfu": tflops / (devices * peak)}
        if math.isfinite(hw_tflops):
            out["compute/hfu"] = hw_tflops / (devices * peak)
        return out
