"""The writer: every lit_compute write to the trainer's loggers goes through here.

One :class:`Writer` per trainer (:func:`writer_for`) holds what writing needs to remember for all of lit_compute:
the loggers that failed once (skipped from then on, one warning), the warnings already given, and the tags
written so far (TensorBoard's Custom Scalars layout is rewritten when a new one appears). It writes:

- a logging event's metrics (:func:`write_event`): one ``log_metrics`` call per logger at the event's step; to
  TensorBoard the FLOP/s figures also in the run's unit when that is under TFLOP/s (``compute/gflops_per_sec`` on a
  CPU), which its Custom Scalars charts draw;
- scalars outside an event (:func:`log_scalars`: a profiler window exported at the end of a run, a benchmark
  sweep whose steps are message sizes);
- one-line messages for the terminal (:func:`say`), printed above a live progress bar instead of through it;
- Markdown text to TensorBoard's text plugin (:func:`log_text`), the run's record (:func:`write_run_record`:
  ``run.json`` beside the events, read back by ``lit-compute report``, ``whatif`` and the tune) with its run-info
  table for people, and the Custom Scalars layout (:func:`write_layout`).

Loggers that follow TensorBoard's run and version (``PrometheusLogger``) are linked duck-typed by their
``follow(run, version)`` method (:func:`link_loggers`), so nothing here imports a logger class of lit_compute.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import lightning
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lit_compute import _compat
from lit_compute.formatting import flops_rate_unit
from lit_compute.run_record import RECORD_FILE, RunRecord, write_record
from lit_compute.tensorboard_layout import FLOP_RATE_TAGS, flops_rate_tag, layout_for

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lit_compute.timeline import LogEvent


@dataclass
class Writer:
    """What writing to one trainer's loggers remembers (see the module docstring)."""

    failed_loggers: set[int] = field(default_factory=set)  # id() of loggers that raised once
    warned: set[str] = field(default_factory=set)  # warnings given once for all of lit_compute
    tags: set[str] = field(default_factory=set)  # scalar tags written so far
    points: dict[str, int] = field(default_factory=dict)  # points written per tag
    two_differ: set[str] = field(default_factory=set)  # tags whose first two points differ
    first: dict[str, float] = field(default_factory=dict)  # each tag's first value
    charted: frozenset[str] = frozenset()  # the tags the Custom Scalars layout was last written for
    flops_unit: tuple[float, str] | None = None  # (scale in TFLOP/s, unit) of the run's FLOP/s charts, once known
    record: RunRecord | None = None  # the run's record, made at its first write (run.json)

    def flops_rate_twins(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """The FLOP/s figures of ``metrics`` in the run's unit (``compute/gflops_per_sec`` on a CPU), for TensorBoard's
        charts; none when the unit is TFLOP/s. The unit is chosen once (one run, one axis), by the largest of the first
        achieved FLOP/s figures (a CPU's bfloat16 peak can pass 1 TFLOP/s while it achieves a tenth of it)."""
        rates = {t: v for t, v in metrics.items() if t in FLOP_RATE_TAGS and math.isfinite(v)}
        achieved = [abs(v) for t, v in rates.items() if t != "compute/peak_tflops"]
        if self.flops_unit is None and achieved:
            self.flops_unit = flops_rate_unit(max(achieved))
        if not rates or self.flops_unit is None or self.flops_unit[1] == "TFLOP/s":
            return {}
        scale, unit = self.flops_unit
        return {flops_rate_tag(t, unit): v / scale for t, v in rates.items()}

    def add_points(self, metrics: Mapping[str, float]) -> bool:
        """Count the points of ``metrics``; True when a tag got its first, second or third point (the only points that
        can change :meth:`drawable`)."""
        early = False
        for tag, value in metrics.items():
            n = self.points[tag] = self.points.get(tag, 0) + 1
            if n == 1:
                self.first[tag] = value
            elif n == 2 and value != self.first[tag]:
                self.two_differ.add(tag)
            early |= n <= 3
        self.tags.update(metrics)
        return early

    def drawable(self) -> frozenset[str]:
        """Tags TensorBoard's charts draw as a line: three or more points, or two equal ones. One point is a lone
        dot (a profiler window's figures, a single validation run); with exactly two different values (a validation
        figure after two validation runs) its line chart scales the y axis to a fixed 0-1 ("ignore outliers", on by
        default), which leaves the line flat at the bottom or off the chart altogether."""
        return frozenset(
            t for t in self.tags if self.points[t] >= 3 or (self.points[t] == 2 and t not in self.two_differ)
        )


_WRITERS: weakref.WeakKeyDictionary[Any, Writer] = weakref.WeakKeyDictionary()


def writer_for(trainer: pl.Trainer) -> Writer:
    """The :class:`Writer` of ``trainer`` (created on first use)."""
    writer = _WRITERS.get(trainer)
    if writer is None:
        writer = _WRITERS[trainer] = Writer()
    return writer


def say(trainer: pl.Trainer | None, message: str) -> None:
    """Rank 0 prints ``message`` as one line. While a progress bar is drawn it goes through the bar (rich's console
    prints above the live display, ``tqdm.write`` above tqdm's bar): a logging line written to the terminal while the
    bar redraws is cut in half. Otherwise it is an info log line (``rank_zero_info``), as before."""
    if trainer is not None and not trainer.is_global_zero:
        return
    from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

    bar = getattr(trainer, "progress_bar_callback", None) if trainer is not None else None
    if isinstance(bar, RichProgressBar):
        live = getattr(bar.progress, "live", None)
        if live is not None and live.is_started and bar.progress is not None:
            bar.progress.console.print(message, markup=False, highlight=False, soft_wrap=True)
            return
    if isinstance(bar, TQDMProgressBar):
        try:
            tqdm_bar = bar.train_progress_bar
        except TypeError:  # not training
            tqdm_bar = None
        if tqdm_bar is not None and not tqdm_bar.disable:
            tqdm_bar.write(message)
            return
    rank_zero_info(message)


def write_event(trainer: pl.Trainer, event: LogEvent | None) -> None:
    """Write a finished logging event: its metrics in one ``log_metrics`` call per logger, at its step, by rank 0;
    every other rank writes its own to the loggers that serve every rank (``every_rank``: a PrometheusLogger with
    ``ranks="all"``, whose series are labelled with the rank's device)."""
    if event is None or not event.metrics:
        return
    if trainer.is_global_zero:
        log_scalars(trainer, event.metrics, step=event.step)
    else:
        every_rank = [logger for logger in trainer.loggers if getattr(logger, "every_rank", False)]
        _send(trainer, every_rank, {k: float(v) for k, v in event.metrics.items()}, {}, event.step)


def _send(trainer: pl.Trainer, loggers: list, clean: dict[str, float], twins: dict[str, float], step: int) -> None:
    """One ``log_metrics`` call per logger (TensorBoard's with the rate twins); a logger that raises is reported once
    (rank 0 says so) and skipped from then on; training goes on."""
    writer = writer_for(trainer)
    for logger in loggers:
        if id(logger) in writer.failed_loggers:
            continue
        try:
            logger.log_metrics({**clean, **twins} if isinstance(logger, TensorBoardLogger) else clean, step=step)
        except Exception as err:  # noqa: BLE001 - a broken logger must not stop training
            writer.failed_loggers.add(id(logger))
            rank_zero_warn(
                f"lit_compute: writing metrics to {type(logger).__name__} failed with {_cause(err)}. "
                "lit_compute's metrics are no longer sent to that logger; training goes on.",
                category=UserWarning,
            )


def log_scalars(trainer: pl.Trainer, metrics: Mapping[str, float], step: int | None = None) -> None:
    """Send scalars to every logger of the trainer at ``step`` (default: Lightning's logging step).

    A logger that raises is reported once (for all of lit_compute, whichever callback logged) and skipped from
    then on; training goes on."""
    if not metrics:
        return
    writer = writer_for(trainer)
    step = _compat.batches_that_stepped(trainer) if step is None else step
    clean = {k: float(v) for k, v in metrics.items()}
    first = not writer.tags
    twins = writer.flops_rate_twins(clean)  # TensorBoard's charts only: other loggers keep one tag per figure
    _send(trainer, list(trainer.loggers), clean, twins, step)
    if first:
        write_run_record(trainer)
        log_text(trainer, "lit_compute/run", writer.record.table() if writer.record else run_info(trainer), step=0)
    if writer.add_points({**clean, **twins}):  # a new tag, a tag's second or third point: a few times per run
        drawable = writer.drawable()
        if drawable != writer.charted:
            writer.charted = drawable
            write_layout(trainer, drawable)


def tensorboard_logger(trainer: pl.Trainer) -> TensorBoardLogger | None:
    """The first TensorBoard logger of the trainer, if any."""
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger
    return None


def log_text(trainer: pl.Trainer, tag: str, text: str, step: int | None = None) -> bool:
    """Write Markdown text to TensorBoard's text plugin. Returns False when there is no TensorBoard logger."""
    tb = tensorboard_logger(trainer)
    writer = writer_for(trainer)
    if tb is None:
        if trainer.loggers and trainer.is_global_zero and "no-tensorboard" not in writer.warned:
            writer.warned.add("no-tensorboard")
            rank_zero_warn(
                f"lit_compute: no TensorBoard logger among this trainer's loggers "
                f"({', '.join(type(lg).__name__ for lg in trainer.loggers)}): TensorBoard-only output (the "
                "per-module FLOPs table, profiler op tables, advice and run-info text, the Custom Scalars "
                "layout) is not written; every scalar still goes to every logger, and profiler traces to "
                "disk.",
                category=UserWarning,
            )
        return False
    if not trainer.is_global_zero:
        return False
    if id(tb) in writer.failed_loggers:
        return False
    try:
        tb.experiment.add_text(tag, text, global_step=trainer.global_step if step is None else step)
    except Exception as err:  # noqa: BLE001 - a broken logger must not stop training
        writer.failed_loggers.add(id(tb))
        rank_zero_warn(
            f"lit_compute: writing text to TensorBoard failed with {_cause(err)}. "
            "lit_compute's output is no longer sent to it; training goes on.",
            category=UserWarning,
        )
        return False
    return True


def save_hparam(trainer: pl.Trainer, key: str, value: float) -> bool:
    """Add ``key`` to the TensorBoard logger's ``hparams.yaml`` after Lightning wrote it at fit start (a figure known
    only once training ran, such as the FLOPs per sample of a model without an ``example_input_array``). Rank 0; a
    key already there is left as it is. Returns whether it was written."""
    tb = tensorboard_logger(trainer)
    if tb is None or not trainer.is_global_zero or id(tb) in writer_for(trainer).failed_loggers:
        return False
    hparams = tb.hparams if isinstance(tb.hparams, dict) else vars(tb.hparams)
    if key in hparams:
        return False
    try:
        from lightning.pytorch.core.saving import save_hparams_to_yaml

        hparams[key] = value
        save_hparams_to_yaml(f"{tb.log_dir}/{tb.NAME_HPARAMS_FILE}", hparams)
    except Exception as err:  # noqa: BLE001 - a hyperparameter file is not worth failing the run for
        rank_zero_warn(
            f"lit_compute: adding {key} to hparams.yaml failed with {_cause(err)}; training goes on.",
            category=UserWarning,
        )
        return False
    return True


def _cause(err: BaseException) -> str:
    """The root of an exception chain, as ``Type: message`` (Lightning's TensorBoardLogger re-raises a failed write
    as "you tried to log ... which is currently not supported"; the cause is the ENOSPC or ENOENT beneath)."""
    while err.__cause__ is not None:
        err = err.__cause__
    return f"{type(err).__name__}: {err}"


def write_layout(trainer: pl.Trainer, tags: Iterable[str]) -> bool:
    """Write the Custom Scalars layout of ``tags`` to the TensorBoard logger's event file (TensorBoard shows the
    latest one)."""
    tb = tensorboard_logger(trainer)
    writer = writer_for(trainer)
    layout = layout_for(tags, writer.flops_unit[1] if writer.flops_unit else "TFLOP/s")
    if tb is None or not layout or not trainer.is_global_zero or id(tb) in writer.failed_loggers:
        return False
    try:
        tb.experiment.add_custom_scalars(layout)
        tb.experiment.flush()
    except Exception as err:  # noqa: BLE001 - a full disk or a deleted log folder must not stop training
        writer.failed_loggers.add(id(tb))
        rank_zero_warn(
            f"lit_compute: writing the Custom Scalars layout to TensorBoard failed with {_cause(err)}. "
            "lit_compute's output is no longer sent to it; training goes on.",
            category=UserWarning,
        )
        return False
    return True


def run_record(trainer: pl.Trainer) -> RunRecord:
    """The run's :class:`~lit_compute.run_record.RunRecord`, made from the trainer at its first logging event (the
    same on every rank; rank 0 writes it)."""
    from lit_compute.hardware.chips import chip_for_name
    from lit_compute.hardware.dtypes import tf32_enabled
    from lit_compute.hardware.this_machine import cpu_name

    device = trainer.strategy.root_device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    datamodule = getattr(trainer, "datamodule", None)
    layout = _compat.parallel_layout(trainer)
    steps, epochs = getattr(trainer, "max_steps", -1), getattr(trainer, "max_epochs", None)
    workers = _compat.train_loader_workers(trainer)
    return RunRecord(
        precision=str(trainer.precision),
        precision_plugin=type(trainer.precision_plugin).__name__,
        device=name,
        chip=chip_for_name(name) if device.type == "cuda" else None,
        cpu=cpu_name(),
        nodes=layout.nodes,
        devices_per_node=layout.devices_per_node,
        world_size=trainer.world_size,
        data_parallel=layout.data_parallel,
        tensor_parallel=layout.tensor_parallel,
        strategy=type(trainer.strategy).__name__,
        data=type(datamodule).__name__ if datamodule is not None else "dataloaders",
        cpu_cores=_compat.available_cpu_cores(),
        torch_threads=torch.get_num_threads(),
        loader_workers=int(workers) if workers.isdigit() else None,
        torch=torch.__version__,
        lightning=lightning.__version__,
        planned_steps=steps if isinstance(steps, int) and steps > 0 else None,
        planned_epochs=epochs if not (isinstance(steps, int) and steps > 0) and isinstance(epochs, int) else None,
        cudnn_allow_tf32=tf32_enabled("conv"),
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        matmul_tf32=tf32_enabled("matmul"),
        compiled=_compat.trains_compiled(module) if (module := getattr(trainer, "lightning_module", None)) else None,
    )


def run_info(trainer: pl.Trainer) -> str:
    """The run-info table (text ``lit_compute/run``): the run's record rendered for people."""
    return run_record(trainer).table()


def write_run_record(trainer: pl.Trainer, op_classes: dict[str, Any] | None = None) -> None:
    """Write the run's record as ``run.json`` in the TensorBoard logger's folder (rank 0), made at the first call;
    ``op_classes``: a counted op-class table to keep in it (the micro-batch's, see
    :meth:`~lit_compute.run_record.RunRecord.with_op_classes`). Written again only when it changed; a failed write
    warns once and training goes on."""
    writer = writer_for(trainer)
    fresh = writer.record is None
    if writer.record is None:
        writer.record = run_record(trainer)
    changed = writer.record.with_op_classes(op_classes) if op_classes else False
    tb = tensorboard_logger(trainer)
    if tb is None or not trainer.is_global_zero or not (fresh or changed) or id(tb) in writer.failed_loggers:
        return
    try:
        write_record(tb.log_dir, writer.record)
    except OSError as err:
        if "run-record" not in writer.warned:
            writer.warned.add("run-record")
            rank_zero_warn(
                f"lit_compute: writing the run record ({RECORD_FILE}) failed with {_cause(err)}; "
                "lit-compute whatif and report cannot read this run's facts. Training goes on.",
                category=UserWarning,
            )


def link_loggers(trainer: pl.Trainer) -> None:
    """Give loggers that follow TensorBoard's run (a ``follow(run, version)`` method: ``PrometheusLogger``) the
    TensorBoard logger's run and version (its ``run`` label, the progress bar's ``v_num``)."""
    tb = tensorboard_logger(trainer)
    if tb is None:
        return
    run = f"{tb.name}/version_{tb.version}" if isinstance(tb.version, int) else f"{tb.name}/{tb.version}"
    for logger in trainer.loggers:
        follow = getattr(logger, "follow", None)
        if logger is tb or not callable(follow):
            continue
        with contextlib.suppress(Exception):  # a label is not worth failing for
            follow(run, tb.version)
