"""This machine, measured once and described in one place.

One cache file, ``$LIT_COMPUTE_CACHE/this_machine.json``, holds what was measured here: the dense GEMM peak per device,
dtype, torch threads and torch version (:func:`cached_peak_flops`, what ``FlopsLogger(peak="measure")`` and the tune
use), and per device the memory bandwidth and bf16 autocast's speed-up per op class (:func:`this_machine`). It is
read once per process (again only when another process rewrote it), and written whole. A measurement made while
other processes took the CPUs serves its run only and is never cached.

:func:`this_machine` says which device it describes: on a machine with CUDA, the CUDA device as its table row
(``h200-sxm`` for an "NVIDIA H200"; a GPU missing from the table is measured); elsewhere the CPU, measured, named
``this``. :func:`bf16_fast` is the one answer to "is bf16 fast here?" that the tune, ``whatif`` and the benches ask.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from lit_compute._compat import default_cache_dir, on_real_tensors
from lit_compute.files import write_whole
from lit_compute.hardware import measure
from lit_compute.hardware.chips import CHIPS, Chip, ThisMachine, chip_for_name
from lit_compute.hardware.dtypes import DTYPE_NAMES

AnyChip = TypeVar("AnyChip", bound=Chip)

__all__ = [
    "BF16_FAST_RATIO",
    "MeasuredPeak",
    "bf16_fast",
    "cache_path",
    "cached_peak_flops",
    "cpu_name",
    "conv_setup_in_fresh_process",
    "conv_setup_seconds",
    "device_description",
    "host_dispatch_seconds",
    "machine_line",
    "peak_key",
    "this_machine",
    "with_conv_setup",
]

#: bf16 counts as fast here when training blocks (matmuls and convolutions, geometric mean) run at least this many
#: times faster under bf16 autocast than in float32.
BF16_FAST_RATIO = 1.2


def cache_path() -> Path:
    """The one cache file of this machine's measurements."""
    return default_cache_dir() / "this_machine.json"


_READ: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}  # path -> ((mtime_ns, size), contents)


def _load() -> dict[str, Any]:
    """The cache's contents (``{"peaks": {...}, "devices": {...}}``), read once per process and again only when the
    file changed; a missing or broken file reads as empty."""
    path = cache_path()
    try:
        stat = path.stat()
    except OSError:
        return {"peaks": {}, "devices": {}}
    stamp = (stat.st_mtime_ns, stat.st_size)
    seen = _READ.get(str(path))
    if seen is not None and seen[0] == stamp:
        return json.loads(json.dumps(seen[1]))  # a copy: callers edit it before saving
    data: Any = {}
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
    if not isinstance(data, dict):
        data = {}
    clean = {part: data[part] if isinstance(data.get(part), dict) else {} for part in ("peaks", "devices")}
    _READ[str(path)] = (stamp, clean)
    return json.loads(json.dumps(clean))


