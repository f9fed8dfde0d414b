"""Ops whose meta kernel refuses what their CPU kernel takes are followed on fake tensors from their shapes."""

from __future__ import annotations

import pytest
import torch

from lit_compute import _compat
from lit_compute.memory.fake_shapes import fake_fallback
from lit_compute.memory.tracker import StorageTracker

grouped_mm = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no grouped matmul")


@grouped_mm
def test_a_float32_grouped_matmul_is_traced_forward_and_backward_as_the_cpu_runs_it():
    """A mixture of experts under CPU autocast sends float32 to ``torch._grouped_mm``, whose CPU kernel takes it and
    whose meta kernel does not: traced on fake tensors, the step's results and gradients get the CPU's shapes and
    the tracker counts them."""
    offs = torch.tensor([3, 6], dtype=torch.int32)
    a, b = torch.randn(6, 8, requires_grad=True), torch.randn(2, 8, 4, requires_grad=True)
    real = torch._grouped_mm(a, b, offs)
    real.backward(torch.ones_like(real))  # a dense gradient: the CPU kernel refuses an expanded one
    fake_mode = _compat.fake_tensor_mode()
    with fake_mode:
        fa, fb = torch.randn(6, 8, requires_grad=True), torch.randn(2, 8, 4, requires_grad=True)
        with pytest.raises(RuntimeError, match="mat_a"):  # the meta kernel alone refuses float32
            torch._grouped_mm(fa, fb, offs)
        with StorageTracker() as tracker:
            out = torch._grouped_mm(fa, fb, offs)
            out.backward(torch.ones_like(out))
    assert (out.shape, out.dtype) == (real.shape, real.dtype)
    assert (fa.grad.shape, fb.grad.shape) == (a.grad.shape, b.grad.shape)
    assert tracker.breakdown().peak >= 4 * (6 * 4 + 6 * 8 + 2 * 8 * 4)  # the result and both gradients at least


@grouped_mm
def test_the_fallback_leaves_real_tensors_and_16_bit_operands_to_torch():
    offs = torch.tensor([3, 6], dtype=torch.int32)
    op = torch.ops.aten._grouped_mm.default
    assert fake_fallback(op, (torch.randn(6, 8), torch.randn(2, 8, 4), offs), {}) is None
    with _compat.fake_tensor_mode():
        half = (torch.randn(6, 8, dtype=torch.bfloat16), torch.randn(2, 8, 4, dtype=torch.bfloat16), offs)
        assert fake_fallback(op, half, {}) is None
        assert fake_fallback(torch.ops.aten.mm.default, (torch.randn(2, 2), torch.randn(2, 2)), {}) is None
