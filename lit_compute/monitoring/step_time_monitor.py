"""StepTimeMonitor: where training step time goes (waiting for data vs computing), and what to do about it."""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.utilities.data import extract_batch_size

from lit_compute._utils import (
    MeasuringCallback,
    available_cpu_cores,
    guarded,
    log_scalars,
    log_text,
    resolve_every,
)

if TYPE_CHECKING:
    import lightning.pytorch as pl


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class _Marks:
    """Per-step time marks: host clock on CPU, CUDA events (read later, at logging steps) on GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        if self.cuda:
            end.synchronize()
            return float(start.elapsed_time(end))
        return (end - start) * 1e3


class StepTimeMonitor(MeasuringCallback):
    """Splits every training step into time waiting for the batch and time computing it.

    *Data wait* runs from the end of the previous step to the arrival of this step's batch (the trainer
    fetching it from the DataLoader, including worker hand-off and host-to-device copy); *compute* runs
    from the batch's arrival to the end of the step (forward, backward, optimizer). On CUDA both are
    measured with CUDA events on the current stream, read only at logging steps (no per-step
    synchronisation): the data wait is then the time the GPU sat idle between steps. The first step of an
    epoch and the first step after validation are not timed (their wait includes start-up and validation).

    When the data-wait fraction over the last ``window`` steps exceeds ``stall_fraction``, it warns once
    with advice computed from the run (the DataLoader's ``num_workers`` vs the cores available,
    ``pin_memory``, ``persistent_workers``, DALI) and writes the advice to TensorBoard text.

    Logged metrics:
        - ``time/data_wait_ms``: mean wait for the batch per step since the last log.
        - ``time/compute_ms``: mean compute time per step since the last log.
        - ``time/step_ms``: mean step time (wait + compute) since the last log.
        - ``time/step_ms_p50``, ``time/step_ms_p90``, ``time/step_ms_max``: over the last ``window`` steps.
        - ``time/data_wait_fraction``: wait / step time since the last log.
        - ``time/samples_per_sec``: samples / step time since the last log (this process).
        - text ``time/advice``: the input-bound diagnosis, when it fires.

    Args:
        log_every_n_steps: Log every n steps (default: the trainer's ``log_every_n_steps``).
        window: Steps in the rolling window for percentiles and the stall check.
        stall_fraction: Data-wait fraction above which the run is called input-bound.

    Example:
        >>> import lightning.pytorch as pl
        >>> trainer = pl.Trainer(callbacks=[StepTimeMonitor(window=20)], max_steps=1, accelerator="cpu")
    """

    def __init__(self, log_every_n_steps: int | None = None, window: int = 50, stall_fraction: float = 0.2) -> None:
        super().__init__()
        if log_every_n_steps is not None and log_every_n_steps < 1:
            raise ValueError(f"StepTimeMonitor(log_every_n_steps={log_every_n_steps}) must be >= 1 or None")
        if window < 2:
            raise ValueError(f"StepTimeMonitor(window={window}) must be >= 2")
        if not 0.0 < stall_fraction < 1.0:
            raise ValueError(f"StepTimeMonitor(stall_fraction={stall_fraction}) must be in (0, 1)")
        self.log_every_n_steps = log_every_n_steps
        self.window = window
        self.stall_fraction = stall_fraction
        self.advice: str | None = None
        self._reset()

    def _reset(self) -> None:
        self._marks: _Marks | None = None
        self._prev_end: Any = None
        self._start: Any = None
        self._pending: list[tuple[Any, Any, Any, int]] = []  # (prev_end, start, end, samples)
        self._recent: deque[tuple[float, float]] = deque(maxlen=self.window)  # (wait_ms, compute_ms)
        self._interval: list[tuple[float, float, int]] = []

    def state_dict(self) -> dict[str, Any]:
        return {"advice": self.advice}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.advice = state_dict.get("advice")

    @guarded
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()
        self._marks = _Marks(trainer.strategy.root_device)

    @guarded
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._prev_end = None

    @guarded
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._prev_end = None

    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._marks is not None:
            self._start = self._marks.mark()

    @guarded
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._marks is None or self._start is None:
            return
        end = self._marks.mark()
        if self._prev_end is not None:
            try:
                samples = int(extract_batch_size(batch))
            except Exception:  # noqa: BLE001 - batches without a recognisable size
                samples = 0
            self._pending.append((self._prev_end, self._start, end, samples))
        self._prev_end, self._start = end, None
        every = resolve_every(trainer, self.log_every_n_steps)
        if len(self._pending) >= every:
            self._flush(trainer)

    def _flush(self, trainer: pl.Trainer) -> None:
        assert self._marks is not None
        for prev_end, start, end, samples in self._pending:
            wait, compute = self._marks.elapsed_ms(prev_end, start), self._marks.elapsed_ms(start, end)
            self._recent.append((wait, compute))
            self._interval.append((wait, compute, samples))
        self._pending.clear()
        waits = sum(w for w, _, _ in self._interval)
        computes = sum(c for _, c, _ in self._interval)
        samples = sum(s for _, _, s in self._interval)
        n = len(self._interval)
        total = waits + computes
        steps = [w + c for w, c in self._recent]
        metrics = {
            "time/data_wait_ms": waits / n,
            "time/compute_ms": computes / n,
            "time/step_ms": total / n,
            "time/step_ms_p50": _percentile(steps, 0.5),
            "time/step_ms_p90": _percentile(steps, 0.9),
            "time/step_ms_max": max(steps),
            "time/data_wait_fraction": waits / total if total > 0 else 0.0,
        }
        if samples and total > 0:
            metrics["time/samples_per_sec"] = samples / (total / 1e3)
        self._interval.clear()
        log_scalars(trainer, metrics)
        self._check_stall(trainer)

    def _check_stall(self, trainer: pl.Trainer) -> None:
        if self.advice is not None or len(self._recent) < min(self.window, 10):
            return
        wait = sum(w for w, _ in self._recent)
        total = wait + sum(c for _, c in self._recent)
        fraction = wait / total if total > 0 else 0.0
        if fraction <= self.stall_fraction:
            return
        self.advice = input_bound_advice(trainer, fraction, self.stall_fraction, len(self._recent))
        self._warn_once("stall", self.advice)
        log_text(trainer, "time/advice", self.advice)


def input_bound_advice(trainer: pl.Trainer, fraction: float, threshold: float, steps: int) -> str:
    """Advice for an input-bound run, computed from the trainer's actual DataLoader and device."""
    lines = [
        f"StepTimeMonitor: the run is input-bound: {fraction:.0%} of step time over the last {steps} steps was spent "
        f"waiting for data (threshold stall_fraction={threshold})."
    ]
    loader = trainer.train_dataloader
    loaders = loader if isinstance(loader, (list, tuple)) else list(loader.values()) if isinstance(loader, dict) else [loader]
    cores = available_cpu_cores()
    on_cuda = trainer.strategy.root_device.type == "cuda"
    for dl in loaders:
        workers = getattr(dl, "num_workers", None)
        if workers is None:
            continue
        suggested = max(1, int(cores * 0.75) // max(1, trainer.num_devices))
        if workers < suggested:
            lines.append(
                f"- DataLoader num_workers={workers} with {cores} CPU cores available: raise num_workers to about "
                f"{suggested} (75% of the cores, shared between {trainer.num_devices} device(s) on this node)."
            )
        if on_cuda and not getattr(dl, "pin_memory", False):
            lines.append("- pin_memory=False while training on CUDA: set pin_memory=True for faster, asynchronous copies.")
        if workers > 0 and not getattr(dl, "persistent_workers", False):
            lines.append("- persistent_workers=False: workers restart every epoch; set persistent_workers=True.")
    datamodule = getattr(trainer, "datamodule", None)
    if type(datamodule).__name__ != "DALIImageDataModule":
        lines.append(
            "- Next step: decode and augment with NVIDIA DALI: lit_compute.data.DALIImageDataModule "
            "(same batches as TorchvisionImageDataModule; GPU decode on CUDA)."
        )
    return "\n".join(lines)