def _save(data: dict[str, Any]) -> None:
    path = cache_path()
    with contextlib.suppress(OSError):  # a read-only cache: the values are still used for this run
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, json.dumps(data, indent=1, sort_keys=True))


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or "unknown CPU"."""
    name = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    return name


def device_description(device: torch.device) -> str:
    """The name of a device as people know it: the CUDA device's name, or the CPU's model."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def machine_line() -> str:
    """One line naming this machine for a figure's header: CPU, torch threads, GPU, torch version."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu_name()}, {torch.get_num_threads()} torch threads, {gpu}, torch {torch.__version__}"


# -- the GEMM peak ---------------------------------------------------------------------------------------------------
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


def _dtype_name(device: torch.device, dtype: torch.dtype, tf32: bool | None) -> str:
    return (
        "tf32" if measure.uses_tf32(device, dtype, tf32) else DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))
    )


def _device_key(device: torch.device) -> tuple[str, str]:
    """(the device's name, the cache key of the device as measured here: name, torch threads, torch version, and on a
    CPU the instruction set torch dispatches to: one model name covers CPUs with and without AVX-512 and its bf16,
    and a cache folder can move between them)."""
    name = device_description(device)
    if device.type != "cpu":
        return name, f"{device.type}|{name}|threads=0|torch={torch.__version__}"
    capability = torch.backends.cpu.get_cpu_capability()
    return name, f"cpu|{name}|{capability}|threads={torch.get_num_threads()}|torch={torch.__version__}"


def peak_key(device: torch.device, dtype: torch.dtype, tf32: bool | None = None) -> str:
    """The cache's key of a GEMM peak: the device as measured here (name, torch threads, torch version) and the
    dtype (``tf32`` for float32 on TF32 units)."""
    return f"{_device_key(device)[1]}|{_dtype_name(device, dtype, tf32)}"


def cached_peak_flops(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    remeasure: bool = False,
    at_least: float | None = None,
    tf32: bool | None = None,
) -> MeasuredPeak:
    """This machine's measured dense GEMM peak in ``dtype``, measured once and cached (:func:`cache_path`) with the
    conditions it was measured under (device, threads, torch version, load average, time), so MFU is against the
    same peak in every run.

    The cache is keyed by device name, dtype, torch threads (a 1-thread and a 2-thread peak are two entries) and
    torch version. A peak is cached only when measured on a quiet machine (:func:`~lit_compute.hardware.measure.
    measure_peak`): one measured while other processes took the cores serves this run only, with ``quiet=False``,
    and replaces nothing. ``remeasure=True`` measures again; ``at_least`` (FLOP/s a run achieved) measures again
    when the cached value is below it. A new measurement above the cached value proves the cached one wrong: it is
    replaced when the new one is quiet, removed otherwise. ``tf32`` (float32 on CUDA): the TF32 GEMM peak or the
    float32 one (None: as the matmul switch is now); each is its own entry."""
    dev = torch.device(device)
    name, _ = _device_key(dev)
    key = peak_key(dev, dtype, tf32)
    data = _load()
    entries = data["peaks"]
    entry = entries.get(key)
    cached: MeasuredPeak | None = None
    if isinstance(entry, dict) and isinstance(entry.get("flops"), (int, float)):
        fields: dict[str, Any] = {
            k: entry.get(k)
            for k in ("flops", "device", "dtype", "threads", "torch_version", "measured_at", "load_average")
        }
        with contextlib.suppress(TypeError):
            cached = MeasuredPeak(**fields, cached=True)
    if cached is not None and not remeasure and (at_least is None or cached.flops >= at_least):
        return cached
    with on_real_tensors():  # a FLOP counter or an estimate's fake tensors never see it
        measured = measure.measure_peak(dev, dtype, tf32=tf32)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    peak = MeasuredPeak(
        flops=measured.flops,
        device=name,
        dtype=_dtype_name(dev, dtype, tf32),
        threads=torch.get_num_threads() if dev.type == "cpu" else 0,
        torch_version=torch.__version__,
        measured_at=time.strftime("%Y-%m-%d %H:%M"),
        load_average=load,
        quiet=measured.quiet,
        cpu_share=measured.cpu_share,
    )
    if measured.quiet:
        entries[key] = {k: v for k, v in asdict(peak).items() if k not in ("cached", "quiet")}
    elif cached is not None and cached.flops < measured.flops:
        del entries[key]  # even a busy machine beat it: the cached value was measured under load
    else:
        return peak
    _save(data)
    return peak


# -- the device as a chip --------------------------------------------------------------------------------------------
def _measured_entry(device: torch.device, fp32_quiet: bool) -> tuple[dict[str, Any], bool]:
    """The device's measured memory bandwidth and (CPU) bf16 speed-up per op class, and whether they were measured
    on a quiet machine: cached, else measured (and cached when measured on a quiet machine)."""
    _, key = _device_key(device)
    data = _load()
    entry = data["devices"].get(key)
    speedups = entry.get("mixed_speedup") if isinstance(entry, dict) else None
    wanted = ("matmul", "conv", "attention") if device.type == "cpu" else ()
    if (
        isinstance(entry, dict)
        and isinstance(entry.get("bandwidth"), (int, float))
        and isinstance(speedups, dict)
        and all(isinstance(speedups.get(k), (int, float)) and speedups[k] > 0 for k in wanted)
    ):
        return entry, True
    quiet = fp32_quiet
    # measured again: what else the entry holds (the host's dispatch cost) stays
    with on_real_tensors():  # a FLOP counter or an estimate's fake tensors never see it
        entry = {
            **(entry if isinstance(entry, dict) else {}),
            "bandwidth": measure.measure_bandwidth(device=device),
            "mixed_speedup": {},
        }
        if device.type == "cpu":
            mixed = measure.measure_mixed_speedup()
            entry["mixed_speedup"], quiet = mixed.ratios, quiet and mixed.quiet
    if quiet:  # cached like the peak: only when measured on a quiet machine
        data["devices"][key] = entry
        _save(data)
    return entry, quiet


def _table_row(device: torch.device) -> ThisMachine | None:
    """The table row of a CUDA device, marked as this machine's (its name stays the table key)."""
    name = torch.cuda.get_device_name(device)
    key = chip_for_name(name)
    if key is None or key not in CHIPS:
        return None
    row = CHIPS[key]
    fields = {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
    fields["source"] = f"this machine's {name}: the table row {key} ({row.source})"
    return ThisMachine(**fields, device_name=name)


def this_machine(device: torch.device | str | None = None) -> ThisMachine:
    """This machine as a chip. ``device`` None: the CUDA device where there is one, else the CPU.

    A CUDA device in the table is its table row (named by its key, so a run recorded on it is priced against its
    own chip); one missing from the table is measured (GEMM peaks, bandwidth) and named ``this``. The CPU is named
    ``this``: its measured float32 GEMM peak (the cached one FlopsLogger uses), its bf16 rate as float32's times
    the measured mixed-precision speed-up of training blocks (:func:`~lit_compute.hardware.measure.
    measure_mixed_speedup`), its measured memory bandwidth, its memory, and the loopback between its processes.
    Either way its ``device_name`` names what it describes, and what was measured here is in its own fields
    (:class:`~lit_compute.hardware.chips.ThisMachine`)."""
    import psutil

    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        row = _table_row(dev)
        if row is not None:
            return row
        name = torch.cuda.get_device_name(dev)
        fp32 = cached_peak_flops(dev, torch.float32, tf32=False)
        peaks = {"float32": fp32.flops, "tf32": cached_peak_flops(dev, torch.float32, tf32=True).flops}
        with contextlib.suppress(RuntimeError):
            peaks["bfloat16"] = peaks["float16"] = cached_peak_flops(dev, torch.bfloat16).flops
        entry, _ = _measured_entry(dev, fp32.quiet)
        memory = float(torch.cuda.get_device_properties(dev).total_memory)
        return ThisMachine(
            "this",
            peaks,
            float(entry["bandwidth"]),
            memory,
            "pcie4",
            f"measured: {name} ({fp32.describe()}); not in the table",
            measured=True,
            device_name=name,
        )
    fp32 = cached_peak_flops("cpu", torch.float32)
    entry, quiet = _measured_entry(dev, fp32.quiet)
    busy = (
        None
        if quiet and fp32.quiet
        else "measured while other processes used the CPUs: its peaks are lower bounds, not cached"
    )
    speedups = {k: float(v) for k, v in entry["mixed_speedup"].items()}
    # the chip's own bf16 peak: the matmuls' and convolutions' (geometric mean); each class its own beside it
    mixed = fp32.flops * math.sqrt(speedups["matmul"] * speedups["conv"])
    name = cpu_name()
    return ThisMachine(
        "this",
        {"float32": fp32.flops, "bfloat16": mixed, "float16": mixed},
        float(entry["bandwidth"]),
        float(psutil.virtual_memory().total),
        "loopback",
        f"measured: {name}, {torch.get_num_threads()} threads ({fp32.describe()}); in bf16 training blocks "
        "run at " + ", ".join(f"{k} {v:.2f}x" for k, v in speedups.items()) + " float32's speed",
        measured=True,
        kind="cpu",
        class_peaks={k: {"bfloat16": fp32.flops * v, "float16": fp32.flops * v} for k, v in speedups.items()},
        sources={"peaks": "measured here", "memory": "psutil: this machine's memory", "bandwidth": "measured here"},
        device_name=name,
        mixed_speedup=speedups,
        busy=busy,
    )


def _cached_cpu_figure(path: tuple[str, ...], measure_it: Callable[[], tuple[float, bool]]) -> float:
    """A figure of this CPU kept at ``path`` in its cache entry (``("dispatch_s",)``, ``("conv_setup",
    "float32@2")``): read back when there, else ``measure_it()`` (the figure, quiet or not), cached when measured on a
    quiet machine and positive."""
    _, key = _device_key(torch.device("cpu"))
    data = _load()
    value: Any = data["devices"].get(key)
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, (int, float)) and value > 0:
        return float(value)
    with on_real_tensors():
        figure, quiet = measure_it()
    if quiet and figure > 0:
        node = data["devices"].setdefault(key, {})
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = figure
        _save(data)
    return figure


