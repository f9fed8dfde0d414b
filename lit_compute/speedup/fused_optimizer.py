"""``FusedOptimizer``: torch's fused optimizer kernels for optimizers a LightningModule builds itself."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

# where torch has fused kernels for Adam, AdamW, SGD, Adagrad (torch.utils._foreach_utils)
_FUSED_DEVICES = ("cpu", "cuda", "mps", "xpu")


def fusable(optimizer: torch.optim.Optimizer) -> str | None:
    """None when ``optimizer`` can switch to its fused implementation, else the reason it cannot."""
    groups = optimizer.param_groups
    if not groups or "fused" not in groups[0]:
        return f"{type(optimizer).__name__} has no fused implementation"
    if any(g.get("differentiable") for g in groups):
        return f"{type(optimizer).__name__}(differentiable=True) cannot be fused"
    for group in groups:
        for p in group["params"]:
            if not p.is_floating_point() or p.device.type not in _FUSED_DEVICES:
                return f"a parameter of dtype {p.dtype} on {p.device.type} has no fused kernel"
    return None


class FusedOptimizer(Callback):
    """Switch the trainer's optimizers to torch's fused kernels (``fused=True``) at ``on_train_start``.

    ``configure_optimizers`` is user code, so a config cannot pass ``fused=True`` to the optimizer it builds;
    this callback sets it on every parameter group of each optimizer that has a fused implementation
    (``Adam``, ``AdamW``, ``SGD``, ``Adagrad`` on CPU and CUDA) after Lightning built the optimizers and
    restored any checkpoint. One kernel then updates all parameters of a group instead of one launch (or one
    loop) per tensor. The update is the same arithmetic; only the order of floating-point operations differs.
    Optimizers without a fused implementation are left as they are, with one warning saying why.

    Example:
        >>> import lightning.pytorch as pl
        >>> trainer = pl.Trainer(callbacks=[FusedOptimizer()], accelerator="cpu", max_steps=1)
    """

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for optimizer in trainer.optimizers:
            reason = fusable(optimizer)
            if reason is not None:
                rank_zero_warn(f"FusedOptimizer: {reason}; it keeps its own implementation.", category=UserWarning)
                continue
            optimizer.defaults.update(fused=True, foreach=False)
            for group in optimizer.param_groups:
                group["fused"], group["foreach"] = True, False
