"""Your own measuring callback: a gradient-norm monitor that joins lit_compute's logging event and all-reduce.

Subclass :class:`lit_compute.MeasuringCallback`, declare what goes into the one all-reduce (``reduce_keys``) and
log in ``_log``: the norm lands in the same ``log_metrics`` call, at the same step, as ``compute/*`` and
``time/*``; on many ranks it rides in the same all-reduce as FlopsLogger's TFLOP/s (no collective of its own,
so it can never hang a run), and a failure in it warns once and turns it off, never the training.

Run: ``python examples/grad_norm_monitor.py`` (CPU, a few seconds), then
``tensorboard --logdir lightning_logs``.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from typing_extensions import override

from lit_compute import FlopsLogger, MeasuringCallback, StepTimeMonitor
from lit_compute.callback import guarded
from lit_compute.timeline import LogEvent


class GradNormMonitor(MeasuringCallback):
    """The L2 norm of all gradients before the optimizer step, averaged over ranks.

    The norm stays a device tensor between logging steps (no synchronisation per step); it is read at logging
    steps only.

    Logged metrics:
        - ``train/grad_norm``: the gradient norm of the logging step, mean over ranks.

    Args:
        log_every_n_steps: Log every n steps (default: the trainer's ``log_every_n_steps``).
    """

    reduce_keys = {"train": ("grad_norm",)}

    def __init__(self, log_every_n_steps: int | None = None) -> None:
        super().__init__()
        self.log_every_n_steps = log_every_n_steps
        self.local: dict[int, float] = {}  # this rank's norm at each logging step
        self._norm: torch.Tensor | None = None

    @override
    @guarded  # a hook the base does not route: guarded the same way
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        grads = [p.grad.detach() for p in pl_module.parameters() if p.grad is not None]
        self._norm = (
            torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])) if grads else None
        )

    @override
    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, event: LogEvent) -> None:
        local = float(self._norm) if self._norm is not None else math.nan  # NaN: this rank knows nothing
        self.local[event.step] = local
        world = trainer.world_size

        def finish(sums: dict[str, float]) -> dict[str, float]:
            total = sums.get("grad_norm", math.nan)
            return {"train/grad_norm": total / world} if math.isfinite(total) else {}

        event.contribute(self, {"grad_norm": local}, finish)


def main(root: str = "lightning_logs", max_steps: int = 20) -> GradNormMonitor:
    monitor = GradNormMonitor(log_every_n_steps=5)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        log_every_n_steps=5,
        default_root_dir=root,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[FlopsLogger(peak="none"), StepTimeMonitor(), monitor],
    )
    trainer.fit(BoringModel())
    for step, norm in monitor.local.items():
        print(f"step {step}: train/grad_norm {norm:.4f}")
    return monitor


if __name__ == "__main__":
    main()
