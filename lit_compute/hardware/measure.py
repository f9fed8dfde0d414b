"""Measuring this machine: the dense GEMM peak of a device in a dtype (with the machine's load sampled), the memory
bandwidth, bf16 autocast's speed-up per op class of a training step on a CPU, the host's cost per eager op, and what a
CPU convolution costs whatever its batch.

Each measurement is a pure function of the device; :mod:`lit_compute.hardware.this_machine` caches what they find.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from lit_compute._compat import on_real_tensors, returns_only_views
from lit_compute.hardware.dtypes import tf32_enabled

__all__ = [
    "QUIET_CPU_SHARE",
    "ConvSetup",
    "Dispatch",
    "MixedSpeedup",
    "PeakMeasurement",
    "measure_bandwidth",
    "measure_conv_setup",
    "measure_dispatch",
    "measure_mixed_speedup",
    "measure_peak",
    "measure_peak_flops",
]


def measure_peak_flops(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    size: int | None = None,
    seconds: float = 1.0,
    tf32: bool | None = None,
) -> float:
    """Measure the achievable dense GEMM FLOP/s on ``device`` in ``dtype`` (best of several timed runs).

    On CPU this uses ``torch.get_num_threads()`` threads, as training does. The matrix side defaults to 2048
    on CPU and 8192 on GPU. The loop stops after about ``seconds``. ``tf32`` (float32 on CUDA): measure with TF32
    matmuls on or off (None: as ``torch.backends.cuda.matmul.allow_tf32`` is now). See :func:`measure_peak` for the
    same with the machine's contention measured.
    """
    return measure_peak(device, dtype, size=size, seconds=seconds, rounds=1, tf32=tf32).flops


def uses_tf32(device: torch.device, dtype: torch.dtype, tf32: bool | None) -> bool:
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


@on_real_tensors()
def measure_peak(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    size: int | None = None,
    seconds: float = 1.5,
    rounds: int = 5,
    tf32: bool | None = None,
) -> PeakMeasurement:
    """The dense GEMM peak of ``device`` in ``dtype``, with the machine's load sampled while measuring.

    The time is split into ``rounds``; in each the best of several GEMMs is kept and, on CPU, the CPU time this
    process got is compared with what its ``torch.get_num_threads()`` threads could have used (a share under
    :data:`QUIET_CPU_SHARE` means other processes took the cores). The result is the best quiet round, or the
    best round with ``quiet=False`` when none was quiet. On GPUs every round counts as quiet. ``tf32``: see
    :func:`measure_peak_flops`."""
    dev = torch.device(device)
    if dev.type == "cuda" and dtype == torch.float32:
        with _matmul_tf32(uses_tf32(dev, dtype, tf32)):
            return _measure_peak(dev, dtype, size, seconds, rounds)
    return _measure_peak(dev, dtype, size, seconds, rounds)


def _measure_peak(
    dev: torch.device, dtype: torch.dtype, size: int | None, seconds: float, rounds: int
) -> PeakMeasurement:
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
    return PeakMeasurement(
        flops=max(quiet) if quiet else max(f for f, _ in results),
        quiet=bool(quiet),
        cpu_share=min(shares) if shares else None,
    )


def _affordable_side(n: int, dtype: torch.dtype, per_round: float, probe: int = 256) -> int:
    """The matrix side to time on a CPU: ``n``, unless a product of that side would take longer than a round (a
    dtype the CPU has no native instructions for, such as bfloat16 without AVX512-BF16 or AMX, runs 20 or more times
    slower than float32). Each side is timed itself, doubling from ``probe`` up to ``n``: the last whose product
    took at most a round, stopping at one that took more than an eighth of a round (at the cube of the side, the
    next would take more than a round). Nothing is extrapolated: such a dtype's time grows faster than the cube of
    the side once the matrices leave the caches (from 512 to 1024 wide, 21x rather than 8x, seen on bfloat16 under
    AVX2), and a side extrapolated from a 256-wide product ran for minutes. Keeps the measurement about as long as
    asked on any CPU."""
    side, kept = probe, probe
    a = torch.randn(probe, probe).to(dtype)
    torch.mm(a, a)  # the library's first call (its kernels chosen)
    while True:
        a = torch.randn(side, side).to(dtype)
        t0 = time.perf_counter()
        torch.mm(a, a)
        took = time.perf_counter() - t0
        if took > per_round:  # longer than a round: the side before it
            return kept
        if side >= n or took * 8 > per_round:  # the next doubling would take more than a round
            return side
        kept, side = side, min(n, side * 2)


@on_real_tensors()
def measure_bandwidth(megabytes: int = 256, repeats: int = 5, device: torch.device | str = "cpu") -> float:
    """The memory bandwidth of ``device`` in bytes/s: the best of a few copies of a ``megabytes`` tensor (a read and a
    write of every byte), with torch's threads on a CPU, as training runs."""
    dev = torch.device(device)
    n = megabytes * 2**20 // 4
    a, b = torch.ones(n, device=dev), torch.empty(n, device=dev)
    b.copy_(a)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    sync()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        b.copy_(a)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * n * 4 / best


