"""``Float32MatmulPrecision``: float32 matmuls and convolutions on TF32 tensor cores, from a config line."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

__all__ = ["Float32MatmulPrecision"]

_CHOICES = ("highest", "high", "medium")


class Float32MatmulPrecision(Callback):
    """Set ``torch.set_float32_matmul_precision(precision)`` for the run, and cuDNN's TF32 switch with it (on unless
    ``"highest"``), restoring both at ``teardown``.

    ``"high"`` lets float32 matmuls run on TF32 tensor cores (Ampere and later: inputs rounded to 10 mantissa bits,
    float32 accumulation), what Lightning's hint on a tensor-core GPU asks for; convolutions follow
    ``torch.backends.cudnn.allow_tf32``. On a CPU the setting changes nothing torch documents. ``lit-compute tune``
    writes it into a tuned config as its ``tf32`` knob.

    Args:
        precision: ``"highest"``, ``"high"`` or ``"medium"`` (torch's names).

    Example:
        >>> import lightning.pytorch as pl
        >>> trainer = pl.Trainer(callbacks=[Float32MatmulPrecision("high")], accelerator="cpu", max_steps=1)
    """

    def __init__(self, precision: str = "high") -> None:
        if precision not in _CHOICES:
            raise ValueError(
                f"Float32MatmulPrecision(precision={precision!r}): give one of {', '.join(_CHOICES)} "
                "(torch.set_float32_matmul_precision's names; 'high' for TF32)"
            )
        self.precision = precision
        self._before: tuple[str, bool] | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._before is None:
            self._before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
        torch.set_float32_matmul_precision(self.precision)
        torch.backends.cudnn.allow_tf32 = self.precision != "highest"

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._before is not None:
            torch.set_float32_matmul_precision(self._before[0])
            torch.backends.cudnn.allow_tf32 = self._before[1]
            self._before = None
