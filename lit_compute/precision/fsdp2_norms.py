"""FSDP2 (``fully_shard``) with low-precision parameters and float32 norms: the FSDP2 counterpart of
:class:`~lit_compute.precision.FP32BatchNormFSDPPrecision`, for ``configure_model`` under Lightning's
``ModelParallelStrategy``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lit_compute.precision.fp32_batchnorm_precision import check_fp32_norms, is_fp32_norm

_DEFAULT_NORMS = ["BatchNorm", "LayerNorm", "GroupNorm", "RMSNorm"]
_LOW = (torch.bfloat16, torch.float16)


def fully_shard_fp32_norms(
    module: nn.Module,
    mesh: Any = None,
    *,
    param_dtype: torch.dtype = torch.bfloat16,
    reduce_dtype: torch.dtype = torch.float32,
    blocks: Sequence[nn.Module] = (),
    fp32_norms: Sequence[str] | None = None,
    **fully_shard_kwargs: Any,
) -> nn.Module:
    """Apply FSDP2's ``fully_shard`` to ``module`` with a ``MixedPrecisionPolicy`` in ``param_dtype`` while every
    norm module keeps float32 parameters *and* computes in float32.

    Each norm (every ``_BatchNorm``, and classes whose name contains one of ``fp32_norms``: by default
    BatchNorm, LayerNorm, GroupNorm, RMSNorm - Hugging Face's ``LlamaRMSNorm`` included) becomes its own
    ``fully_shard`` unit with ``MixedPrecisionPolicy(param_dtype=float32, reduce_dtype=float32,
    output_dtype=param_dtype)``: its input is cast to float32 on the way in and its output back to
    ``param_dtype``, so the layers after it see the dtype they expect. Then each of ``blocks`` (the transformer
    blocks or stages you would shard one by one) and finally ``module`` are sharded with
    ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``. Call it from ``configure_model``, after any tensor-parallel
    plan, with ``mesh=self.device_mesh["data_parallel"]``, and train with ``precision="32-true"`` (the policy
    does the casting; an autocast plugin on top would recast).

    Args:
        module: The model (or the part of it to shard).
        mesh: The data-parallel device mesh (None: FSDP2's default, all ranks).
        param_dtype: The dtype of every other parameter in forward and backward (``torch.bfloat16`` or
            ``torch.float16``).
        reduce_dtype: The dtype gradients are reduced in.
        blocks: Submodules to shard as their own units before the root (largest first is not needed: any order).
        fp32_norms: Class-name fragments of the norms kept in float32 (None: the four above).
        **fully_shard_kwargs: Passed to every ``fully_shard`` call (``reshard_after_forward``, ...).

    Returns:
        ``module``, sharded.

    Raises:
        ValueError: ``param_dtype`` is not a 16-bit float, or ``fp32_norms`` is not a list of class names.
    """
    if param_dtype not in _LOW:
        raise ValueError(
            f"fully_shard_fp32_norms(param_dtype={param_dtype}) must be torch.bfloat16 or torch.float16 "
            "(with float32 parameters there is nothing to keep in float32: call fully_shard directly)"
        )
    names = check_fp32_norms("fully_shard_fp32_norms", list(fp32_norms) if fp32_norms is not None else _DEFAULT_NORMS)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    norm_policy = MixedPrecisionPolicy(
        param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=param_dtype, cast_forward_inputs=True
    )
    low_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for sub in module.modules():
        if sub is not module and is_fp32_norm(sub, names) and any(True for _ in sub.parameters(recurse=False)):
            fully_shard(sub, mesh=mesh, mp_policy=norm_policy, **fully_shard_kwargs)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=low_policy, **fully_shard_kwargs)
    fully_shard(module, mesh=mesh, mp_policy=low_policy, **fully_shard_kwargs)
    return module
