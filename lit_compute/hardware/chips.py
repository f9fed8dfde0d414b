"""Every chip and link lit_compute knows, one frozen row each, a cited source per figure.

A :class:`Chip` row holds the vendor's **dense** peak FLOP/s per dtype (NVIDIA datasheets list "with sparsity"
figures for Ampere and later, exactly twice the dense ones: halved here), the device memory in bytes, the memory
bandwidth in bytes/s, the link between the devices of one node, and where each figure comes from. A :class:`Link`
row holds what one device sends in one direction at once (NVLink's "total" figures count both directions: halved
here), which is what a ring collective's time depends on, and a message's latency.

:func:`find_chip` takes a table key (``h200-sxm``) or a device name as ``torch.cuda.get_device_name()`` reports it
(``NVIDIA H200``, ``NVIDIA A100-SXM4-80GB``); ``lit-compute estimate --device`` and ``whatif --hardware`` both use
it. A YAML file of your own (``--hardware-file``) adds or replaces rows::

    chips:
      my-gpu:
        peaks: {float32: 60e12, bfloat16: 500e12}   # dense FLOP/s
        bandwidth: 2.0e12                            # bytes/s
        memory: 48e9                                 # bytes
        link: pcie4                                  # a link name below
        sms: 96                                      # optional: SMs and the clock (GHz) the tensor peak is at
        boost_ghz: 1.8
        source: "vendor datasheet, 2026"
    links:
      my-fabric: {bandwidth: 50e9, latency: 5e-6, source: "..."}
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CHIPS",
    "LINKS",
    "MEMORY_TABLE",
    "PEAK_TABLE",
    "Chip",
    "HardwareError",
    "ThisMachine",
    "Link",
    "chip_for_name",
    "find_chip",
    "find_link",
    "load_hardware_file",
]

G, T, GiB = 1e9, 1e12, 2**30


class HardwareError(ValueError):
    """An unknown chip or link, or a malformed hardware file: the message names the row, the field and the fix."""


@dataclass(frozen=True)
class Link:
    """What connects devices: bytes per second one device sends in one direction, and the latency of a message."""

    name: str
    bandwidth: float
    latency: float
    source: str


@dataclass(frozen=True)
class Chip:
    """One accelerator (or CPU socket): dense peak FLOP/s per dtype, memory bandwidth and capacity, the link between
    the devices of one node, and the source of each figure (``sources``: ``peaks``, ``memory``, ``bandwidth``)."""

    name: str
    peaks: dict[str, float]
    bandwidth: float
    memory: float
    link: str
    source: str
    measured: bool = False
    kind: str = "gpu"  # "gpu", "cpu" or "tpu": autocast keeps different ops in float32 on each
    class_peaks: dict[str, dict[str, float]] = field(default_factory=dict)  # op class -> dtype -> its own peak
    sources: dict[str, str] = field(default_factory=dict)
    #: streaming multiprocessors x the clock (GHz) the datasheet's tensor peak is computed at: how fast the SMs run
    #: the work around the tensor cores (addresses, loads, the epilogue), which a higher tensor rate per SM does not
    #: speed up (None: not known; whatif then assumes an A100's ratio to the 16-bit peak)
    sm_clock: float | None = None
    sms: int | None = None  # streaming multiprocessors: the tiles of one wave (None: not known; classes priced whole)
    architecture: str = ""  # the GPU generation ("Volta", "Ampere", "Ada", "Hopper"); empty where not given

    def peak(self, dtype: str) -> float | None:
        """The dense peak for a dtype name (``float32`` falls back to ``tf32`` nowhere: a float32 run counts against
        the float32 peak unless the caller asks for ``tf32``)."""
        return self.peaks.get(dtype)

    def peak_of(self, kind: str, dtype: str) -> float | None:
        """The peak an op class (``matmul``, ``conv``, ``attention``) runs at in a dtype: its own where measured (this
        machine's bf16 kernels speed each class up by a different factor), else the chip's."""
        return self.class_peaks.get(kind, {}).get(dtype) or self.peak(dtype)


@dataclass(frozen=True)
class ThisMachine(Chip):
    """This machine's device as a chip (:func:`lit_compute.hardware.this_machine.this_machine`): its table row, or
    the figures measured where the table has none, and what was measured here beside them. A :class:`Chip` row stays
    a datasheet row; what only this machine knows lives in these fields, typed.

    Fields:
        device_name: The device as torch names it ("NVIDIA H200", the CPU's model name).
        mixed_speedup: A CPU's bf16 autocast speed of training blocks over float32's, per op class.
        conv_setup: A CPU's convolution set-up per weight byte, seconds, per dtype name (what ``whatif`` adds to a
            CPU step whatever its micro-batch).
        busy: Why the figures are lower bounds (measured while other processes used the CPUs); None when quiet.
    """

    device_name: str = ""
    mixed_speedup: dict[str, float] = field(default_factory=dict)
    conv_setup: dict[str, float] = field(default_factory=dict)
    busy: str | None = None


LINKS: dict[str, Link] = {
    "pcie3": Link(
        "pcie3", 15.75 * G, 5e-6, "PCI-SIG: PCIe 3.0 x16, 8 GT/s x 16 lanes, 128b/130b: 15.75 GB/s per direction"
    ),
    "pcie4": Link("pcie4", 31.5 * G, 5e-6, "PCI-SIG: PCIe 4.0 x16, 16 GT/s: 31.5 GB/s per direction"),
    "pcie5": Link("pcie5", 63.0 * G, 5e-6, "PCI-SIG: PCIe 5.0 x16, 32 GT/s: 63 GB/s per direction"),
    "nvlink2": Link("nvlink2", 150 * G, 3e-6, "NVIDIA V100 datasheet: NVLink 300 GB/s (both directions)"),
    "nvlink3": Link("nvlink3", 300 * G, 3e-6, "NVIDIA A100 datasheet: NVLink 600 GB/s (both directions)"),
    "nvlink4": Link("nvlink4", 450 * G, 3e-6, "NVIDIA H100/H200 datasheets: NVLink 900 GB/s (both directions)"),
    "nvlink5": Link("nvlink5", 900 * G, 3e-6, "NVIDIA HGX B200: NVLink 1.8 TB/s per GPU (both directions)"),
    "tpu-ici-v3": Link("tpu-ici-v3", 82 * G, 5e-6, "Google: TPU v3 inter-chip interconnect, 656 Gbps per chip link"),
    "tpu-ici-v5e": Link("tpu-ici-v5e", 200 * G, 5e-6, "Google Cloud: TPU v5e ICI 1,600 Gbps per chip"),
    "loopback": Link(
        "loopback",
        5 * G,
        20e-6,
        "processes of one machine over gloo (the run's CommBenchmark bandwidth is used where it measured one)",
    ),
    **{
        f"{n}gbps": Link(
            f"{n}gbps",
            n * G / 8,
            20e-6 if n <= 25 else 10e-6,
            f"{n} Gbit/s Ethernet or InfiniBand: {n / 8:g} GB/s per direction",
        )
        for n in (10, 25, 100, 200, 400)
    },
}

_V100 = "NVIDIA V100 datasheet (volta-v100-datasheet-update-us-1165301-r5); tensor cores: fp16 only"
_A100 = (
    "NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4), dense = sparse / 2; SXM and PCIe peaks equal"
)
_A10 = "NVIDIA A10 datasheet (A10G is AWS's A10 variant; AWS quotes the same tensor figures)"
_ADA = "NVIDIA Ada Lovelace architecture whitepaper v2.1 (FP16/BF16 tensor with FP32 accumulate, dense)"
_H100 = "NVIDIA H100 datasheet (nvidia-h100-datasheet-2430615), dense = sparse / 2"
_H200 = "NVIDIA H200 datasheet (hpc-datasheet-sc23-h200): H200 SXM has H100 SXM's compute, H200 NVL H100 NVL's"
_B200 = (
    "NVIDIA HGX B200 specifications (8-GPU totals, sparse: TF32 18 PF, FP16/BF16 36 PF, FP8 72 PF, FP32 600 TF, "
    "FP64 296 TF): per GPU /8, tensor figures /2"
)

# Architectures, each with where its rows' SM counts come from; a row's SMs go with the clock its datasheet tensor
# peak implies (peak / (SMs x tensor FLOP per SM per clock))
_SM_VOLTA = ("Volta", "NVIDIA Tesla V100 whitepaper: 80 SMs, 8 tensor cores each, 1,024 FP16 FLOP per SM per clock")
_SM_AMPERE = (
    "Ampere",
    "NVIDIA A100 Tensor Core GPU architecture whitepaper: 108 SMs, 2,048 dense FP16 FLOP per SM per clock",
)
_SM_GA102 = (
    "Ampere",
    "NVIDIA Ampere GA102 whitepaper: RTX 3090 82 SMs, A10 72 SMs; 512 (FP32 accumulate, GeForce) or "
    "1,024 dense FP16 FLOP per SM per clock",
)
_SM_ADA = (
    "Ada",
    "NVIDIA Ada Lovelace architecture whitepaper v2.1: RTX 4090 128 SMs, L4 58, L40 and L40S 142; 512 (FP32 "
    "accumulate, GeForce, L40) or 1,024 dense FP16 FLOP per SM per clock",
)
_SM_HOPPER = (
    "Hopper",
    "NVIDIA H100 Tensor Core GPU architecture whitepaper: SXM5 132 SMs, PCIe 114; 4,096 dense FP16 "
    "FLOP per SM per clock",
)

_H100_SXM = {
    "float64": 34 * T,
    "float32": 67 * T,
    "tf32": 494.7 * T,
    "bfloat16": 989.4 * T,
    "float16": 989.4 * T,
    "float8": 1978.9 * T,
}
_H100_NVL = {
    "float64": 30 * T,
    "float32": 60 * T,
    "tf32": 417.5 * T,
    "bfloat16": 835.5 * T,
    "float16": 835.5 * T,
    "float8": 1670.5 * T,
}
_A100_PEAKS = {"float64": 9.7 * T, "float32": 19.5 * T, "tf32": 156 * T, "bfloat16": 312 * T, "float16": 312 * T}
_A10_PEAKS = {"float32": 31.2 * T, "tf32": 62.5 * T, "bfloat16": 125 * T, "float16": 125 * T}


def _gpu(
    name: str,
    peaks: dict[str, float],
    peaks_source: str,
    memory: float,
    memory_source: str,
    bandwidth: float,
    bandwidth_source: str,
    link: str,
    kind: str = "gpu",
    sm: tuple[int, float, tuple[str, str]] | None = None,
) -> Chip:
    """A row; ``sm``: (SMs, the clock in GHz the tensor peak implies, (architecture, where the SM count comes from))."""
    sources = {"peaks": peaks_source, "memory": memory_source, "bandwidth": bandwidth_source}
    text = f"peaks: {peaks_source}; memory: {memory_source}; bandwidth: {bandwidth_source}"
    if sm:
        sources["sm"] = f"{sm[0]} SMs at {sm[1]:g} GHz ({sm[2][1]})"
        text += f"; SMs: {sources['sm']}"
    return Chip(
        name,
        dict(peaks),
        bandwidth,
        memory,
        link,
        text,
        kind=kind,
        sources=sources,
        sm_clock=sm[0] * sm[1] if sm else None,
        sms=sm[0] if sm else None,
        architecture=sm[2][0] if sm else "",
    )


_ROWS = [
    _gpu(
        "v100-sxm",
        {"float64": 7.8 * T, "float32": 15.7 * T, "float16": 125 * T},
        _V100,
        32 * GiB,
        "NVIDIA V100 datasheet: 32 GB HBM2 (16 GB variant too)",
        900 * G,
        "NVIDIA V100 datasheet: 900 GB/s HBM2",
        "nvlink2",
        sm=(80, 1.53, _SM_VOLTA),
    ),
    _gpu(
        "v100-pcie",
        {"float64": 7.0 * T, "float32": 14.0 * T, "float16": 112 * T},
        _V100,
        32 * GiB,
        "NVIDIA V100 datasheet: 32 GB HBM2",
        900 * G,
        "NVIDIA V100 datasheet: 900 GB/s HBM2",
        "pcie3",
        sm=(80, 1.38, _SM_VOLTA),
    ),
    _gpu(
        "v100s-pcie",
        {"float64": 8.2 * T, "float32": 16.4 * T, "float16": 130 * T},
        "NVIDIA V100S PCIe datasheet",
        32 * GiB,
        "NVIDIA V100S PCIe datasheet: 32 GB HBM2",
        1134 * G,
        "NVIDIA V100S datasheet: 1,134 GB/s",
        "pcie3",
    ),
    _gpu(
        "a100",
        _A100_PEAKS,
        _A100,
        80 * GiB,
        "NVIDIA A100 datasheet: 80 GB HBM2e (40 GB: a100-40gb)",
        2039 * G,
        "NVIDIA A100 datasheet: 80 GB SXM 2,039 GB/s HBM2e",
        "nvlink3",
        sm=(108, 1.41, _SM_AMPERE),
    ),
    _gpu(
        "a100-40gb",
        _A100_PEAKS,
        _A100,
        40 * GiB,
        "NVIDIA A100 datasheet: 40 GB HBM2",
        1555 * G,
        "NVIDIA A100 datasheet: 40 GB 1,555 GB/s HBM2",
        "nvlink3",
        sm=(108, 1.41, _SM_AMPERE),
    ),
    _gpu(
        "a10",
        _A10_PEAKS,
        _A10,
        24 * GiB,
        "NVIDIA A10 datasheet: 24 GB GDDR6",
        600 * G,
        "NVIDIA A10 datasheet: 600 GB/s GDDR6",
        "pcie4",
        sm=(72, 1.695, _SM_GA102),
    ),
    _gpu(
        "a10g",
        _A10_PEAKS,
        _A10,
        24 * GiB,
        "AWS G5 instances: A10G with 24 GB",
        600 * G,
        "AWS G5: A10G, 600 GB/s",
        "pcie4",
    ),
    _gpu(
        "rtx-3090",
        {"float32": 35.6 * T, "tf32": 35.6 * T, "bfloat16": 71 * T, "float16": 71 * T},
        "NVIDIA Ampere GA102 whitepaper, Table 9 (FP16/BF16 tensor with FP32 accumulate 71 dense; TF32 35.6 dense)",
        24 * GiB,
        "NVIDIA GeForce RTX 3090: 24 GB GDDR6X",
        936 * G,
        "NVIDIA RTX 3090: 936 GB/s GDDR6X",
        "pcie4",
        sm=(82, 1.695, _SM_GA102),
    ),
    _gpu(
        "rtx-4090",
        {"float32": 82.6 * T, "tf32": 82.6 * T, "bfloat16": 165.2 * T, "float16": 165.2 * T, "float8": 330.3 * T},
        _ADA,
        24 * GiB,
        "NVIDIA GeForce RTX 4090: 24 GB GDDR6X",
        1008 * G,
        "NVIDIA RTX 4090: 1,008 GB/s GDDR6X",
        "pcie4",
        sm=(128, 2.52, _SM_ADA),
    ),
    _gpu(
        "l4",
        {"float32": 30.3 * T, "tf32": 60.0 * T, "bfloat16": 121 * T, "float16": 121 * T, "float8": 242.5 * T},
        _ADA + ", L4 appendix",
        24 * GiB,
        "NVIDIA L4 datasheet: 24 GB GDDR6",
        300 * G,
        "NVIDIA L4 datasheet: 300 GB/s GDDR6",
        "pcie4",
        sm=(58, 2.04, _SM_ADA),
    ),
    _gpu(
        "l40",
        {"float32": 90.5 * T, "tf32": 90.5 * T, "bfloat16": 181 * T, "float16": 181 * T, "float8": 362 * T},
        _ADA + ", L40 appendix",
        48 * GiB,
        "NVIDIA L40 datasheet: 48 GB GDDR6",
        864 * G,
        "NVIDIA L40 datasheet: 864 GB/s GDDR6",
        "pcie4",
        sm=(142, 2.49, _SM_ADA),
    ),
    _gpu(
        "l40s",
        {"float32": 91.6 * T, "tf32": 183 * T, "bfloat16": 362.05 * T, "float16": 362.05 * T, "float8": 733 * T},
        "NVIDIA L40S datasheet (dense)",
        48 * GiB,
        "NVIDIA L40S datasheet: 48 GB GDDR6",
        864 * G,
        "NVIDIA L40S datasheet: 864 GB/s GDDR6",
        "pcie4",
        sm=(142, 2.49, _SM_ADA),
    ),
    _gpu(
        "h100-sxm",
        _H100_SXM,
        _H100,
        80 * GiB,
        "NVIDIA H100 datasheet: SXM 80 GB HBM3",
        3350 * G,
        "NVIDIA H100 datasheet: SXM 3.35 TB/s HBM3",
        "nvlink4",
        sm=(132, 1.83, _SM_HOPPER),
    ),
    _gpu(
        "h100-pcie",
        {
            "float64": 26 * T,
            "float32": 51 * T,
            "tf32": 378 * T,
            "bfloat16": 756 * T,
            "float16": 756 * T,
            "float8": 1513 * T,
        },
        _H100,
        80 * GiB,
        "NVIDIA H100 datasheet: PCIe 80 GB HBM2e",
        2000 * G,
        "NVIDIA H100 datasheet: PCIe 2 TB/s HBM2e",
        "pcie5",
        sm=(114, 1.62, _SM_HOPPER),
    ),
    _gpu(
        "h100-nvl",
        _H100_NVL,
        _H100,
        94 * GiB,
        "NVIDIA H100 datasheet: NVL 94 GB HBM3",
        3900 * G,
        "NVIDIA H100 datasheet: NVL 3.9 TB/s HBM3",
        "nvlink4",
        sm=(132, 1.545, _SM_HOPPER),
    ),
    _gpu(
        "h200-sxm",
        _H100_SXM,
        _H200,
        141 * GiB,
        "NVIDIA H200 datasheet: 141 GB HBM3e",
        4800 * G,
        "NVIDIA H200 datasheet: 4.8 TB/s HBM3e",
        "nvlink4",
        sm=(132, 1.83, _SM_HOPPER),
    ),
    _gpu(
        "h200-nvl",
        _H100_NVL,
        _H200,
        141 * GiB,
        "NVIDIA H200 datasheet: 141 GB HBM3e",
        4800 * G,
        "NVIDIA H200 datasheet: 4.8 TB/s HBM3e",
        "nvlink4",
        sm=(132, 1.545, _SM_HOPPER),
    ),
    _gpu(
        "b200",
        {
            "float64": 37 * T,
            "float32": 75 * T,
            "tf32": 1125 * T,
            "bfloat16": 2250 * T,
            "float16": 2250 * T,
            "float8": 4500 * T,
        },
        _B200,
        180 * GiB,
        "NVIDIA HGX B200 specifications: 1.4 TB HBM3e for 8 GPUs",
        8000 * G,
        "NVIDIA HGX B200: 8 TB/s HBM3e per GPU",
        "nvlink5",
    ),
    # Cascade Lake: 20 cores, 2.5 GHz base, two AVX-512 FMA units (64 float32 FLOP per cycle per core); no bf16 units
    # (bfloat16 runs at the float32 rate through conversions); six channels of DDR4-2933.
    _gpu(
        "xeon-6248",
        {"float32": 20 * 2.5e9 * 64, "bfloat16": 20 * 2.5e9 * 64},
        "Intel ARK: Xeon Gold 6248 (20 cores, 2.5 GHz, AVX-512 with 2 FMA units: 64 float32 FLOP per cycle per core; "
        "no bf16 units)",
        192 * G,
        "a 192 GB server (12 x 16 GB DIMMs)",
        6 * 23.47 * G,
        "Intel ARK: 6 x DDR4-2933 = 140.8 GB/s",
        "pcie3",
        kind="cpu",
    ),
    _gpu(
        "tpu-v3",
        {"bfloat16": 123 * T},
        "Google Cloud TPU v3: 123 TFLOP/s bf16 per chip",
        32 * GiB,
        "Google Cloud TPU v3: 32 GiB HBM per chip (16 per core)",
        900 * G,
        "Google Cloud TPU v3: 900 GB/s HBM per chip",
        "tpu-ici-v3",
        kind="tpu",
    ),
    _gpu(
        "tpu-v5e",
        {"bfloat16": 197 * T},
        "Google Cloud TPU v5e: 197 TFLOP/s bf16 per chip",
        16 * GiB,
        "Google Cloud TPU v5e: 16 GiB HBM2 per chip",
        819 * G,
        "Google Cloud TPU v5e: 819 GB/s HBM2",
        "tpu-ici-v5e",
        kind="tpu",
    ),
]

#: table key -> row
CHIPS: dict[str, Chip] = {chip.name: chip for chip in _ROWS}

#: Views of :data:`CHIPS` (kept for 0.3.0's imports): key -> dense peaks per dtype (GPUs), key -> (bytes, source).
PEAK_TABLE: dict[str, dict[str, float]] = {k: dict(c.peaks) for k, c in CHIPS.items() if c.kind == "gpu"}
MEMORY_TABLE: dict[str, tuple[float, str]] = {
    k: (c.memory, c.sources["memory"]) for k, c in CHIPS.items() if c.kind != "cpu"
}

# (required tokens, forbidden tokens, chip key), first match wins. Tokens are the lower-case alphanumeric words of the
# name torch.cuda.get_device_name() reports ("NVIDIA A100-SXM4-80GB" -> nvidia, a100, sxm4, 80gb), so "L40S" never
# matches "L4" or "L40".
_RULES: list[tuple[tuple[str, ...], tuple[str, ...], str]] = [
    (("h200", "nvl"), (), "h200-nvl"),
    (("h200",), (), "h200-sxm"),
    (("h100", "nvl"), (), "h100-nvl"),
    (("h100", "pcie"), (), "h100-pcie"),
    (("h100",), (), "h100-sxm"),
    (("b200",), (), "b200"),
    (("a100", "40gb"), (), "a100-40gb"),
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


def chip_for_name(device_name: str) -> str | None:
    """The table key for a device name as ``torch.cuda.get_device_name()`` reports it, or None."""
    tokens = set(re.findall(r"[a-z0-9]+", device_name.lower()))
    for required, forbidden, chip in _RULES:
        if all(t in tokens for t in required) and not any(t in tokens for t in forbidden):
            return chip
    return None


def find_chip(name: str, chips: dict[str, Chip] | None = None, option: str = "--hardware") -> Chip:
    """A chip by its table key or a device name (``NVIDIA H100 80GB HBM3``); an unknown one lists the known keys,
    naming ``option`` (the command-line option that gave it)."""
    table = CHIPS if chips is None else chips
    key = name.strip().lower()
    if key in table:
        return table[key]
    guessed = chip_for_name(name)
    if guessed and guessed in table:
        return table[guessed]
    raise HardwareError(
        f"{option} {name!r} is not in the table; known: {', '.join(sorted(table))}, this "
        "(or add it with --hardware-file)"
    )


def find_link(name: str, links: dict[str, Link] | None = None) -> Link:
    table = LINKS if links is None else links
    key = name.lower().replace(" ", "").replace("gbit/s", "gbps").replace("gb/s", "gbps")
    if key in table:
        return table[key]
    raise HardwareError(
        f"--network {name!r} is not in the table; known: {', '.join(sorted(table))} (or add it with --hardware-file)"
    )


def _number(row: str, field_name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise HardwareError(
            f"{row}: {field_name} is {value!r}, not a number (bytes, bytes/s or FLOP/s: 2.0e12)"
        ) from None
    if not math.isfinite(number) or number <= 0:
        raise HardwareError(f"{row}: {field_name} is {value!r}; it must be a positive number")
    return number


def load_hardware_file(path: str | Path) -> tuple[dict[str, Chip], dict[str, Link]]:
    """The tables with the rows of a YAML file added (see the module docstring). Raises :class:`HardwareError`
    naming the file, the row and the field."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise HardwareError(f"--hardware-file {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise HardwareError(f"--hardware-file {path}: not YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict) or set(data) - {"chips", "links"}:
        raise HardwareError(
            f"--hardware-file {path}: expected the sections chips: and links:, got "
            f"{sorted(data) if isinstance(data, dict) else type(data).__name__}"
        )
    links = dict(LINKS)
    for name, row in (data.get("links") or {}).items():
        where = f"{path}: links.{name}"
        if not isinstance(row, dict):
            raise HardwareError(f"{where}: expected a mapping with bandwidth, latency and source")
        links[str(name).lower()] = Link(
            str(name).lower(),
            _number(where, "bandwidth", row.get("bandwidth")),
            _number(where, "latency", row.get("latency", 1e-5)),
            str(row.get("source", "")),
        )
    chips = dict(CHIPS)
    for name, row in (data.get("chips") or {}).items():
        where = f"{path}: chips.{name}"
        if not isinstance(row, dict) or not isinstance(row.get("peaks"), dict) or not row["peaks"]:
            raise HardwareError(f"{where}: expected peaks: {{float32: ..., bfloat16: ...}}, bandwidth, memory, link")
        peaks = {str(k): _number(where, f"peaks.{k}", v) for k, v in row["peaks"].items()}
        link = str(row.get("link", "pcie4")).lower()
        if link not in links:
            raise HardwareError(f"{where}: link {link!r} is not a known link ({', '.join(sorted(links))})")
        source = str(row.get("source", path))
        kind = str(row.get("kind", "gpu")).lower()
        if kind not in ("gpu", "cpu", "tpu"):
            raise HardwareError(f"{where}: kind {kind!r} is not one of gpu, cpu, tpu")
        sm_clock, sms = None, None
        if row.get("sms") is not None or row.get("boost_ghz") is not None:  # both or neither
            sms = int(_number(where, "sms", row.get("sms")))
            sm_clock = sms * _number(where, "boost_ghz", row.get("boost_ghz"))
        chips[str(name).lower()] = Chip(
            str(name).lower(),
            peaks,
            _number(where, "bandwidth", row.get("bandwidth")),
            _number(where, "memory", row.get("memory")),
            link,
            source,
            kind=kind,
            sources={"peaks": source, "memory": source, "bandwidth": source},
            sm_clock=sm_clock,
            sms=sms,
        )
    return chips, links