@dataclass(frozen=True)
class MixedSpeedup:
    """bf16 autocast's speed-up over float32 per heavy op class on this CPU, and whether every trial of it was quiet
    (this process got at least :data:`QUIET_CPU_SHARE` of its threads' CPU time)."""

    ratios: dict[str, float]
    quiet: bool


def _median(values: list[float]) -> float:
    """The middle value (the upper of the two middle ones of an even count)."""
    return sorted(values)[len(values) // 2]


@on_real_tensors()
def measure_mixed_speedup(repeats: int = 10, trials: int = 5, seconds: float = 20.0) -> MixedSpeedup:
    """How much faster each heavy op class of a training step runs under bf16 autocast than in float32 on this CPU,
    casts included, forward and backward: ``matmul`` on an MLP block, ``conv`` on a convolution block, ``attention``
    on causal scaled-dot-product attention (on some CPUs its bf16 backward is slower than float32's). What a CPU's
    bf16 GEMM peak overstates: its kernels and casts in training reach far less of it than a large GEMM. Each class
    is the median of ``trials`` ratios of best-of-``repeats`` times, the trials interleaved across the classes; the
    CPU time this process got is checked like the peak's (a busy machine is not cached). Bounded in time on a CPU
    whose bf16 is slow (no AVX512-BF16 or AMX: many times float32's time): a mode stops repeating after a tenth of
    ``seconds`` once it has two timed runs, and no trial starts after ``seconds`` once one has finished. Quiet is
    read on the float32 modes only: there bf16's fallback kernels may run on one thread, which is not a busy
    machine (it kept an AVX2-only CPU's figures from ever being cached)."""

    def attention_block(x: Any) -> Any:
        return torch.nn.functional.scaled_dot_product_attention(x, x * 0.5, x * 0.25, is_causal=True)

    blocks: dict[str, tuple[Any, Any]] = {
        "matmul": (
            torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)),
            torch.randn(256, 512),
        ),
        "conv": (
            torch.nn.Sequential(
                torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 32, 3, padding=1)
            ),
            torch.randn(16, 32, 32, 32),
        ),
        "attention": (attention_block, torch.randn(8, 4, 128, 64)),
    }
    ratios: dict[str, list[float]] = {kind: [] for kind in blocks}
    threads = max(1, torch.get_num_threads())
    wall0, wall, cpu = time.perf_counter(), 0.0, 0.0  # the CPU time of the float32 modes against their wall time
    for trial in range(max(1, trials)):
        if trial and time.perf_counter() - wall0 > seconds:
            break
        for kind, (block, data) in blocks.items():
            times = []
            for mixed in (False, True):
                best, mode0, cpu_mode0 = math.inf, time.perf_counter(), time.process_time()
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
                if not mixed:  # float32's kernels use every thread; bf16's fallbacks may not (AVX2: one thread)
                    wall += time.perf_counter() - mode0
                    cpu += time.process_time() - cpu_mode0
            ratios[kind].append(times[0] / times[1])
    share = min(1.0, cpu / (wall * threads)) if wall > 0 else 1.0
    return MixedSpeedup({k: _median(v) for k, v in ratios.items()}, share >= QUIET_CPU_SHARE)


@dataclass(frozen=True)
class Dispatch:
    """The host's cost of one eager op in a training step (seconds), the ops one step of the probe dispatched, and
    whether this process got its thread's CPU time while it was timed."""

    seconds: float
    ops: int
    quiet: bool


def count_kernels(fn: Any) -> int:
    """The ops ``fn()`` dispatches that launch a kernel: every aten op with a tensor result that is not a view of an
    operand (what FlopsLogger's op classes count as kernels)."""
    from lit_compute._compat import TorchDispatchMode, tree_leaves

    class _Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if not returns_only_views(func) and any(isinstance(t, torch.Tensor) for t in tree_leaves(out)):
                _Count.n += 1
            return out

    with _Count():
        fn()
    return _Count.n


