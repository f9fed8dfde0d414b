"""Shapes of the few ops whose fake-tensor (meta) kernel refuses inputs their CPU kernel takes, so a traced step can
follow the memory of a model that uses them: each fallback builds the op's result from its arguments' shapes alone.

``torch._grouped_mm`` (the grouped matmul of transformers' mixture-of-experts layers): its meta kernel asks for
bfloat16 operands, the CPU kernel takes float32 too (a Mixtral under CPU autocast sends float32 to it).

Floor 0: imports only ``_compat``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lit_compute import _compat

__all__ = ["fake_fallback"]


def _grouped_mm(a: Any, b: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> torch.Tensor | None:
    """``_grouped_mm``'s result for the layouts a mixture of experts uses: tokens x experts' weights (2-D x 3-D),
    expert by expert (3-D x 3-D), and the weights' gradient (2-D x 2-D with ``offs``: one product per group); None
    for 16-bit operands, which the meta kernel takes itself."""
    if a.dtype in (torch.bfloat16, torch.float16):
        return None
    if a.dim() == 2 and b.dim() == 3:
        shape: tuple[int, ...] = (a.shape[0], b.shape[-1])
    elif a.dim() == 3 and b.dim() == 3:
        shape = (a.shape[0], a.shape[1], b.shape[-1])
    elif a.dim() == 2 and b.dim() == 2 and offs is not None:
        shape = (offs.shape[0], a.shape[0], b.shape[-1])
    else:
        return None
    return torch.empty(shape, dtype=out_dtype or a.dtype, device=a.device)


def _fallbacks() -> dict[Any, Callable[..., torch.Tensor | None]]:
    op = getattr(torch.ops.aten, "_grouped_mm", None)
    return {op.default: _grouped_mm} if op is not None else {}


_FALLBACKS = _fallbacks()


def fake_fallback(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The result of ``func`` on fake tensors built from shapes, for an op whose meta kernel would refuse them; None
    when ``func`` has no fallback, no argument is a fake tensor, or the inputs are ones the meta kernel takes."""
    fallback = _FALLBACKS.get(func)
    if fallback is None:
        return None
    # the fake mode takes real inputs beside fake ones (a step's offsets made outside it); one fake operand is enough
    if not any(_compat.is_fake_tensor(t) for t in (*args, *kwargs.values())):
        return None
    return fallback(*args, **kwargs)
