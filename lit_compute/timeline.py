"""The measurement timeline every lit_compute callback shares: one clock, one notion of step, one logging event.

One :class:`Timeline` exists per trainer (:func:`timeline_for`). lit_compute's callbacks feed it from their
hooks (the first callback to reach a point takes the mark, the others read it), so every callback sees the
same marks whatever their order in ``Trainer(callbacks=[...])``:

- **batch ready** (``on_train_batch_start``), **batch end** (``on_train_batch_end``); the data wait of a batch
  runs from the previous batch's end to its ready mark, its compute from ready to end. **Before backward**
  (``on_before_backward``, the batch's first) ends its forward: under DDP no gradient synchronisation has run
  yet, so wait + forward is a rank's own work (how a straggler is told from the ranks waiting for it).
- **step**: Lightning's optimizer step under automatic optimization (the micro-batches of an accumulated
  step are one step) and one training batch under manual optimization, whatever the number of
  ``optimizer.step()`` calls. Its number is the step Lightning's own ``self.log`` writes at for the same
  batch (the fit loop's ``_batches_that_stepped``, equal to ``global_step`` - 1 after the step under
  automatic optimization). A callback logs at step ``n`` when ``(n + 1) % log_every_n_steps == 0``, as
  Lightning does.
- **labelled intervals** that every consumer leaves out of step time, data wait and throughput:
  ``instrument`` (lit_compute's own work: trace export, FLOP counting, peak measurement, collective
  benchmarks; any code can mark its own with :meth:`Timeline.instrument`), ``validation``, ``checkpoint``
  (``trainer.save_checkpoint``). The timeline's :meth:`Timeline.now` is a clock from which these intervals
  are removed.
- **taints**: a step inside which instrument work ran that cannot be cut out as an interval (the FLOP
  counter's dispatch mode, a profiler recording, ``torch.compile`` compiling, the first batch of an epoch
  whose wait includes the loader's start) is *tainted*; consumers leave tainted steps out of their figures.
- **one logging event** per step or validation run: every lit_compute metric of it is written with one
  ``log_metrics`` call at one step number, and the values that need all ranks go through **one** all-reduce
  whose layout depends only on configuration and the step number (never on a rank's own data or
  failures): a rank with nothing to say contributes NaN. :meth:`Timeline.flush` returns the finished event;
  :mod:`lit_compute.writer` writes it. The timeline itself writes nothing and imports nothing above
  :mod:`lit_compute._batch` and :mod:`lit_compute._compat`: its callers pass their participants in
  (:class:`Participant`).

The clock is ``time.perf_counter`` looked up at every call (so ``mock.patch("time.perf_counter")`` drives it,
as Lightning's own callback tests do), or any callable given as :attr:`Timeline.clock`.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from lit_compute import _compat, collective_clock
from lit_compute._batch import BatchFacts, TokenSpec, read_batch

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["BatchFacts", "LogEvent", "Participant", "StepRecord", "Timeline", "read_batch", "timeline_for"]

CATEGORIES = ("instrument", "validation", "checkpoint")


def _perf_counter() -> float:
    return time.perf_counter()


@dataclass
class StepRecord:
    """One training step (one optimizer step, or one batch under manual optimization) as the timeline saw it.

    ``wait_s``/``compute_s`` are host-clock seconds with every labelled interval removed. On CUDA,
    :meth:`device_times` gives the same spans from CUDA events (read lazily: call it at logging steps only).
    """

    index: int
    batches: int = 0
    wait_s: float = 0.0
    compute_s: float = 0.0
    samples: int | None = 0
    tokens: int | None = None
    real_tokens: Any = None
    forward_s: float = 0.0
    comm_s: float = 0.0  # host time blocked in collectives during the step's batches (lit_compute.collective_clock)
    forward_comm_s: float = 0.0  # the part of it inside the forwards (arrival to first backward)
    taints: set[str] = field(default_factory=set)
    _events: list[tuple[Any, Any, Any, float]] = field(default_factory=list, repr=False)
    _forward_events: list[tuple[Any, Any]] = field(default_factory=list, repr=False)
    # under NCCL: (start, end) CUDA events of each collective wait, whether inside a forward, whether between batches
    _comm_events: list[tuple[Any, Any, bool, bool]] = field(default_factory=list, repr=False)

    @property
    def duration_s(self) -> float:
        return self.wait_s + self.compute_s

    @property
    def clean(self) -> bool:
        """No instrument work, compilation or start-up inside this step: fit for every figure."""
        return not self.taints

    def device_times(self) -> tuple[float, float]:
        """``(wait_s, compute_s)`` measured on the device (CUDA events), labelled host intervals removed.

        Falls back to the host figures when no CUDA events were recorded (CPU runs)."""
        if not self._events:
            return self.wait_s, self.compute_s
        wait = compute = 0.0
        for prev_end, ready, end, excluded_in_wait in self._events:
            end.synchronize()
            if prev_end is not None:
                wait += max(0.0, prev_end.elapsed_time(ready) / 1e3 - excluded_in_wait)
            compute += ready.elapsed_time(end) / 1e3
        # collectives between two batches (a logging all-reduce) are no wait for data, as on the host clock
        return max(0.0, wait - self.device_comm_times()[2]), compute

    def device_comm_times(self) -> tuple[float, float, float]:
        """``(comm_s, forward_comm_s, between_s)``: the step's time in collective waits, the part inside its forwards
        and the part between batches. Under NCCL from CUDA events on the current stream (a wait returns on the host
        at once, the stream stalls until the collective and the other ranks are done: read lazily, at logging steps
        only); elsewhere the host's blocked time (its between-batch part already left out of the data wait)."""
        if not self._comm_events:
            return self.comm_s, self.forward_comm_s, 0.0
        comm = forward = between = 0.0
        for start, end, in_forward, between_batches in self._comm_events:
            end.synchronize()
            seconds = max(0.0, start.elapsed_time(end) / 1e3)
            comm += seconds
            forward += seconds if in_forward else 0.0
            between += seconds if between_batches else 0.0
        return comm, forward, between

    def device_forward_time(self) -> float:
        """Seconds from each batch's arrival to its first backward (its forward and loss: no gradient
        synchronisation yet), on the device when CUDA events were recorded, else ``forward_s``."""
        if not self._forward_events:
            return self.forward_s
        total = 0.0
        for ready, before_backward in self._forward_events:
            before_backward.synchronize()
            total += ready.elapsed_time(before_backward) / 1e3
        return total

    def real_token_count(self) -> int | None:
        """Non-padding tokens of the step (reads a device tensor: call at logging steps)."""
        if self.real_tokens is None:
            return None
        value = self.real_tokens
        return int(value.item()) if isinstance(value, torch.Tensor) else int(value)


