"""Hardware as data: chips (dense peak FLOP/s per dtype, memory bandwidth and capacity, the link between the chips of
one node) and networks, each row with its public source; rows of your own from a YAML file; and "this" machine,
measured.

Peaks are the vendors' dense figures (:data:`lit_compute.flops.peaks.PEAK_TABLE`, where the sources are cited);
capacities are :data:`lit_compute.flops.peaks.MEMORY_TABLE`'s. Bandwidths are bytes per second. A link's
``bandwidth`` is what one device sends in one direction at once (NVLink's "total" figures count both directions:
halved here), which is what a ring collective's time depends on.

A YAML file of your own (``--hardware-file``) adds or replaces rows::

    chips:
      my-gpu:
        peaks: {float32: 60e12, bfloat16: 500e12}   # dense FLOP/s
        bandwidth: 2.0e12                            # bytes/s
        memory: 48e9                                 # bytes
        link: pcie4                                  # a link name below
        source: "vendor datasheet, 2026"
    links:
      my-fabric: {bandwidth: 50e9, latency: 5e-6, source: "..."}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_compute.flops.peaks import MEMORY_TABLE, PEAK_TABLE, chip_for_name

__all__ = ["CHIPS", "LINKS", "Chip", "HardwareError", "Link", "find_chip", "find_link", "load_hardware_file"]

G, T = 1e9, 1e12


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
    """One accelerator (or CPU socket): dense peak FLOP/s per dtype, memory bandwidth and capacity, and the link
    between the devices of one node."""

    name: str
    peaks: dict[str, float]
    bandwidth: float
    memory: float
    link: str
    source: str
    measured: bool = False
    extras: dict[str, Any] = field(default_factory=dict)
    kind: str = "gpu"  # "gpu", "cpu" or "tpu": autocast keeps different ops in float32 on each
    class_peaks: dict[str, dict[str, float]] = field(default_factory=dict)  # op class -> dtype -> its own peak

    def peak(self, dtype: str) -> float | None:
        """The dense peak for a dtype name (``float32`` falls back to ``tf32`` nowhere: a float32 run counts against
        the float32 peak unless the caller asks for ``tf32``)."""
        return self.peaks.get(dtype)

    def peak_of(self, kind: str, dtype: str) -> float | None:
        """The peak an op class (``matmul``, ``conv``, ``attention``) runs at in a dtype: its own where measured (this
        machine's bf16 kernels speed each class up by a different factor), else the chip's."""
        return self.class_peaks.get(kind, {}).get(dtype) or self.peak(dtype)


LINKS: dict[str, Link] = {
    "pcie3": Link("pcie3", 15.75 * G, 5e-6, "PCI-SIG: PCIe 3.0 x16, 8 GT/s x 16 lanes, 128b/130b: 15.75 GB/s per direction"),
    "pcie4": Link("pcie4", 31.5 * G, 5e-6, "PCI-SIG: PCIe 4.0 x16, 16 GT/s: 31.5 GB/s per direction"),
    "pcie5": Link("pcie5", 63.0 * G, 5e-6, "PCI-SIG: PCIe 5.0 x16, 32 GT/s: 63 GB/s per direction"),
    "nvlink2": Link("nvlink2", 150 * G, 3e-6, "NVIDIA V100 datasheet: NVLink 300 GB/s (both directions)"),
    "nvlink3": Link("nvlink3", 300 * G, 3e-6, "NVIDIA A100 datasheet: NVLink 600 GB/s (both directions)"),
    "nvlink4": Link("nvlink4", 450 * G, 3e-6, "NVIDIA H100/H200 datasheets: NVLink 900 GB/s (both directions)"),
    "nvlink5": Link("nvlink5", 900 * G, 3e-6, "NVIDIA HGX B200: NVLink 1.8 TB/s per GPU (both directions)"),
    "tpu-ici-v3": Link("tpu-ici-v3", 82 * G, 5e-6, "Google: TPU v3 inter-chip interconnect, 656 Gbps per chip link"),
    "tpu-ici-v5e": Link("tpu-ici-v5e", 200 * G, 5e-6, "Google Cloud: TPU v5e ICI 1,600 Gbps per chip"),
    **{f"{n}gbps": Link(f"{n}gbps", n * G / 8, 20e-6 if n <= 25 else 10e-6,
                        f"{n} Gbit/s Ethernet or InfiniBand: {n / 8:g} GB/s per direction")
       for n in (10, 25, 100, 200, 400)},
}

_BANDWIDTH: dict[str, tuple[float, str, str]] = {  # chip -> (memory bytes/s, default link, source of the bandwidth)
    "v100-sxm": (900 * G, "nvlink2", "NVIDIA V100 datasheet: 900 GB/s HBM2"),
    "v100-pcie": (900 * G, "pcie3", "NVIDIA V100 datasheet: 900 GB/s HBM2"),
    "v100s-pcie": (1134 * G, "pcie3", "NVIDIA V100S datasheet: 1,134 GB/s"),
    "a100": (2039 * G, "nvlink3", "NVIDIA A100 datasheet: 80 GB SXM 2,039 GB/s HBM2e"),
    "a100-40gb": (1555 * G, "nvlink3", "NVIDIA A100 datasheet: 40 GB 1,555 GB/s HBM2"),
    "a10": (600 * G, "pcie4", "NVIDIA A10 datasheet: 600 GB/s GDDR6"),
    "a10g": (600 * G, "pcie4", "AWS G5: A10G, 600 GB/s"),
    "l4": (300 * G, "pcie4", "NVIDIA L4 datasheet: 300 GB/s GDDR6"),
    "l40": (864 * G, "pcie4", "NVIDIA L40 datasheet: 864 GB/s GDDR6"),
    "l40s": (864 * G, "pcie4", "NVIDIA L40S datasheet: 864 GB/s GDDR6"),
    "rtx-3090": (936 * G, "pcie4", "NVIDIA RTX 3090: 936 GB/s GDDR6X"),
    "rtx-4090": (1008 * G, "pcie4", "NVIDIA RTX 4090: 1,008 GB/s GDDR6X"),
    "h100-sxm": (3350 * G, "nvlink4", "NVIDIA H100 datasheet: SXM 3.35 TB/s HBM3"),
    "h100-pcie": (2000 * G, "pcie5", "NVIDIA H100 datasheet: PCIe 2 TB/s HBM2e"),
    "h100-nvl": (3900 * G, "nvlink4", "NVIDIA H100 datasheet: NVL 3.9 TB/s HBM3"),
    "h200-sxm": (4800 * G, "nvlink4", "NVIDIA H200 datasheet: 4.8 TB/s HBM3e"),
    "h200-nvl": (4800 * G, "nvlink4", "NVIDIA H200 datasheet: 4.8 TB/s HBM3e"),
    "b200": (8000 * G, "nvlink5", "NVIDIA HGX B200: 8 TB/s HBM3e per GPU"),
}


def _gpu_rows() -> dict[str, Chip]:
    rows = {}
    for name, (bandwidth, link, source) in _BANDWIDTH.items():
        peaks = PEAK_TABLE.get(name) or PEAK_TABLE.get(name.replace("-40gb", ""), {})
        memory = MEMORY_TABLE.get(name, (math.nan, ""))[0]
        rows[name] = Chip(name, dict(peaks), bandwidth, memory, link,
                          f"peaks: lit_compute.flops.peaks.PEAK_TABLE; {source}; memory: MEMORY_TABLE")
    return rows


CHIPS: dict[str, Chip] = {
    **_gpu_rows(),
    # Cascade Lake: 20 cores, 2.5 GHz base, two AVX-512 FMA units (64 float32 FLOP per cycle per core); no bf16 units
    # (bfloat16 runs at the float32 rate through conversions); six channels of DDR4-2933.
    "xeon-6248": Chip("xeon-6248", {"float32": 20 * 2.5e9 * 64, "bfloat16": 20 * 2.5e9 * 64}, 6 * 23.47 * G,
                      192 * G, "pcie3", "Intel ARK: Xeon Gold 6248 (20 cores, 2.5 GHz, AVX-512 with 2 FMA units, "
                      "6 x DDR4-2933 = 140.8 GB/s); memory: a 192 GB server", kind="cpu"),
    "tpu-v3": Chip("tpu-v3", {"bfloat16": 123 * T}, 900 * G, MEMORY_TABLE["tpu-v3"][0], "tpu-ici-v3",
                   "Google Cloud TPU v3: 123 TFLOP/s bf16 and 900 GB/s HBM per chip, 32 GiB", kind="tpu"),
    "tpu-v5e": Chip("tpu-v5e", {"bfloat16": 197 * T}, 819 * G, MEMORY_TABLE["tpu-v5e"][0], "tpu-ici-v5e",
                    "Google Cloud TPU v5e: 197 TFLOP/s bf16, 819 GB/s HBM2, 16 GiB per chip", kind="tpu"),
}


def find_chip(name: str, chips: dict[str, Chip] | None = None) -> Chip:
    """A chip by its table name or a device name (``NVIDIA H100 80GB HBM3``); an unknown one lists the known."""
    table = CHIPS if chips is None else chips
    key = name.lower()
    if key in table:
        return table[key]
    guessed = chip_for_name(name)
    if guessed and guessed in table:
        return table[guessed]
    raise HardwareError(f"--hardware {name!r} is not in the table; known: {', '.join(sorted(table))}, this "
                        "(or add it with --hardware-file)")


def find_link(name: str, links: dict[str, Link] | None = None) -> Link:
    table = LINKS if links is None else links
    key = name.lower().replace(" ", "").replace("gbit/s", "gbps").replace("gb/s", "gbps")
    if key in table:
        return table[key]
    raise HardwareError(f"--network {name!r} is not in the table; known: {', '.join(sorted(table))} "
                        "(or add it with --hardware-file)")


def _number(row: str, field_name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise HardwareError(f"{row}: {field_name} is {value!r}, not a number (bytes, bytes/s or FLOP/s: 2.0e12)") from None
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
        raise HardwareError(f"--hardware-file {path}: expected the sections chips: and links:, got {sorted(data) if isinstance(data, dict) else type(data).__name__}")
    links = dict(LINKS)
    for name, row in (data.get("links") or {}).items():
        where = f"{path}: links.{name}"
        if not isinstance(row, dict):
            raise HardwareError(f"{where}: expected a mapping with bandwidth, latency and source")
        links[str(name).lower()] = Link(str(name).lower(), _number(where, "bandwidth", row.get("bandwidth")),
                                        _number(where, "latency", row.get("latency", 1e-5)), str(row.get("source", "")))
    chips = dict(CHIPS)
    for name, row in (data.get("chips") or {}).items():
        where = f"{path}: chips.{name}"
        if not isinstance(row, dict) or not isinstance(row.get("peaks"), dict) or not row["peaks"]:
            raise HardwareError(f"{where}: expected peaks: {{float32: ..., bfloat16: ...}}, bandwidth, memory, link")
        peaks = {str(k): _number(where, f"peaks.{k}", v) for k, v in row["peaks"].items()}
        link = str(row.get("link", "pcie4")).lower()
        if link not in links:
            raise HardwareError(f"{where}: link {link!r} is not a known link ({', '.join(sorted(links))})")
        chips[str(name).lower()] = Chip(str(name).lower(), peaks, _number(where, "bandwidth", row.get("bandwidth")),
                                        _number(where, "memory", row.get("memory")), link, str(row.get("source", path)))
    return chips, links


def measure_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """This machine's memory bandwidth in bytes/s: the best of a few copies of a ``megabytes`` tensor (a read and a
    write of every byte), with torch's threads, as training runs."""
    import time

    import torch

    n = megabytes * 2**20 // 4
    a, b = torch.ones(n), torch.empty(n)
    b.copy_(a)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - start)
    return 2 * n * 4 / best