@on_real_tensors()
def measure_dispatch(steps: int = 50, rounds: int = 5) -> Dispatch:
    """What eager PyTorch costs the host per op of a training step on this CPU: a three-layer MLP eight wide on two
    samples (its arithmetic is nothing) trained with autograd and SGD, the best round's time per step over the ops
    one step dispatches (:func:`count_kernels`). On a GPU host every op of a step costs the host this (Python,
    autograd, the dispatcher) before the device can run it, which is what bounds small models on fast GPUs. Quiet
    when the process got :data:`QUIET_CPU_SHARE` of one thread's time in the best round."""
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(2, 8, generator=gen), torch.randn(2, 1, generator=gen)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

    for _ in range(5):
        step()
    ops = count_kernels(step)
    best, share = math.inf, 0.0
    for _ in range(max(1, rounds)):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(max(1, steps)):
            step()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        if wall / steps < best:
            best, share = wall / steps, min(1.0, cpu / wall) if wall > 0 else 1.0
    return Dispatch(seconds=best / max(1, ops), ops=ops, quiet=share >= QUIET_CPU_SHARE)


@dataclass(frozen=True)
class ConvSetup:
    """The part of a convolution's forward and backward on this CPU that does not grow with the batch, in seconds per
    byte of its weight (in the dtype measured), and whether this process got its threads' CPU time while it was
    timed."""

    seconds_per_byte: float
    quiet: bool


#: (input channels, output channels, kernel) of the convolutions :func:`measure_conv_setup` times: ResNets' 3x3
#: convolutions of each stage and a bottleneck's 1x1 pair, where the weights of image networks are
CONV_SETUP_SHAPES = ((64, 64, 3), (128, 128, 3), (256, 256, 3), (512, 512, 3), (256, 1024, 1), (1024, 256, 1))


@on_real_tensors()
def measure_conv_setup(
    dtype: torch.dtype = torch.float32, repeats: int = 10, rounds: int = 3, seconds: float = 15.0, size: int = 4
) -> ConvSetup:
    """What a 2-D convolution's forward and backward cost on this CPU whatever the batch, per byte of its weight: on a
    CPU, oneDNN reorders each weight into its blocked layouts every call (once for the forward, once for the data
    gradient) and the weight gradient back, work that depends on the weight alone (``ONEDNN_VERBOSE=1`` lists the
    reorders beside each convolution). Each of :data:`CONV_SETUP_SHAPES` is timed (forward and backward, ``size`` x
    ``size`` px, weights in ``dtype``) at batch 2 and 4, the batches interleaved, ``repeats`` pairs in each of
    ``rounds`` rounds over the shapes (a slow spell of the machine touches them all alike); its part that does not
    grow with the batch is the line's intercept, ``2 t(2) - t(4)``, of the medians; the result is the intercepts'
    sum over the weights' bytes (each shape weighted by its weight, as a network's large layers weigh most).

    Where the reorders' buffers come from moves the figure: a process that has taken and freed a block of tens of
    MiB gets them from glibc's heap, at about half the float32 figure of a fresh process, which maps fresh pages for
    each. Inside a Lightning ResNet-18 run the figure is a fresh process's (docs/whatif.md), so
    :func:`~lit_compute.hardware.this_machine.conv_setup_seconds` measures in one. Bounded in time on a CPU whose
    bf16 is slow: a shape stops repeating in a round after ``seconds`` / (shapes x rounds) once it has three timed
    pairs. Quiet as :func:`measure_dispatch`."""
    gen = torch.Generator().manual_seed(0)
    convs = [torch.nn.Conv2d(cin, cout, k, padding=k // 2).to(dtype) for cin, cout, k in CONV_SETUP_SHAPES]
    inputs = [
        {n: torch.randn(n, conv.in_channels, size, size, generator=gen).to(dtype).requires_grad_() for n in (2, 4)}
        for conv in convs
    ]
    times: list[dict[int, list[float]]] = [{2: [], 4: []} for _ in convs]
    budget = seconds / len(convs) / max(1, rounds)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(max(1, rounds)):
        for conv, batches, timed in zip(convs, inputs, times):
            start = time.perf_counter()
            for i in range(max(3, repeats) + 1):
                if i > 3 and time.perf_counter() - start > budget:
                    break
                for n, x in batches.items():
                    t0 = time.perf_counter()
                    conv(x).sum().backward()
                    if i:  # the first of a round is a warm-up
                        timed[n].append(time.perf_counter() - t0)
    fixed = sum(max(0.0, 2 * _median(timed[2]) - _median(timed[4])) for timed in times)
    weights = sum(conv.weight.numel() * conv.weight.element_size() for conv in convs)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    share = min(1.0, cpu / (wall * max(1, torch.get_num_threads()))) if wall > 0 else 1.0
    return ConvSetup(seconds_per_byte=fixed / weights, quiet=share >= QUIET_CPU_SHARE)
