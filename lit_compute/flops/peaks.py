"""Dense (non-sparse) peak FLOP/s per device and dtype, with sources, and a measured peak.

Every figure is the vendor's **dense** tensor-core (or FP32 CUDA-core) rate: NVIDIA datasheets list
"with sparsity" figures for Ampere and later, which are exactly twice the dense ones; those are halved
here. FLOP/s, not TFLOP/s.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from lit_compute._compat import default_cache_dir
from lit_compute.files import write_whole
from lit_compute.formatting import flops_rate

T = 1e12

# chip key -> {dtype name -> dense FLOP/s}. dtype names: "float64", "float32", "tf32", "bfloat16", "float16", "float8".
PEAK_TABLE: dict[str, dict[str, float]] = {
    # Volta. Source: NVIDIA V100 datasheet (volta-v100-datasheet-update-us-1165301-r5). Tensor cores: fp16 only.
    "v100-sxm": {"float64": 7.8 * T, "float32": 15.7 * T, "float16": 125 * T},
    "v100-pcie": {"float64": 7.0 * T, "float32": 14.0 * T, "float16": 112 * T},
    "v100s-pcie": {"float64": 8.2 * T, "float32": 16.4 * T, "float16": 130 * T},
    # Ampere. Source: NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4); SXM and PCIe have
    # the same peaks (they differ in sustained clocks/power). Dense = "with sparsity" / 2.
    "a100": {"float64": 9.7 * T, "float32": 19.5 * T, "tf32": 156 * T, "bfloat16": 312 * T, "float16": 312 * T},
    # Source: NVIDIA A10 datasheet (A10G is AWS's A10 variant; AWS quotes the same tensor figures).
    "a10g": {"float32": 31.2 * T, "tf32": 62.5 * T, "bfloat16": 125 * T, "float16": 125 * T},
    "a10": {"float32": 31.2 * T, "tf32": 62.5 * T, "bfloat16": 125 * T, "float16": 125 * T},
    # GeForce Ampere. Source: NVIDIA Ampere GA102 whitepaper, Table 9 (RTX 3090): FP16/BF16 tensor with FP32
    # accumulate (what PyTorch uses) 71 dense; TF32 35.6 dense.
    "rtx-3090": {"float32": 35.6 * T, "tf32": 35.6 * T, "bfloat16": 71 * T, "float16": 71 * T},
    # Ada. Source: NVIDIA Ada Lovelace architecture whitepaper v2.1 (RTX 4090: FP16/BF16 tensor with FP32
    # accumulate 165.2 dense; L4/L40/L40S appendix), L40S datasheet.
    "rtx-4090": {"float32": 82.6 * T, "tf32": 82.6 * T, "bfloat16": 165.2 * T, "float16": 165.2 * T,
                 "float8": 330.3 * T},
    "l4": {"float32": 30.3 * T, "tf32": 60.0 * T, "bfloat16": 121 * T, "float16": 121 * T, "float8": 242.5 * T},
    "l40": {"float32": 90.5 * T, "tf32": 90.5 * T, "bfloat16": 181 * T, "float16": 181 * T, "float8": 362 * T},
    "l40s": {"float32": 91.6 * T, "tf32": 183 * T, "bfloat16": 362.05 * T, "float16": 362.05 * T,
             "float8": 733 * T},
    # Hopper. Source: NVIDIA H100 datasheet (nvidia-h100-datasheet-2430615); dense = sparse / 2.
    "h100-sxm": {"float64": 34 * T, "float32": 67 * T, "tf32": 494.7 * T, "bfloat16": 989.4 * T,
                 "float16": 989.4 * T, "float8": 1978.9 * T},
    "h100-pcie": {"float64": 26 * T, "float32": 51 * T, "tf32": 378 * T, "bfloat16": 756 * T, "float16": 756 * T,
                  "float8": 1513 * T},
    "h100-nvl": {"float64": 30 * T, "float32": 60 * T, "tf32": 417.5 * T, "bfloat16": 835.5 * T,
                 "float16": 835.5 * T, "float8": 1670.5 * T},
    # Source: NVIDIA H200 datasheet (hpc-datasheet-sc23-h200); H200 SXM has H100 SXM's compute, H200 NVL H100 NVL's.
    "h200-sxm": {"float64": 34 * T, "float32": 67 * T, "tf32": 494.7 * T, "bfloat16": 989.4 * T,
                 "float16": 989.4 * T, "float8": 1978.9 * T},
    "h200-nvl": {"float64": 30 * T, "float32": 60 * T, "tf32": 417.5 * T, "bfloat16": 835.5 * T,
                 "float16": 835.5 * T, "float8": 1670.5 * T},
    # Blackwell. Source: NVIDIA HGX B200 specifications (8-GPU totals, sparse): TF32 18 PF, FP16/BF16 36 PF,
    # FP8 72 PF, FP32 600 TF, FP64 296 TF -> per GPU dense: /8, tensor figures /2.
    "b200": {"float64": 37 * T, "float32": 75 * T, "tf32": 1125 * T, "bfloat16": 2250 * T, "float16": 2250 * T,
             "float8": 4500 * T},
}

GiB = 2**30

# chip key -> (device memory in bytes, source). The datasheets' "GB" of HBM/GDDR are binary (an "80GB" A100 holds
# 80 GiB); what a program can allocate is a little less (the CUDA context, ECC and driver reservations: an H200's
# 141 GB shows as about 139.8 GiB in torch.cuda.get_device_properties).
MEMORY_TABLE: dict[str, tuple[float, str]] = {
    "v100-sxm": (32 * GiB, "NVIDIA V100 datasheet: 32 GB HBM2 (16 GB variant too)"),
    "v100-pcie": (32 * GiB, "NVIDIA V100 datasheet: 32 GB HBM2"),
    "a100": (80 * GiB, "NVIDIA A100 datasheet: 80 GB HBM2e (40 GB: a100-40gb)"),
    "a100-40gb": (40 * GiB, "NVIDIA A100 datasheet: 40 GB HBM2"),
    "a10": (24 * GiB, "NVIDIA A10 datasheet: 24 GB GDDR6"),
    "a10g": (24 * GiB, "AWS G5 instances: A10G with 24 GB"),
    "l4": (24 * GiB, "NVIDIA L4 datasheet: 24 GB GDDR6"),
    "l40": (48 * GiB, "NVIDIA L40 datasheet: 48 GB GDDR6"),
    "l40s": (48 * GiB, "NVIDIA L40S datasheet: 48 GB GDDR6"),
    "rtx-3090": (24 * GiB, "NVIDIA GeForce RTX 3090: 24 GB GDDR6X"),
    "rtx-4090": (24 * GiB, "NVIDIA GeForce RTX 4090: 24 GB GDDR6X"),
    "h100-sxm": (80 * GiB, "NVIDIA H100 datasheet: SXM 80 GB HBM3"),
    "h100-pcie": (80 * GiB, "NVIDIA H100 datasheet: PCIe 80 GB HBM2e"),
    "h100-nvl": (94 * GiB, "NVIDIA H100 datasheet: NVL 94 GB HBM3"),
    "h200-sxm": (141 * GiB, "NVIDIA H200 datasheet: 141 GB HBM3e"),
    "h200-nvl": (141 * GiB, "NVIDIA H200 datasheet: 141 GB HBM3e"),
    "b200": (180 * GiB, "NVIDIA HGX B200 specifications: 1.4 TB HBM3e for 8 GPUs"),
    "tpu-v3": (32 * GiB, "Google Cloud TPU v3: 32 GiB HBM per chip (16 per core)"),
    "tpu-v5e": (16 * GiB, "Google Cloud TPU v5e: 16 GiB HBM2 per chip"),
}

# (required tokens, forbidden tokens, chip key), first match wins. Tokens are the lower-case alphanumeric
# words of the name torch.cuda.get_device_name() reports ("NVIDIA A100-SXM4-80GB" -> nvidia, a100, sxm4, 80gb),
# so "L40S" never matches "L4" or "L40".
_RULES: list[tuple[tuple[str, ...], tuple[str, ...], str]] = [
    (("h200", "nvl"), (), "h200-nvl"),
    (("h200",), (), "h200-sxm"),
    (("h100", "nvl"), (), "h100-nvl"),
    (("h100", "pcie"), (), "h100-pcie"),
    (("h100",), (), "h100-sxm"),
    (("b200",), (), "b200"),
    (("a100",), (), "a100"),
    (("a10g",), (), "a10g"),
    (("a10",), (), "a10"),
    (("l40s",), (), "l40s"),
    (("l40",), (), "l40"),
    (("l4",), (), "l4"),
    (("v100s",), (), "v100s-pcie"),
    (("v100", "pcie"), (), "v100-pcie"),
    (("v100",), (), "v100-sxm"),
    (("rtx", "4090"), (), "rtx-4090"),
    (("rtx", "3090"), ("ti",), "rtx-3090"),
]

_DTYPE_NAMES = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}


def chip_for_name(device_name: str) -> str | None:
    """The table key for a device name as ``torch.cuda.get_device_name()`` reports it, or None."""
    tokens = set(re.findall(r"[a-z0-9]+", device_name.lower()))
    for required, forbidden, chip in _RULES:
        if all(t in tokens for t in required) and not any(t in tokens for t in forbidden):
            return chip
    return None


def tf32_enabled(kind: str = "any") -> bool:
    """True when float32 work of ``kind`` may run on TF32 tensor cores.

    ``"matmul"``: matmuls (``torch.backends.cuda.matmul.allow_tf32`` or a float32 matmul precision other than
    ``"highest"``; off by default); ``"conv"``: cuDNN convolutions (``torch.backends.cudnn.allow_tf32``, on by
    default); ``"any"``: either.
    """
    matmul = bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"
    conv = bool(torch.backends.cudnn.allow_tf32)
    return {"matmul": matmul, "conv": conv}.get(kind, matmul or conv)


def dtype_key(dtype: torch.dtype | str, device_type: str = "cuda", kind: str = "any") -> str:
    """The table column for ``dtype``: float32 becomes ``tf32`` on CUDA when TF32 is enabled for ``kind``."""
    if isinstance(dtype, str):
        key = dtype
    elif dtype in _DTYPE_NAMES:
        key = _DTYPE_NAMES[dtype]
    elif "float8" in str(dtype):
        key = "float8"
    else:
        raise ValueError(f"peak_flops(dtype={dtype}) has no peak; use float32, tf32, bfloat16, float16 or float8")
    if key == "float32" and device_type == "cuda" and tf32_enabled(kind):
        return "tf32"
    return key


def precision_dtype(precision: str) -> torch.dtype:
    """The dtype matmuls run in under a Lightning precision string ("bf16-mixed" -> bfloat16, ...)."""
    p = str(precision)
    if p.startswith("bf16"):
        return torch.bfloat16
    if p.startswith("16"):
        return torch.float16
    if p.startswith("64"):
        return torch.float64
    if p.startswith("transformer-engine"):
        return torch.bfloat16
    return torch.float32


def peak_flops(device: torch.device | str | int | None, dtype: torch.dtype | str = torch.float32,
               flops_by_op: dict[str, int] | None = None) -> float | None:
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
    peaks = PEAK_TABLE[chip]

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


def _dtype_name(device: torch.device, dtype: torch.dtype, tf32: bool | None) -> str:
    return "tf32" if _uses_tf32(device, dtype, tf32) else str(dtype).removeprefix("torch.")


def measure_peak_flops(
    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, size: int | None = None,
    seconds: float = 1.0, tf32: bool | None = None,
) -> float:
    """Measure the achievable dense GEMM FLOP/s on ``device`` in ``dtype`` (best of several timed runs).

    On CPU this uses ``torch.get_num_threads()`` threads, as training does. The matrix side defaults to 2048
    on CPU and 8192 on GPU. The loop stops after about ``seconds``. ``tf32`` (float32 on CUDA): measure with TF32
    matmuls on or off (None: as ``torch.backends.cuda.matmul.allow_tf32`` is now). See :func:`measure_peak` for the
    same with the machine's contention measured.
    """
    return measure_peak(device, dtype, size=size, seconds=seconds, rounds=1, tf32=tf32).flops


def _uses_tf32(device: torch.device, dtype: torch.dtype, tf32: bool | None) -> bool:
    """Whether a float32 GEMM on ``device`` runs on TF32 units: ``tf32``, or the matmul switch as it is now."""
    if device.type != "cuda" or dtype != torch.float32:
        return False
    return tf32_enabled("matmul") if tf32 is None else tf32


@contextlib.contextmanager
def _matmul_tf32(on: bool) -> Iterator[None]:
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


#: A CPU measurement round is quiet when this process got at least this share of the CPU time its threads could
#: have used (threads x wall time): below it, other processes took the cores and the GEMM ran slower than the
#: machine can.
QUIET_CPU_SHARE = 0.85


@dataclass(frozen=True)
class PeakMeasurement:
    """One measurement of the GEMM peak: the best FLOP/s, whether a quiet round gave it, and the lowest share of
    its threads' CPU time this process got in a round (None on GPUs)."""

    flops: float
    quiet: bool
    cpu_share: float | None


