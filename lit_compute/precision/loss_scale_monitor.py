"""LossScaleMonitor: the GradScaler's loss scale and the optimizer steps it skipped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from lit_compute._compat import grad_scaler_scale_tensor
from lit_compute._utils import MeasuringCallback, guarded, log_scalars, resolve_every

if TYPE_CHECKING:
    import lightning.pytorch as pl


class LossScaleMonitor(MeasuringCallback):
    """Logs the dynamic loss scale of fp16 mixed precision and how many optimizer steps were skipped.

    A GradScaler skips the optimizer step when it finds inf/NaN gradients and then lowers the scale by its
    backoff factor; a skipped step is counted as an optimizer step after which the scale went down. After
    every optimizer step (once per accumulation cycle, after ``scaler.update()``) the scale tensor is copied
    on the device (no sync);
    the copies are read only at logging steps, since reading the scale forces a device sync. With no scaler
    (bf16, fp32) it logs nothing and says so once.

    Logged metrics:
        - ``amp/loss_scale``: the current loss scale.
        - ``amp/skipped_steps``: optimizer steps skipped so far because of inf/NaN gradients (cumulative).
        - ``amp/skipped_step_fraction``: ``skipped_steps`` / optimizer steps so far.

    Args:
        log_every_n_steps: Log every n optimizer steps (default: the trainer's ``log_every_n_steps``).

    Example:
        >>> import lightning.pytorch as pl
        >>> trainer = pl.Trainer(callbacks=[LossScaleMonitor()], precision="16-mixed", accelerator="cpu", max_steps=1)
    """

    def __init__(self, log_every_n_steps: int | None = None) -> None:
        super().__init__()
        if log_every_n_steps is not None and log_every_n_steps < 1:
            raise ValueError(f"LossScaleMonitor(log_every_n_steps={log_every_n_steps}) must be >= 1 or None")
        self.log_every_n_steps = log_every_n_steps
        self.skipped_steps = 0
        self.optimizer_steps = 0
        self._scaler: Any = None
        self._last: torch.Tensor | None = None
        self._pending: list[torch.Tensor] = []

    def state_dict(self) -> dict[str, Any]:
        return {"skipped_steps": self.skipped_steps, "optimizer_steps": self.optimizer_steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))
        self.optimizer_steps = int(state_dict.get("optimizer_steps", 0))

    @guarded
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._scaler = getattr(trainer.precision_plugin, "scaler", None)
        self._pending.clear()
        if self._scaler is None or not hasattr(self._scaler, "get_scale"):
            self._scaler = None
            self._warn_once(
                "no-scaler",
                f"LossScaleMonitor: precision={trainer.precision!r} uses no GradScaler (only '16-mixed' does), "
                "so there is no loss scale to log; it logs nothing.",
            )
            return
        scale = grad_scaler_scale_tensor(self._scaler)
        # before the first step the scaler holds no tensor yet and get_scale() is the initial scale (no sync)
        self._last = scale.detach().clone() if scale is not None else torch.tensor(float(self._scaler.get_scale()))

    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._step_before = trainer.global_step

    @guarded
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._scaler is None:
            return
        if trainer.global_step > getattr(self, "_step_before", trainer.global_step):  # an optimizer step ran
            scale = grad_scaler_scale_tensor(self._scaler)
            if scale is not None:
                self._pending.append(scale.detach().clone())  # a device copy, no sync
        if not self._pending or trainer.global_step % resolve_every(trainer, self.log_every_n_steps) != 0:
            return
        scales = torch.stack([s.reshape(()) for s in self._pending]).float().cpu()  # one sync, on logging steps
        previous = self._last.float().cpu().reshape(()) if self._last is not None else scales[0]
        chain = torch.cat([previous.reshape(1), scales])
        self.skipped_steps += int((chain[1:] < chain[:-1]).sum())
        self.optimizer_steps += len(self._pending)
        self._last = self._pending[-1]
        self._pending.clear()
        log_scalars(trainer, {
            "amp/loss_scale": float(scales[-1]),
            "amp/skipped_steps": float(self.skipped_steps),
            "amp/skipped_step_fraction": self.skipped_steps / max(1, self.optimizer_steps),
        })