@dataclass
class LogEvent:
    """Everything lit_compute logs for one step (``stage="train"``) or one evaluation run, at one step number."""

    stage: str
    step: int
    record: StepRecord | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    _reduce: dict[tuple[int, str], float] = field(default_factory=dict)
    _finish: list[tuple[Any, Callable[[dict[str, float]], dict[str, float]]]] = field(default_factory=list)

    def log(self, metrics: dict[str, float]) -> None:
        """Add metrics to this event (written once, by rank 0, when the event is flushed)."""
        self.metrics.update({k: float(v) for k, v in metrics.items()})

    def contribute(
        self, owner: Participant, values: Mapping[str, float], finish: Callable[[dict[str, float]], dict[str, float]]
    ) -> None:
        """Put ``values`` into this event's all-reduce (sum over ranks; NaN where a rank knows nothing);
        ``finish(sums)`` returns the metrics to log once the sums are known. The keys must be in the owner's
        ``reduce_keys`` for this event's stage (the slots every rank reserves); others are never reduced."""
        for key, value in values.items():
            self._reduce[(id(owner), key)] = float(value)
        self._finish.append((owner, finish))


class Participant(Protocol):
    """What the timeline needs of a callback that takes part in the logging event (a
    :class:`~lit_compute.callback.MeasuringCallback` is one).

    ``reduce_keys[stage]`` names the values the participant puts into the event's all-reduce when
    ``logs_at(trainer, stage, step)``; that predicate depends only on configuration, the stage and the step, so
    the all-reduce has the same layout on every rank. ``disable(reason)`` is called when its ``finish`` raises.
    """

    @property
    def reduce_keys(self) -> Mapping[str, tuple[str, ...]]: ...

    def logs_at(self, trainer: pl.Trainer, stage: str, step: int) -> bool: ...

    def disable(self, reason: str) -> None: ...


