"""Each GEMM of a step priced on a GPU's SMs: its output cut into tiles, the tiles run in waves of one tile per SM, a
wave as long as one tile's multiply-adds at the SM's share of the peak; a kernel's time the larger of that and its
bytes at the attainable bandwidth. What a fraction of the peak per op class cannot see: a 3x3 convolution with 512
channels fills every SM, a weight gradient with 64 output channels fills a few unless its reduction is split, a
GEMM of 130 tiles on 108 SMs runs two waves.

The tiles are those cuBLAS and cuDNN choose among (CUTLASS's threadblock shapes; :data:`TILES`), the smallest time
taken, as their heuristics aim to: a small tile wastes less of the last wave but loads more operand bytes per
multiply-add, so it runs each SM below its peak (:func:`tile_rate`). The reduction may be split (split-K) when the
tiles are too few to fill the SMs.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from lit_compute.flops.kernel_shapes import KernelShape

__all__ = ["TILES", "KernelWork", "quantized", "scaled_kernels", "tile_rate"]

#: the tile shapes (rows x columns of the output) a GEMM is cut into, by the cores it runs on: tensor cores (16-bit and
#: TF32, every generation since Volta: CUTLASS's default threadblock tiles for SM70-SM90) and the FP32 units (SIMT)
TILES = {
    "tensor": ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64)),
    "simt": ((128, 128), (128, 64), (64, 128), (64, 64), (32, 64)),
}
#: a tile reaches the SM's peak from this many multiply-adds per operand element loaded (tm x tn / (tm + tn)): a
#: 128 x 128 tile on tensor cores, 64 x 64 on the FP32 units; a smaller tile runs in proportion below it
FULL_RATE_INTENSITY = {"tensor": 64.0, "simt": 32.0}
#: how far a reduction is split to fill the SMs (split-K), each part at least this long
SPLITS, MIN_SPLIT_K = (1, 2, 4, 8, 16), 256


class KernelWork(NamedTuple):
    """One class-and-shape of kernels at the target: FLOPs (as counted) and the bytes their operands and result hold
    at the target's precision, with the FLOPs they take on the SMs once their tiles and waves are counted."""

    flops: float
    bytes: float
    quantized: float


def tile_rate(tm: int, tn: int, cores: str) -> float:
    """The fraction of an SM's peak a ``tm`` x ``tn`` tile runs at (1 for a tile of full intensity and above)."""
    return min(1.0, tm * tn / (tm + tn) / FULL_RATE_INTENSITY[cores])


def quantized(m: int, n: int, k: int, b: int, sms: int, cores: str, attention: bool = False) -> float:
    """The multiply-adds a GEMM of ``b`` products of ``m`` x ``k`` by ``k`` x ``n`` costs on ``sms`` SMs, its
    best tile and split counted: every wave as long as its slowest SM's tile. A fused attention kernel is tiled by
    128 query rows with the head's width whole (flash attention's blocks)."""
    best = math.inf
    tiles = ((128, 64 * math.ceil(n / 64)),) if attention else TILES[cores]
    for tm, tn in tiles:
        rate = 1.0 if attention else tile_rate(tm, tn, cores)
        count = b * math.ceil(m / tm) * math.ceil(n / tn)
        for split in SPLITS:
            if split > 1 and (k / split < MIN_SPLIT_K or attention):
                break
            waves = math.ceil(count * split / sms)
            best = min(best, waves * sms * tm * tn * math.ceil(k / split) / rate)
    return best


@functools.lru_cache(maxsize=4096)
def _factor(m: int, n: int, k: int, b: int, sms: int, cores: str, attention: bool) -> float:
    return quantized(m, n, k, b, sms, cores, attention) / max(1, m * n * k * b)


@functools.lru_cache(maxsize=1024)
def scaled_kernels(
    kernels: tuple[KernelShape, ...], kind: str, ratio: float, value_bytes: float, sms: int | None, cores: str
) -> tuple[KernelWork, ...]:
    """The kernels of class ``kind`` at ``ratio`` times the counted micro-batch (each shape's batch dimension
    scaled), their operands at ``value_bytes`` a value, quantized on ``sms`` SMs (not at all without an SM count:
    the FLOPs as counted). Cached: a fit prices the same run on the same chip thousands of times."""
    out = []
    for shape in kernels:
        if shape.kind != kind:
            continue
        dims = {"m": shape.m, "n": shape.n, "k": shape.k, "b": shape.b}
        if shape.scale in dims:
            dims[shape.scale] = max(1, round(dims[shape.scale] * ratio))
        m, n, k, b = dims["m"], dims["n"], dims["k"], dims["b"]
        flops = shape.flops * ratio
        moved = shape.calls * value_bytes * b * (m * k + k * n + m * n)
        # grouped convolutions run cuDNN's own kernels, not one GEMM tile per group: their fraction holds them
        factor = 1.0 if not sms or kind == "conv_grouped" else _factor(m, n, k, b, sms, cores, kind == "attention")
        out.append(KernelWork(flops, moved, flops * factor))
    return tuple(out)