def measure_peak(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, size: int | None = None,
                 seconds: float = 1.5, rounds: int = 5, tf32: bool | None = None) -> PeakMeasurement:
    """The dense GEMM peak of ``device`` in ``dtype``, with the machine's load sampled while measuring.

    The time is split into ``rounds``; in each the best of several GEMMs is kept and, on CPU, the CPU time this
    process got is compared with what its ``torch.get_num_threads()`` threads could have used (a share under
    :data:`QUIET_CPU_SHARE` means other processes took the cores). The result is the best quiet round, or the
    best round with ``quiet=False`` when none was quiet. On GPUs every round counts as quiet. ``tf32``: see
    :func:`measure_peak_flops`."""
    dev = torch.device(device)
    if dev.type == "cuda" and dtype == torch.float32:
        with _matmul_tf32(_uses_tf32(dev, dtype, tf32)):
            return _measure_peak(dev, dtype, size, seconds, rounds)
    return _measure_peak(dev, dtype, size, seconds, rounds)


def _measure_peak(dev: torch.device, dtype: torch.dtype, size: int | None, seconds: float,
                  rounds: int) -> PeakMeasurement:
    n = size or (8192 if dev.type == "cuda" else 2048)
    per_round = seconds / max(1, rounds)
    if size is None and dev.type == "cpu":
        n = _affordable_side(n, dtype, per_round)
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    flops = 2.0 * n**3
    threads = max(1, torch.get_num_threads())

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    torch.mm(a, b)  # warm-up (kernel selection, caches)
    sync()
    results: list[tuple[float, float | None]] = []
    for _ in range(max(1, rounds)):
        best, runs = float("inf"), 0
        wall0, cpu0 = time.perf_counter(), time.process_time()
        while runs < 3 or (time.perf_counter() - wall0 < per_round and runs < 50):
            t0 = time.perf_counter()
            torch.mm(a, b)
            sync()
            best = min(best, time.perf_counter() - t0)
            runs += 1
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        share = None if dev.type == "cuda" or wall <= 0 else min(1.0, cpu / (wall * threads))
        results.append((flops / best, share))
    quiet = [f for f, share in results if share is None or share >= QUIET_CPU_SHARE]
    shares = [share for _, share in results if share is not None]
    return PeakMeasurement(flops=max(quiet) if quiet else max(f for f, _ in results), quiet=bool(quiet),
                           cpu_share=min(shares) if shares else None)