class Timeline:
    """The shared clock, step marks and logging events of one trainer (see the module docstring).

    Attributes:
        clock: The raw clock in seconds (default: ``time.perf_counter``, looked up at each call).
        totals: Seconds spent in labelled intervals so far, by category (``"instrument"``) and by
            ``"category:label"`` (``"instrument:profiler_export"``).
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock: Callable[[], float] = clock or _perf_counter
        self.totals: dict[str, float] = {}
        self._stack: list[tuple[str, str]] = []  # open intervals (category, label)
        self._pause_start: float | None = None
        self._paused = 0.0
        self._category_start: dict[str, float] = {}
        self.device: torch.device | None = None
        self.event: LogEvent | None = None
        self.token_spec: TokenSpec | None = None  # None: auto-detect input_ids/attention_mask
        self._modes: list[tuple[Any, Callable[[BaseException], None] | None]] = []
        self._timed_loggers: list[tuple[Any, Any]] = []  # (logger, the log_metrics wrapper set on it)
        self._watch: int | None = None  # collective_clock handle while training on more than one rank
        self._device_comm = False  # NCCL on CUDA: collective waits timed by CUDA events too
        self._reset_loop()

    def _reset_loop(self) -> None:
        self._in_batch = False
        self._last_end: float | None = None  # user clock at the previous batch end (None: unknown)
        self._last_end_event: Any = None
        self._excluded_since_end = 0.0
        self._comm_since_end = 0.0  # collective waits since the previous batch's end (not data wait)
        self._comm_events_since_end: list[tuple[Any, Any]] = []  # their CUDA events under NCCL
        self._ready = 0.0
        self._ready_event: Any = None
        self._forward_marked = False
        self._global_step_at_start = 0
        self._batch_taints: set[str] = set()
        self._step: StepRecord | None = None  # the step in progress (several batches under accumulation)
        self._last_result: tuple[int, StepRecord | None] = (-1, None)
        self._serial = 0
        self._compile_mark: tuple[int, float] | None = None
        self._steps_done = 0

    # -- the clock ------------------------------------------------------------------------------------
    def raw(self) -> float:
        """The raw clock (seconds)."""
        return float(self.clock())

    def now(self) -> float:
        """The clock with every labelled interval removed (seconds)."""
        raw = self.raw()
        open_for = raw - self._pause_start if self._pause_start is not None else 0.0
        return raw - self._paused - open_for

    def begin(self, category: str, label: str = "") -> None:
        """Open a labelled interval (use :meth:`interval` where a ``with`` block fits)."""
        raw = self.raw()
        if not self._stack:
            self._pause_start = raw
        if not any(c == category for c, _ in self._stack):
            self._category_start[category] = raw
        self._stack.append((category, label))

    def end(self, category: str, label: str = "") -> float:
        """Close the innermost open interval of ``category``; returns its length in seconds (0 if none was open)."""
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i][0] == category:
                _, opened_label = self._stack.pop(i)
                break
        else:
            return 0.0
        raw = self.raw()
        length = 0.0
        if not any(c == category for c, _ in self._stack):
            length = max(0.0, raw - self._category_start.pop(category, raw))
            self._add_total(category, opened_label or label, length)
        if not self._stack and self._pause_start is not None:
            paused = max(0.0, raw - self._pause_start)
            self._paused += paused
            self._excluded_since_end += paused
            self._pause_start = None
        return length

    def _add_total(self, category: str, label: str, seconds: float) -> None:
        self.totals[category] = self.totals.get(category, 0.0) + seconds
        if label:
            key = f"{category}:{label}"
            self.totals[key] = self.totals.get(key, 0.0) + seconds

    @contextlib.contextmanager
    def interval(self, category: str, label: str = "") -> Iterator[None]:
        """A labelled interval: the time inside is left out of every step, data-wait and throughput figure."""
        self.begin(category, label)
        try:
            yield
        finally:
            self.end(category, label)

    def instrument(self, label: str) -> contextlib.AbstractContextManager[None]:
        """Mark instrument work (trace export, a benchmark, ...): ``with timeline.instrument("my_export"): ...``."""
        return self.interval("instrument", label)

    @property
    def current(self) -> StepRecord | None:
        """The step in progress (its ``batches`` counts the micro-batches already ended), None between steps."""
        return self._step if self._in_batch or (self._step is not None and self._step.batches) else None

    @property
    def in_batch(self) -> bool:
        """True between a training batch's start and end marks."""
        return self._in_batch

    def in_interval(self, category: str) -> bool:
        return any(c == category for c, _ in self._stack)

    def taint(self, label: str) -> None:
        """Mark the batch in progress as holding instrument work that cannot be cut out (see the module docstring)."""
        self._batch_taints.add(label)

    # -- dispatch modes over one batch -----------------------------------------------------------------
    def enter_for_batch(
        self, mode: contextlib.AbstractContextManager[Any], on_error: Callable[[BaseException], None] | None = None
    ) -> None:
        """Enter ``mode`` (a FLOP counter, a memory tracker, any context) until the batch's end mark. Every mode
        entered for a batch is exited there, in reverse order, before any callback reads its result: torch's
        dispatch-mode stack is last in, first out, so two callbacks must not exit their own modes in hook order.
        A mode whose exit raises never reaches the user's step: ``on_error`` gets the exception (its owner turns
        itself off) and the modes outside it are still exited."""
        mode.__enter__()
        self._modes.append((mode, on_error))

    def exit_batch_modes(self) -> None:
        """Exit the modes entered for this batch (innermost first); nothing when none is open."""
        modes, self._modes = self._modes, []
        for mode, on_error in reversed(modes):
            try:
                mode.__exit__(None, None, None)
            except Exception as err:  # noqa: BLE001 - a measuring mode must not end the user's run
                if on_error is not None:
                    on_error(err)
                else:
                    warnings.warn(
                        f"lit_compute: leaving {type(mode).__name__} failed with {type(err).__name__}: "
                        f"{err}; training goes on.",
                        UserWarning,
                        stacklevel=2,
                    )

    # -- the training loop ------------------------------------------------------------------------------
    def train_start(self, trainer: pl.Trainer) -> None:
        """Fit or training (re)starts: forget marks of an earlier run (one that raised mid-batch included).
        Every lit_compute callback calls it at ``on_train_start``, before any batch: idempotent there."""
        self.device = trainer.strategy.root_device
        self._reset_loop()
        # an interval left open by an earlier run that raised inside it
        self._stack.clear()
        self._category_start.clear()
        self._pause_start = None
        self.stop_watching()
        self._device_comm = False
        if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            # "nccl", or "cuda:nccl,cpu:gloo" for a group with a backend per device type
            self._device_comm = self.device.type == "cuda" and "nccl" in str(torch.distributed.get_backend())
            self._watch = collective_clock.watch(self._collective, self._collective_mark)
        self._time_logger_writes(trainer)
        if self.token_spec is None:  # a datamodule that declares its padding id (TokenDataModule does)
            pad = getattr(getattr(trainer, "datamodule", None), "pad_token_id", None)
            if isinstance(pad, int):
                self.token_spec = TokenSpec(pad_id=pad)

    def stop_watching(self) -> None:
        """Stop timing collectives and logger writes (teardown, an exception); idempotent."""
        handle, self._watch = self._watch, None
        collective_clock.unwatch(handle)
        loggers, self._timed_loggers = self._timed_loggers, []
        for logger, wrapper in loggers:
            if getattr(logger, "__dict__", {}).get("log_metrics") is wrapper:
                del logger.log_metrics

    def _time_logger_writes(self, trainer: pl.Trainer) -> None:
        """Time every logger's ``log_metrics`` as instrument work (``logger_write``): rank 0 writes for the job, its own
        and Lightning's metrics, and that is not its share of the training (it made rank 0 look a straggler). The
        loggers' own method is restored by :meth:`stop_watching`; a logger whose ``log_metrics`` someone already
        replaced on the instance is left alone."""
        for logger in getattr(trainer, "loggers", None) or []:
            if "log_metrics" in getattr(logger, "__dict__", {"log_metrics": None}):
                continue  # replaced on the instance already (or an object without a __dict__): left alone
            original = logger.log_metrics

            def timed(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                with self.instrument("logger_write"):
                    return _original(*args, **kwargs)

            try:
                logger.log_metrics = timed
            except (AttributeError, TypeError):  # a logger that refuses instance attributes: not timed
                continue
            self._timed_loggers.append((logger, timed))

    def _collective_mark(self) -> tuple[float, Any]:
        """The clock :mod:`~lit_compute.collective_clock` reads at each end of a collective wait: this clock's time,
        and under NCCL a CUDA event recorded on the current stream (None elsewhere)."""
        return self.now(), self._cuda_event() if self._device_comm else None

    def _collective(self, start: tuple[float, Any], end: tuple[float, Any]) -> None:
        """A collective wait on the training thread: inside a batch it is the step's communication wait; between
        two batches (the logging all-reduce, an epoch-end ``sync_dist``) it is no wait for data, and the next
        batch's step gets it as communication. Its CUDA events (under NCCL) go with it."""
        seconds = max(0.0, end[0] - start[0])
        events = (start[1], end[1]) if start[1] is not None and end[1] is not None else None
        if not self._in_batch or self._step is None:
            if self._last_end is not None:
                self._comm_since_end += seconds
                if events is not None:
                    self._comm_events_since_end.append(events)
            return
        in_forward = not self._forward_marked
        self._step.comm_s += seconds
        if in_forward:
            self._step.forward_comm_s += seconds
        if events is not None:
            self._step._comm_events.append((*events, in_forward, False))

    def epoch_start(self) -> None:
        """A new epoch: the first batch's wait includes the loader's start, so its step is tainted."""
        if not self._in_batch:
            self._last_end = None
            self._last_end_event = None

    def batch_start(self, trainer: pl.Trainer, batch: Any) -> None:
        """The batch is ready (first caller per batch takes the mark)."""
        if self._in_batch:
            return
        self._in_batch = True
        self._serial += 1
        now = self.now()
        self._ready = now
        self._global_step_at_start = trainer.global_step
        self._compile_mark = _compat.compile_activity()
        if self._step is None:
            self._step = StepRecord(index=_compat.batches_that_stepped(trainer))
        step = self._step
        if self._last_end is None:
            step.taints.add("start")
        else:
            between = min(self._comm_since_end, max(0.0, now - self._last_end))
            step.wait_s += max(0.0, now - self._last_end - between)
            step.comm_s += between
            step._comm_events.extend((start, end, False, True) for start, end in self._comm_events_since_end)
        self._comm_since_end, self._comm_events_since_end = 0.0, []
        ready_event = self._cuda_event()
        if ready_event is not None:
            step._events.append((self._last_end_event, ready_event, None, self._excluded_since_end))
        self._ready_event, self._forward_marked = ready_event, False
        facts = read_batch(batch, self.token_spec)
        if step.samples is not None:
            step.samples = step.samples + facts.samples if facts.samples is not None else None
        if facts.tokens is not None:
            step.tokens = (step.tokens or 0) + facts.tokens
        if facts.real_tokens is not None:
            step.real_tokens = facts.real_tokens if step.real_tokens is None else step.real_tokens + facts.real_tokens

    def before_backward(self) -> None:
        """The batch's first backward begins (first caller per batch takes the mark): the span from the batch's
        arrival to here is its forward, which under DDP holds no gradient synchronisation, so it is this rank's
        own work (how stragglers are told apart)."""
        if not self._in_batch or self._forward_marked or self._step is None:
            return
        self._forward_marked = True
        self._step.forward_s += max(0.0, self.now() - self._ready)
        event = self._cuda_event()
        if event is not None and self._ready_event is not None:
            self._step._forward_events.append((self._ready_event, event))

    def batch_end(self, trainer: pl.Trainer) -> StepRecord | None:
        """The batch ended (first caller per batch takes the mark). Returns the step it completed, or None while
        gradients accumulate. Every later caller in the same batch gets the same answer."""
        if not self._in_batch:
            serial, record = self._last_result
            return record if serial == self._serial else None
        self._in_batch = False
        self.exit_batch_modes()
        now = self.now()
        step = self._step
        if step is None:  # pragma: no cover - batch_end without batch_start
            return None
        step.compute_s += max(0.0, now - self._ready)
        step.batches += 1
        end_event = self._cuda_event()
        if end_event is not None and step._events:
            prev_end, ready, _, excluded = step._events[-1]
            step._events[-1] = (prev_end, ready, end_event, excluded)
        self._last_end, self._last_end_event, self._excluded_since_end = now, end_event, 0.0
        self._comm_since_end, self._comm_events_since_end = 0.0, []
        step.taints |= self._batch_taints
        self._batch_taints = set()
        if _compat.compile_activity() != self._compile_mark:
            step.taints.add("compile")
        completed = _compat.batch_completes_step(trainer, self._global_step_at_start)
        record = None
        if completed:
            record, self._step = step, None
            self._steps_done += 1
            self.event = LogEvent("train", record.index, record=record)
        self._last_result = (self._serial, record)
        return record

    def _cuda_event(self) -> Any:
        if self.device is None or self.device.type != "cuda":
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    # -- evaluation -------------------------------------------------------------------------------------
    def evaluation_start(self, stage: str) -> None:
        if not self.in_interval("validation"):
            self.begin("validation", stage)

    def evaluation_end(self, trainer: pl.Trainer, stage: str) -> LogEvent:
        """Close the evaluation interval; the event of this evaluation run (one per run, first caller opens it)."""
        if self.in_interval("validation"):
            self.end("validation", stage)
        if self.event is None or self.event.stage != stage:
            self.event = LogEvent(stage, _compat.batches_that_stepped(trainer))
        return self.event

    # -- the one logging event ----------------------------------------------------------------------------
    def flush(self, trainer: pl.Trainer, participants: Sequence[Participant], stage: str) -> LogEvent | None:
        """Reduce the pending event of ``stage`` and finish its metrics; the event (None when there was none).

        Called once per event on every rank, with the same ``participants`` in the same order. The all-reduce's
        layout depends only on their ``reduce_keys`` and ``logs_at`` (configuration and the step number), never on
        what a rank contributed. Writing the event is the caller's job (:func:`lit_compute.writer.write_event`)."""
        event = self.event if self.event is not None and self.event.stage == stage else None
        self.event = None
        step = event.step if event is not None else _compat.batches_that_stepped(trainer)
        slots: list[tuple[int, str]] = []
        for p in participants:
            keys = tuple(p.reduce_keys.get(stage, ()))
            try:
                logs = p.logs_at(trainer, stage, step)
            except Exception:  # noqa: BLE001 - configuration arithmetic; never skip the collective on one rank
                logs = True
            if logs:
                slots += [(id(p), key) for key in keys]
        reduced: dict[tuple[int, str], float] = {}
        if slots:
            local = [event._reduce.get(slot, math.nan) if event is not None else math.nan for slot in slots]
            reduced = dict(zip(slots, _all_reduce_sum(trainer, local)))
        if event is None:
            return None
        for owner, finish in event._finish:
            values = {key: value for (pid, key), value in reduced.items() if pid == id(owner)}
            try:
                event.log(finish(values))
            except Exception as err:  # noqa: BLE001 - a measuring callback must not stop training
                owner.disable(f"computing its metrics failed with {type(err).__name__}: {err}")
        return event


def _all_reduce_sum(trainer: pl.Trainer, values: list[float]) -> list[float]:
    if trainer.world_size <= 1:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=trainer.strategy.root_device)
    out = trainer.strategy.reduce(tensor, reduce_op="sum")
    return [float(v) for v in out.detach().cpu().tolist()]


_TIMELINES: weakref.WeakKeyDictionary[Any, Timeline] = weakref.WeakKeyDictionary()


def timeline_for(trainer: pl.Trainer) -> Timeline:
    """The :class:`Timeline` of ``trainer`` (created on first use; the checkpoint interval is hooked then)."""
    timeline = _TIMELINES.get(trainer)
    if timeline is None:
        timeline = Timeline()
        _TIMELINES[trainer] = timeline
        _compat.mark_checkpoint_saving(trainer, timeline)
    return timeline
