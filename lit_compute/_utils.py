"""Shared helpers: the measuring-callback base (timeline routing, warn-once, self-disabling), logger access.

Everything here is private; the public API is re-exported from :mod:`lit_compute`.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from lit_compute.timeline import LogEvent, StepRecord, Timeline, measuring_callbacks, timeline_for

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
    """A callback that measures and therefore must never stop training, fed by the shared :class:`Timeline`.

    The Lightning hooks of the training loop are implemented here, once: each first feeds the trainer's
    timeline (always, even when the callback is disabled, so marks and collectives stay identical on every
    rank), then calls the subclass's part under a guard: an exception warns once with what failed and what is
    now disabled, calls :meth:`_teardown` and turns the callback off for the rest of the run. Subclasses
    implement the private parts (``_train_start``, ``_batch_start``, ``_batch_end``, ``_step_end``,
    ``_eval_start``, ``_eval_end``) instead of those hooks; other hooks use :func:`guarded`.

    Logging goes through the timeline's event: ``event.log({...})`` in ``_step_end``/``_eval_end``, and values
    that need every rank through ``self._contribute(...)`` with keys declared in ``_reduce_keys``. The last
    lit_compute callback of the trainer's list writes the event: one all-reduce, one ``log_metrics`` call at one
    step number (the one Lightning's ``self.log`` uses).
    """

    _disabled: bool = False
    _warned: set[str]
    #: Keys this callback puts into the all-reduce of an event, per stage ("train", "validate", "test").
    _reduce_keys: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: The callback's own logging interval (None: the trainer's ``log_every_n_steps``).
    log_every_n_steps: int | None = None

    # -- warn once, disable once ----------------------------------------------------------------------
    def _warn_once(self, key: str, message: str) -> None:
        warned = self.__dict__.setdefault("_warned", set())
        if key not in warned:
            warned.add(key)
            rank_zero_warn(message, category=UserWarning)

    def _disable(self, reason: str) -> None:
        if self._disabled:
            return
        self._disabled = True
        message = f"{type(self).__name__}: {reason}. {type(self).__name__} is now disabled; training goes on."
        rank = int(getattr(rank_zero_only, "rank", 0) or 0)
        if rank == 0:
            self._warn_once("disabled", message)
        else:  # a failure on one rank is that rank's news: rank_zero_warn would swallow it
            warnings.warn(f"[rank {rank}] {message}", UserWarning, stacklevel=2)
        try:
            self._teardown()
        except Exception:  # noqa: BLE001 - teardown of a broken callback must not raise either
            pass

    def _guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._disabled:
            return None
        try:
            return fn(*args)
        except Exception as err:  # noqa: BLE001 - by design: measuring must not kill the run
            self._disable(f"{fn.__name__.lstrip('_')} failed with {type(err).__name__}: {err}")
            return None

    def _teardown(self) -> None:
        """Remove hooks / stop profilers. Overridden by subclasses."""

    # -- what subclasses implement --------------------------------------------------------------------
    def _logs_at(self, trainer: pl.Trainer, stage: str, step: int) -> bool:
        """Whether this callback logs in the event of ``stage`` at ``step``. Must depend only on configuration,
        the stage and the step (it decides the layout of the event's all-reduce on every rank)."""
        if stage == "train":
            return (step + 1) % resolve_every(trainer, self.log_every_n_steps) == 0
        return False

    def _setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None: ...

    def _fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None: ...

    def _train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None: ...

    def _batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None: ...

    def _batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                   record: StepRecord | None) -> None: ...

    def _step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, record: StepRecord,
                  event: LogEvent) -> None: ...

    def _eval_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None: ...

    def _eval_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str, event: LogEvent) -> None: ...

    def _contribute(self, trainer: pl.Trainer, values: dict[str, float],
                    finish: Callable[[dict[str, float]], dict[str, float]]) -> None:
        """Sum ``values`` over ranks in the pending event; ``finish(sums)`` returns the metrics to log."""
        timeline_for(trainer).contribute(self, trainer, values, finish)

    # -- the Lightning hooks, once for every measuring callback ---------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        link_loggers(trainer)
        self._guard(self._setup, trainer, pl_module, stage)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._guard(self._fit_start, trainer, pl_module)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        timeline_for(trainer).train_start(trainer)
        self._guard(self._train_start, trainer, pl_module)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        timeline_for(trainer).epoch_start()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        timeline_for(trainer).batch_start(trainer, batch)
        self._guard(self._batch_start, trainer, pl_module, batch)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        timeline = timeline_for(trainer)
        record = timeline.batch_end(trainer)
        self._guard(self._batch_end, trainer, pl_module, batch, record)
        if record is None:
            return
        if timeline.event is not None and timeline.event.stage == "train":
            self._guard(self._step_end, trainer, pl_module, record, timeline.event)
        self._flush_if_last(trainer, timeline, "train")

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._evaluation_start(trainer, pl_module, "validate")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._evaluation_end(trainer, pl_module, "validate")

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._evaluation_start(trainer, pl_module, "test")

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._evaluation_end(trainer, pl_module, "test")

    def _evaluation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        timeline_for(trainer).evaluation_start(stage)
        self._guard(self._eval_start, trainer, pl_module, stage)

    def _evaluation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        timeline = timeline_for(trainer)
        event = timeline.evaluation_end(trainer, stage)
        self._guard(self._eval_end, trainer, pl_module, stage, event)
        self._flush_if_last(trainer, timeline, stage)

    def _flush_if_last(self, trainer: pl.Trainer, timeline: Timeline, stage: str) -> None:
        measuring = measuring_callbacks(trainer)
        if measuring and measuring[-1] is self:
            timeline.flush(trainer, measuring, stage)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._safe_teardown()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._safe_teardown()

    def _safe_teardown(self) -> None:
        try:
            self._teardown()
        except Exception as err:  # noqa: BLE001 - clean-up after an exception must not raise a second one
            self._warn_once("teardown", f"{type(self).__name__}: cleaning up failed with {type(err).__name__}: {err}.")


