"""The GEMM shape of each heavy op a step runs: what ``lit-compute whatif`` prices kernel by kernel, as tiles and
waves on a target GPU's SMs (:mod:`lit_compute.planning.whatif.parts.kernels`).

A matmul is its own GEMM; a convolution is priced as the implicit GEMM cuDNN runs (the forward, the data gradient
and the weight gradient each a GEMM of their own); a fused attention kernel as a batched GEMM over its heads. Each
shape says which of its dimensions grows with the micro-batch, so a run counted at one micro-batch is priced at
another.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

__all__ = ["GEMM_CLASSES", "GemmShape", "KernelShape", "gemm_shapes"]

#: the op classes whose ops are GEMMs and run on tensor cores where a chip has them (a depthwise convolution is
#: neither: bandwidth-bound, no tensor-core tiles)
GEMM_CLASSES = ("matmul", "conv", "conv_grouped", "attention")

#: which dimension of a shape grows with the micro-batch: ``m`` (a matmul's rows, a convolution's output pixels),
#: ``k`` (a weight gradient's reduction over the batch), ``b`` (the heads of a batched matmul) or none
SCALES = ("m", "k", "b", "")


class GemmShape(NamedTuple):
    """One GEMM: ``b`` independent products of an ``m`` x ``k`` and a ``k`` x ``n`` matrix; ``scale`` the dimension
    that grows with the micro-batch (:data:`SCALES`)."""

    m: int
    n: int
    k: int
    b: int
    scale: str


class KernelShape(NamedTuple):
    """Kernels of one op class and one GEMM shape in a counted batch: how many ran (``calls``), and their hardware
    FLOPs and the bytes they read and wrote (summed over the calls)."""

    kind: str
    m: int
    n: int
    k: int
    b: int
    scale: str
    calls: int
    flops: float
    bytes: float

    @classmethod
    def of(cls, value: Any) -> KernelShape:
        """A run record's list ``[kind, m, n, k, b, scale, calls, flops, bytes]``."""
        kind, m, n, k, b, scale, calls, flops, moved = value
        return cls(str(kind), int(m), int(n), int(k), int(b), str(scale), int(calls), float(flops), float(moved))


def _op(name: str) -> str:
    return name.split("::")[-1].split(".")[-2 if name.count(".") >= 2 else -1]


def _transposed(t: Any) -> bool:
    """Whether a 2-D operand is a transposed view (column-major): a weight gradient's ``input.t() @ grad``."""
    return isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[0] > 1 and t.stride(0) == 1 and t.stride(1) != 1


def gemm_shapes(name: str, args: Any, out: Any, backward: bool) -> list[GemmShape]:
    """The GEMMs one op runs (empty for an op that is not a matmul, a convolution or a fused attention kernel, or
    whose arguments are not as expected); ``backward``: the op runs in the backward pass (a weight gradient's matmul
    reduces over the batch)."""
    op = _op(name)
    try:
        if op in ("mm", "addmm"):
            a, w = (args[0], args[1]) if op == "mm" else (args[1], args[2])
            m, k = a.shape
            scale = "k" if backward and _transposed(a) else "m"
            return [GemmShape(int(m), int(w.shape[1]), int(k), 1, scale)]
        if op in ("bmm", "baddbmm"):
            a, w = (args[0], args[1]) if op == "bmm" else (args[1], args[2])
            b, m, k = a.shape
            return [GemmShape(int(m), int(w.shape[2]), int(k), int(b), "b")]
        if op in ("convolution", "_convolution"):
            return _conv_forward(args, out)
        if op == "convolution_backward":
            return _conv_backward(args)
        if "attention" in op and isinstance(args[0], torch.Tensor) and args[0].dim() == 4:
            q, key = args[0], args[1]
            heads, lq, d = q.shape[0] * q.shape[1], q.shape[2], q.shape[3]
            factor = 2.5 if "backward" in op else 1.0  # the backward recomputes the scores and makes three gradients
            # the two products (q k^T, then p v) as one GEMM of the kernel's tiles: lq rows of d, reduced over 2 lk
            return [GemmShape(int(lq), int(d), int(round(2 * factor * key.shape[2])), int(heads), "b")]
    except (AttributeError, IndexError, TypeError, ValueError):
        return []
    return []


def _conv_forward(args: Any, out: Any) -> list[GemmShape]:
    """A convolution's forward as cuDNN's implicit GEMM: output pixels x output channels per group, reduced over a
    group's input channels x the kernel window; one GEMM per group."""
    weight, groups = args[1], int(args[8])
    transposed = bool(args[6])
    window = math.prod(weight.shape[2:])
    if transposed:  # weight (in, out / groups, *window): the data gradient of the convolution it inverts
        cout, cin = weight.shape[1] * groups, weight.shape[0]
    else:
        cout, cin = weight.shape[0], weight.shape[1] * groups
    pixels = out.shape[0] * math.prod(out.shape[2:])
    return [GemmShape(int(pixels), int(cout // groups), int(cin // groups * window), groups, "m")]


def _conv_backward(args: Any) -> list[GemmShape]:
    """A convolution's backward: the data gradient (input pixels x input channels per group, reduced over the output
    channels x window) and the weight gradient (output channels x input channels x window per group, reduced over
    the batch's output pixels), as its ``output_mask`` asks."""
    grad, x, weight, groups, mask = args[0], args[1], args[2], int(args[9]), args[10]
    window = math.prod(weight.shape[2:])
    transposed = bool(args[7])
    cout, cin = (
        (weight.shape[1] * groups, weight.shape[0]) if transposed else (weight.shape[0], weight.shape[1] * groups)
    )
    shapes = []
    if mask[0]:
        pixels = x.shape[0] * math.prod(x.shape[2:])
        shapes.append(GemmShape(int(pixels), int(cin // groups), int(cout // groups * window), groups, "m"))
    if mask[1]:
        pixels = grad.shape[0] * math.prod(grad.shape[2:])
        shapes.append(GemmShape(int(cout // groups), int(cin // groups * window), int(pixels), groups, "k"))
    return shapes