@dataclass(frozen=True)
class MixedSpeedup:
    """bf16 autocast's speed-up over float32 per heavy op class on this CPU, and whether every trial of it was quiet
    (this process got at least :data:`~lit_compute.flops.peaks.QUIET_CPU_SHARE` of its threads' CPU time)."""

    ratios: dict[str, float]
    quiet: bool


def measure_mixed_speedup(repeats: int = 10, trials: int = 5, seconds: float = 20.0) -> MixedSpeedup:
    """How much faster each heavy op class of a training step runs under bf16 autocast than in float32 on this CPU,
    casts included, forward and backward: ``matmul`` on an MLP block, ``conv`` on a convolution block, ``attention``
    on causal scaled-dot-product attention (on some CPUs its bf16 backward is slower than float32's). What a CPU's
    bf16 GEMM peak overstates: its kernels and casts in training reach far less of it than a large GEMM. Each class
    is the median of ``trials`` ratios of best-of-``repeats`` times, the trials interleaved across the classes; the
    CPU time this process got is checked like the peak's (a busy machine is not cached). Bounded in time on a CPU
    whose bf16 is slow (no AVX512-BF16 or AMX: many times float32's time): a mode stops repeating after a tenth of
    ``seconds`` once it has two timed runs, and no trial starts after ``seconds`` once one has finished."""
    import time

    import torch

    from lit_compute.flops.peaks import QUIET_CPU_SHARE

    def attention_block(x: Any) -> Any:
        return torch.nn.functional.scaled_dot_product_attention(x, x * 0.5, x * 0.25, is_causal=True)

    blocks: dict[str, tuple[Any, Any]] = {
        "matmul": (torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)),
                   torch.randn(256, 512)),
        "conv": (torch.nn.Sequential(torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(),
                                     torch.nn.Conv2d(64, 32, 3, padding=1)), torch.randn(16, 32, 32, 32)),
        "attention": (attention_block, torch.randn(8, 4, 128, 64))}
    ratios: dict[str, list[float]] = {kind: [] for kind in blocks}
    threads = max(1, torch.get_num_threads())
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for trial in range(max(1, trials)):
        if trial and time.perf_counter() - wall0 > seconds:
            break
        for kind, (block, data) in blocks.items():
            times = []
            for mixed in (False, True):
                best, mode0 = math.inf, time.perf_counter()
                for i in range(repeats + 1):
                    if i > 2 and time.perf_counter() - mode0 > seconds / 10:
                        break
                    x = data.clone().requires_grad_(kind == "attention")
                    start = time.perf_counter()
                    with torch.autocast("cpu", torch.bfloat16, enabled=mixed):
                        out = block(x)
                    out.float().sum().backward()
                    if i:  # the first is a warm-up
                        best = min(best, time.perf_counter() - start)
                times.append(best)
            ratios[kind].append(times[0] / times[1])
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    share = min(1.0, cpu / (wall * threads)) if wall > 0 else 1.0
    return MixedSpeedup({k: sorted(v)[len(v) // 2] for k, v in ratios.items()}, share >= QUIET_CPU_SHARE)


def this_machine() -> Chip:
    """This machine as a chip: its CPU's measured float32 GEMM peak (the cached one FlopsLogger uses), its bf16
    rate as float32's times the measured mixed-precision speed-up of training blocks (:func:`measure_mixed_speedup`),
    its measured memory bandwidth (both cached beside the peaks), its memory, and the loopback between its
    processes."""
    import json

    import psutil
    import torch

    from lit_compute._compat import default_cache_dir
    from lit_compute.files import write_whole
    from lit_compute.flops.peaks import _peak_key, cached_peak_flops

    fp32 = cached_peak_flops("cpu", torch.float32)
    name, key = _peak_key(torch.device("cpu"), torch.float32)
    path = default_cache_dir() / "machine.json"
    entries: dict[str, Any] = {}
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        entries = {}
    entry = entries.get(key) if isinstance(entries, dict) else None
    speedups = entry.get("mixed_speedup") if isinstance(entry, dict) else None
    if not (isinstance(entry, dict) and isinstance(entry.get("bandwidth"), (int, float))
            and isinstance(speedups, dict) and all(isinstance(speedups.get(k), (int, float)) and speedups[k] > 0
                                                   for k in ("matmul", "conv", "attention"))):
        mixed_speedup = measure_mixed_speedup()
        entry = {"bandwidth": measure_bandwidth(), "mixed_speedup": mixed_speedup.ratios}
        if fp32.quiet and mixed_speedup.quiet:  # cached like the peak: only when measured on a quiet machine
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_whole(path, json.dumps({**(entries if isinstance(entries, dict) else {}), key: entry}))
            except OSError:
                pass
    speedups = {k: float(v) for k, v in entry["mixed_speedup"].items()}
    # the chip's own bf16 peak: the matmuls' and convolutions' (geometric mean); each class its own beside it
    mixed = fp32.flops * math.sqrt(speedups["matmul"] * speedups["conv"])
    return Chip("this", {"float32": fp32.flops, "bfloat16": mixed, "float16": mixed}, float(entry["bandwidth"]),
                float(psutil.virtual_memory().total), "loopback",
                f"measured: {name}, {torch.get_num_threads()} threads ({fp32.describe()}); in bf16 training blocks "
                "run at " + ", ".join(f"{k} {v:.2f}x" for k, v in speedups.items()) + " float32's speed",
                measured=True, extras={"mixed_speedup": speedups}, kind="cpu",
                class_peaks={k: {"bfloat16": fp32.flops * v, "float16": fp32.flops * v} for k, v in speedups.items()})


LINKS["loopback"] = Link("loopback", 5 * G, 20e-6, "processes of one machine over gloo (the run's CommBenchmark "
                         "bandwidth is used where it measured one)")