def host_dispatch_seconds() -> float:
    """The host's cost of one eager op of a training step on this CPU (:func:`~lit_compute.hardware.measure.
    measure_dispatch`), measured once and cached with this CPU's other measurements when measured on a quiet
    machine: what ``whatif`` charges the host per kernel of a step on an accelerator."""

    def dispatch() -> tuple[float, bool]:
        measured = measure.measure_dispatch()
        return measured.seconds, measured.quiet

    return _cached_cpu_figure(("dispatch_s",), dispatch)


def conv_setup_seconds(dtype: torch.dtype = torch.float32) -> float:
    """What a convolution costs on this CPU whatever its batch, in seconds per byte of its weight in ``dtype``
    (:func:`~lit_compute.hardware.measure.measure_conv_setup`), at this process's torch threads: measured once, in a
    fresh process (:func:`conv_setup_in_fresh_process`), and cached with this CPU's other measurements when measured
    on a quiet machine."""

    def setup() -> tuple[float, bool]:
        measured = conv_setup_in_fresh_process(dtype)
        return measured.seconds_per_byte, measured.quiet

    return _cached_cpu_figure(("conv_setup", f"{DTYPE_NAMES.get(dtype, str(dtype))}@{torch.get_num_threads()}"), setup)


def conv_setup_in_fresh_process(dtype: torch.dtype, prelude: str = "") -> measure.ConvSetup:
    """:func:`~lit_compute.hardware.measure.measure_conv_setup` in a new Python process at this one's torch threads
    (after the Python ``prelude``, when given): the figure depends on what the process allocated and freed before
    (its docstring), and a fresh process is the state it was found in inside a Lightning run (``lit-compute bench
    whatif --only setup``), whatever this process did first. Measured here when the child cannot run."""
    import subprocess
    import sys

    code = "; ".join(
        [
            "import json, sys, torch",
            "from lit_compute.hardware.measure import measure_conv_setup",
            *([prelude] if prelude else []),
            f"torch.set_num_threads({torch.get_num_threads()})",
            f"r = measure_conv_setup(torch.{DTYPE_NAMES[dtype]})",
            "json.dump([r.seconds_per_byte, r.quiet], sys.stdout)",
        ]
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
        seconds, quiet = json.loads(done.stdout.strip().splitlines()[-1])
        return measure.ConvSetup(float(seconds), bool(quiet))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return measure.measure_conv_setup(dtype)


def with_conv_setup(chip: AnyChip, dtypes: tuple[str, ...] = ("float32", "bfloat16")) -> AnyChip:
    """``chip`` with this CPU's convolution set-up cost per weight byte for each of ``dtypes``
    (:attr:`ThisMachine.conv_setup`: dtype name -> seconds per byte; :func:`conv_setup_seconds`), which ``whatif``
    adds to a CPU step whatever its micro-batch; ``chip`` as it is unless it is this machine's CPU."""
    if chip.kind != "cpu" or not isinstance(chip, ThisMachine):
        return chip
    by_name = {name: dtype for dtype, name in DTYPE_NAMES.items()}
    rates = {name: conv_setup_seconds(by_name[name]) for name in dtypes if name in by_name}
    return dataclasses.replace(chip, conv_setup=rates)


def bf16_fast(device: str = "cpu") -> tuple[bool, str]:
    """Whether bf16 training is fast on ``device`` ("cpu" or "cuda"), and why, in words: the one answer the tune, the
    benches and ``whatif`` share. CUDA: the device supports bf16. CPU: bf16 autocast runs training blocks
    (:func:`this_machine`'s measured speed-up of matmuls and convolutions, geometric mean) at least
    :data:`BF16_FAST_RATIO` times float32's speed."""
    if device == "cuda":
        fast = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        return fast, "the GPU supports bf16" if fast else "the GPU has no bf16"
    speedups = this_machine("cpu").mixed_speedup
    ratio = math.sqrt(speedups["matmul"] * speedups["conv"])
    return ratio >= BF16_FAST_RATIO, (
        f"bf16 autocast runs training blocks at {ratio:.2f}x float32's speed here "
        f"(matmul {speedups['matmul']:.2f}x, conv {speedups['conv']:.2f}x)"
    )
