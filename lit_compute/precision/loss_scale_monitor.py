"""LossScaleMonitor: the GradScaler's loss scale and the optimizer steps it skipped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import torch
from typing_extensions import override

from lit_compute._compat import grad_scaler_scale_tensor
from lit_compute._validate import Check, validated
from lit_compute.callback import MeasuringCallback
from lit_compute.timeline import LogEvent, StepRecord

if TYPE_CHECKING:
    import lightning.pytorch as pl


_FP16_SMALLEST = 2.0**-24  # float16's smallest subnormal: a scale below it flushes every scaled gradient to 0


class LossScaleMonitor(MeasuringCallback):
    """Logs the dynamic loss scale of fp16 mixed precision and how many optimizer steps were skipped.

    A GradScaler skips the optimizer step when it finds inf/NaN gradients and then lowers the scale by its
    backoff factor; a skipped step is counted as an optimizer step after which the scale went down, or stayed at
    0 (a scale that underflowed to 0 skips every step; one warning says so as soon as the scale falls below
    float16's smallest subnormal, 2^-24, where the run can no longer learn). After
    every step (an optimizer step, once per accumulation cycle, after ``scaler.update()``; see
    :mod:`lit_compute.timeline`) the scale tensor is copied on the device (no sync); the copies are read only
    at logging steps, since reading the scale forces a device sync. Steps not yet counted when a checkpoint is
    saved are counted into it, and the last scale is saved too, so a resumed run counts exactly. With bf16 or
    fp32 there is no scaler and it logs nothing, silently (that is expected); under ``16-mixed`` without a
    scaler it says so once.

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

    @validated
    def __init__(self, log_every_n_steps: Annotated[int | None, Check(ge=1)] = None) -> None:
        super().__init__()
        self.log_every_n_steps = log_every_n_steps
        self.skipped_steps = 0
        self.optimizer_steps = 0
        self._scaler: Any = None
        self._last: torch.Tensor | None = None
        self._pending: list[torch.Tensor] = []

    @override
    def state_dict(self) -> dict[str, Any]:
        self._count_pending()  # steps not yet counted at a checkpoint are counted into it
        last = float(self._last.float().cpu().reshape(())) if self._last is not None else None
        return {"skipped_steps": self.skipped_steps, "optimizer_steps": self.optimizer_steps, "last_scale": last}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))
        self.optimizer_steps = int(state_dict.get("optimizer_steps", 0))
        last = state_dict.get("last_scale")
        self._last = torch.tensor(float(last)) if last is not None else None
        self._pending.clear()

    @override
    def _train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._scaler = getattr(trainer.precision_plugin, "scaler", None)
        self._pending.clear()
        if self._scaler is None or not hasattr(self._scaler, "get_scale"):
            self._scaler = None
            if str(trainer.precision).startswith("16"):
                self._warn_once(
                    "no-scaler",
                    f"LossScaleMonitor: precision={trainer.precision!r} runs without a "
                    "GradScaler, so there is no loss scale to log; it logs nothing.",
                )
            return
        if self._last is not None:  # resumed: compare the first steps with the scale saved at the checkpoint
            return
        scale = grad_scaler_scale_tensor(self._scaler)
        # before the first step the scaler holds no tensor yet and get_scale() is the initial scale (no sync)
        self._last = scale.detach().clone() if scale is not None else torch.tensor(float(self._scaler.get_scale()))

    @override
    def _step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, record: StepRecord) -> None:
        if self._scaler is None:
            return
        scale = grad_scaler_scale_tensor(self._scaler)
        if scale is not None:
            self._pending.append(scale.detach().clone())  # a device copy, no sync

    @override
    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, event: LogEvent) -> None:
        if self._scaler is None or not self._pending:
            return
        latest = self._pending[-1]
        self._count_pending()
        event.log(
            {
                "amp/loss_scale": float(latest.float().cpu().reshape(())),
                "amp/skipped_steps": float(self.skipped_steps),
                "amp/skipped_step_fraction": self.skipped_steps / max(1, self.optimizer_steps),
            }
        )

    def _count_pending(self) -> None:
        """Count the steps since the last count: a step after which the scale went down was skipped (one sync)."""
        if not self._pending:
            return
        scales = torch.stack([s.reshape(()).float().cpu() for s in self._pending])
        previous = self._last.float().cpu().reshape(()) if self._last is not None else scales[0]
        chain = torch.cat([previous.reshape(1), scales])
        # a step was skipped when the scale went down, or when it is 0 and can go down no further (0 x loss
        # gives gradients that unscale to NaN: every step is skipped from then on)
        self.skipped_steps += int(((chain[1:] < chain[:-1]) | (chain[1:] == 0)).sum())
        self.optimizer_steps += len(self._pending)
        self._last = self._pending[-1]
        self._pending = []
        latest = float(scales[-1])
        if latest < _FP16_SMALLEST:
            self._warn_once(
                "collapsed",
                f"LossScaleMonitor: the loss scale collapsed to {latest:.3g} (below float16's "
                "smallest subnormal, 2^-24): every scaled gradient underflows to zero and each optimizer "
                "step is skipped, so the run can no longer learn. Look for inf/NaN in the loss or the "
                "gradients (a learning rate too high, a log of 0, a division by 0).",
            )
