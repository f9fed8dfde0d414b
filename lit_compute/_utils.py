"""Shared helpers: warn-once, self-disabling measuring callbacks, logger access.

Everything here is private; the public API is re-exported from :mod:`lit_compute`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_warn

if TYPE_CHECKING:
    import lightning.pytorch as pl

F = TypeVar("F", bound=Callable[..., Any])


def available_cpu_cores() -> int:
    """CPU cores this process may run on (affinity-aware), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS / Windows
        return max(1, os.cpu_count() or 1)


class MeasuringCallback(Callback):
    """A callback that measures and therefore must never stop training.

    Hooks decorated with :func:`guarded` catch any exception, warn once with what failed and what is now
    disabled, call :meth:`_teardown` and turn the callback off for the rest of the run.

    Every lit_compute callback logs through :func:`log_scalars`, which also writes, once per run, the text
    ``lit_compute/run`` (precision, device, world size, strategy) and keeps TensorBoard's custom-scalars layout
    up to date with the tags logged so far.
    """

    _disabled: bool = False
    _warned: set[str]

    def _warn_once(self, key: str, message: str) -> None:
        warned = self.__dict__.setdefault("_warned", set())
        if key not in warned:
            warned.add(key)
            rank_zero_warn(message, category=UserWarning)

    def _disable(self, reason: str) -> None:
        if self._disabled:
            return
        self._disabled = True
        self._warn_once(
            "disabled", f"{type(self).__name__}: {reason}. {type(self).__name__} is now disabled; training goes on."
        )
        try:
            self._teardown()
        except Exception:  # noqa: BLE001 - teardown of a broken callback must not raise either
            pass

    def _teardown(self) -> None:
        """Remove hooks / stop profilers. Overridden by subclasses."""


def guarded(fn: F) -> F:
    """Decorate a :class:`MeasuringCallback` hook: skip when disabled, disable on any exception."""

    @functools.wraps(fn)
    def wrapper(self: MeasuringCallback, *args: Any, **kwargs: Any) -> Any:
        if self._disabled:
            return None
        try:
            return fn(self, *args, **kwargs)
        except Exception as err:  # noqa: BLE001 - by design: measuring must not kill the run
            self._disable(f"{fn.__name__} failed with {type(err).__name__}: {err}")
            return None

    return wrapper  # type: ignore[return-value]


def resolve_every(trainer: pl.Trainer, every: int | None) -> int:
    """The logging interval in steps: ``every`` or the trainer's ``log_every_n_steps``."""
    return max(1, int(every if every is not None else trainer.log_every_n_steps))


def log_scalars(trainer: pl.Trainer, metrics: Mapping[str, float], step: int | None = None) -> None:
    """Send scalars to every logger of the trainer at ``step`` (default: ``global_step``)."""
    if not metrics:
        return
    step = trainer.global_step if step is None else step
    clean = {k: float(v) for k, v in metrics.items()}
    for logger in trainer.loggers:
        logger.log_metrics(clean, step=step)
    tags = trainer.__dict__.setdefault("_lit_compute_tags", set())
    if not tags:
        log_text(trainer, "lit_compute/run", run_info(trainer), step=0)
    new = set(clean) - tags
    if new:
        tags.update(new)
        from lit_compute.tensorboard_layout import write_layout

        write_layout(trainer, tags)  # rewritten only when a new tag appears: a handful of times per run


def run_info(trainer: pl.Trainer) -> str:
    """One Markdown table describing the run (read back by ``lit-compute report``)."""
    import lightning
    import torch

    device = trainer.strategy.root_device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows = [
        ["precision", trainer.precision],
        ["precision plugin", type(trainer.precision_plugin).__name__],
        ["device", name],
        ["world size", trainer.world_size],
        ["strategy", type(trainer.strategy).__name__],
        ["torch", torch.__version__],
        ["lightning", lightning.__version__],
    ]
    return markdown_table(["key", "value"], rows)


def tensorboard_logger(trainer: pl.Trainer) -> TensorBoardLogger | None:
    """The first TensorBoard logger of the trainer, if any."""
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger
    return None


def log_text(trainer: pl.Trainer, tag: str, text: str, step: int | None = None) -> bool:
    """Write Markdown text to TensorBoard's text plugin. Returns False when there is no TensorBoard logger."""
    tb = tensorboard_logger(trainer)
    if tb is None or not trainer.is_global_zero:
        return False
    tb.experiment.add_text(tag, text, global_step=trainer.global_step if step is None else step)
    return True


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (what TensorBoard's text plugin renders)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