def link_loggers(trainer: pl.Trainer) -> None:
    """Give a PrometheusLogger the TensorBoard logger's run and version (its ``run`` label, the progress bar's
    ``v_num``)."""
    from lit_compute.monitoring.prometheus_logger import PrometheusLogger

    tb = tensorboard_logger(trainer)
    if tb is None:
        return
    for logger in trainer.loggers:
        if isinstance(logger, PrometheusLogger):
            try:
                logger.follow(f"{tb.name}/version_{tb.version}" if isinstance(tb.version, int) else f"{tb.name}/{tb.version}",
                              tb.version)
            except Exception:  # noqa: BLE001 - a label is not worth failing for
                pass


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
    return max(1, int(every if every is not None else trainer.log_every_n_steps or 1))


def log_scalars(trainer: pl.Trainer, metrics: Mapping[str, float], step: int | None = None) -> None:
    """Send scalars to every logger of the trainer at ``step`` (default: Lightning's logging step).

    A logger that raises is reported once (for all of lit_compute, whichever callback logged) and skipped from
    then on; training goes on."""
    if not metrics:
        return
    from lit_compute import _compat

    timeline = timeline_for(trainer)
    step = _compat.batches_that_stepped(trainer) if step is None else step
    clean = {k: float(v) for k, v in metrics.items()}
    first = not timeline.tags
    for logger in trainer.loggers:
        if id(logger) in timeline.failed_loggers:
            continue
        try:
            logger.log_metrics(clean, step=step)
        except Exception as err:  # noqa: BLE001 - a broken logger must not stop training
            timeline.failed_loggers.add(id(logger))
            rank_zero_warn(f"lit_compute: writing metrics to {type(logger).__name__} failed with {type(err).__name__}: "
                           f"{err}. lit_compute's metrics are no longer sent to that logger; training goes on.",
                           category=UserWarning)
    if first:
        log_text(trainer, "lit_compute/run", run_info(trainer), step=0)
    new = set(clean) - timeline.tags
    if new:
        timeline.tags.update(new)
        from lit_compute.tensorboard_layout import write_layout

        write_layout(trainer, timeline.tags)  # rewritten only when a new tag appears: a handful of times per run


def run_info(trainer: pl.Trainer) -> str:
    """One Markdown table describing the run (read back by ``lit-compute report``)."""
    import lightning
    import torch

    device = trainer.strategy.root_device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    datamodule = getattr(trainer, "datamodule", None)
    rows = [
        ["precision", trainer.precision],
        ["precision plugin", type(trainer.precision_plugin).__name__],
        ["device", name],
        ["world size", trainer.world_size],
        ["strategy", type(trainer.strategy).__name__],
        ["data", type(datamodule).__name__ if datamodule is not None else "dataloaders"],
        ["cpu cores", available_cpu_cores()],
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
    timeline = timeline_for(trainer)
    if tb is None:
        if trainer.loggers and trainer.is_global_zero and "no-tensorboard" not in timeline.warned:
            timeline.warned.add("no-tensorboard")
            rank_zero_warn(f"lit_compute: no TensorBoard logger among this trainer's loggers "
                           f"({', '.join(type(lg).__name__ for lg in trainer.loggers)}): TensorBoard-only output (the "
                           "per-module FLOPs table, profiler op tables, advice and run-info text, the Custom Scalars "
                           "layout) is not written; every scalar still goes to every logger, and profiler traces to "
                           "disk.", category=UserWarning)
        return False
    if not trainer.is_global_zero:
        return False
    if id(tb) in timeline.failed_loggers:
        return False
    try:
        tb.experiment.add_text(tag, text, global_step=trainer.global_step if step is None else step)
    except Exception as err:  # noqa: BLE001 - a broken logger must not stop training
        timeline.failed_loggers.add(id(tb))
        rank_zero_warn(f"lit_compute: writing text to TensorBoard failed with {type(err).__name__}: {err}. "
                       "lit_compute's output is no longer sent to it; training goes on.", category=UserWarning)
        return False
    return True


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (what TensorBoard's text plugin renders)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