def _affordable_side(n: int, dtype: torch.dtype, per_round: float, probe: int = 256) -> int:
    """The matrix side to time on a CPU: ``n``, unless one product of that side would take longer than ten
    rounds (a dtype the CPU has no native instructions for, such as bfloat16 without AVX512-BF16 or AMX, runs
    20 or more times slower than float32): then a side whose product takes about one round, timed from a small
    product (at least ``probe``). Keeps the measurement about as long as asked on any CPU."""
    a = torch.randn(probe, probe).to(dtype)
    torch.mm(a, a)
    t0 = time.perf_counter()
    torch.mm(a, a)
    took = max(time.perf_counter() - t0, 1e-9)
    full = took * (n / probe) ** 3
    if full <= 10 * per_round:
        return n
    return max(probe, min(n, int(n * (per_round / full) ** (1 / 3)) // 64 * 64))


@dataclass(frozen=True)
class MeasuredPeak:
    """A measured dense GEMM peak and the conditions it was measured under (what makes MFU comparable)."""

    flops: float
    device: str
    dtype: str
    threads: int
    torch_version: str
    measured_at: str
    load_average: float | None
    cached: bool = False
    quiet: bool = True
    cpu_share: float | None = None

    def describe(self) -> str:
        load = f", load average {self.load_average:.2f}" if self.load_average is not None else ""
        how = "cached from" if self.cached else "measured"
        text = f"{how} {self.measured_at} on {self.device}, {self.threads} threads{load}, torch {self.torch_version}"
        if not self.quiet:
            share = f" (this process got {self.cpu_share:.0%} of its threads' CPU time)" if self.cpu_share else ""
            text += f"; the machine was busy{share}, so it is a lower bound and not cached"
        return text


def _peak_key(device: torch.device, dtype: torch.dtype, tf32: bool | None = None) -> tuple[str, str]:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = "unknown CPU"
        with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    return name, f"{device.type}|{name}|{_dtype_name(device, dtype, tf32)}|threads={threads}|torch={torch.__version__}"


def cached_peak_flops(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                      remeasure: bool = False, at_least: float | None = None,
                      tf32: bool | None = None) -> MeasuredPeak:
    """This machine's measured dense GEMM peak in ``dtype``, measured once and cached in
    ``$LIT_COMPUTE_CACHE/peaks.json`` with the conditions it was measured under (device, threads, torch version,
    load average, time), so MFU is against the same peak in every run.

    The cache is keyed by device name, dtype, torch threads (a 1-thread and a 2-thread peak are two entries) and
    torch version. A peak is cached only when measured on a quiet machine (:func:`measure_peak`): one measured
    while other processes took the cores serves this run only, with ``quiet=False``, and replaces nothing.
    ``remeasure=True`` measures again; ``at_least`` (FLOP/s a run achieved) measures again when the cached value
    is below it. A new measurement above the cached value proves the cached one wrong: it is replaced when the new
    one is quiet, removed otherwise. ``tf32`` (float32 on CUDA): the TF32 GEMM peak or the float32 one (None: as
    the matmul switch is now); each is its own entry."""
    dev = torch.device(device)
    name, key = _peak_key(dev, dtype, tf32)
    path = default_cache_dir() / "peaks.json"
    entries: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        entries = json.loads(path.read_text())
    if not isinstance(entries, dict):
        entries = {}
    entry = entries.get(key)
    cached: MeasuredPeak | None = None
    if isinstance(entry, dict) and isinstance(entry.get("flops"), (int, float)):
        fields: dict[str, Any] = {k: entry.get(k) for k in ("flops", "device", "dtype", "threads", "torch_version",
                                                            "measured_at", "load_average")}
        with contextlib.suppress(TypeError):
            cached = MeasuredPeak(**fields, cached=True)
    if cached is not None and not remeasure and (at_least is None or cached.flops >= at_least):
        return cached
    measured = measure_peak(dev, dtype, tf32=tf32)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    peak = MeasuredPeak(flops=measured.flops, device=name, dtype=_dtype_name(dev, dtype, tf32),
                        threads=torch.get_num_threads() if dev.type == "cpu" else 0, torch_version=torch.__version__,
                        measured_at=time.strftime("%Y-%m-%d %H:%M"), load_average=load, quiet=measured.quiet,
                        cpu_share=measured.cpu_share)
    if measured.quiet:
        entries[key] = {k: v for k, v in asdict(peak).items() if k not in ("cached", "quiet")}
    elif cached is not None and cached.flops < measured.flops:
        del entries[key]  # even a busy machine beat it: the cached value was measured under load
    else:
        return peak
    with contextlib.suppress(OSError):  # a read-only cache: the value is still used for this run
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, json.dumps(entries, indent=1, sort_keys=True))
    return peak


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
            line = (f"FlopsLogger: peak {flops_rate(measured.flops / 1e12)} ({dtype}, {device}), {measured.describe()}"
                    + (" (peak='remeasure' measures again)" if measured.cached else ""))
            busy = [] if measured.quiet else [("busy-peak", "FlopsLogger: the peak was measured while other processes "
                                               f"used the CPUs ({measured.describe()}); MFU is against it for this run "
                                               "only.")]
            return line, busy
        if self.value is None and self.peak == "table" and device is not None:
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{device.type} device"
            return None, [("no-peak", f"FlopsLogger(peak='table') has no peak for {name} in {dtype}; MFU is not logged. "
                           "Use FlopsLogger(peak='measure') to measure one, or peak_flops=<FLOP/s> to set it.")]
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
                self.source += (f"; convolutions against the {'TF32' if self._tf32('conv') else 'float32'} peak, "
                                f"other ops against the {'TF32' if self._tf32('matmul') else 'float32'} one, "
                                "weighed by their counted FLOPs")
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
        said = (f"this device achieved {flops_rate(achieved / 1e12)}, {over:.3f}x the peak of "
                f"{flops_rate(self.value / 1e12)} ({self.source})")
        if self.measured and not self._rechecked and self.device is not None:
            self._rechecked = True
            again = cached_peak_flops(self.device, self.dtype, at_least=achieved, tf32=self._tf32("any"))
            self.value, self.source = max(again.flops, self.value), again.describe()
            metrics = self._metrics(tflops, hw_tflops, devices)
            if metrics["compute/mfu"] <= 1 and metrics.get("compute/hfu", 0.0) <= 1:
                return metrics, (f"FlopsLogger: {said}: that peak was wrong. Measured again: "
                                 f"{flops_rate(self.value / 1e12)} ({self.source}); MFU is against it from now on.")
            said += f", and {flops_rate(self.value / 1e12)} measured again ({self.source})"
        fix = ("set FlopsLogger(peak_flops=...) to the device's real peak" if not self.measured else
               "run on a quiet machine with peak='remeasure'")
        return {}, (f"FlopsLogger: MFU would be over 100%: {said}. MFU and HFU are not logged while the peak is "
                    f"below what the device achieves; {fix}, or check the FLOP count.")

    def _metrics(self, tflops: float, hw_tflops: float, devices: int) -> dict[str, float]:
        peak = self.value / 1e12  # type: ignore[operator]
        out = {"compute/peak_tflops": peak, "compute/mfu": tflops / (devices * peak)}
        if math.isfinite(hw_tflops):
            out["compute/hfu"] = hw_tflops / (devices * peak)
        return out
