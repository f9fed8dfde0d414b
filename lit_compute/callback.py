"""MeasuringCallback: the base of every lit_compute callback that measures, and of your own.

A measuring callback must never stop or change the training it measures, and every figure it logs must share
one clock, one notion of step and one logging event with lit_compute's other callbacks. This base does that
once: it implements Lightning's training, validation and test hooks, feeds the trainer's
:class:`~lit_compute.timeline.Timeline` from them, calls a few template methods under a guard, and lets the last
measuring callback of the trainer's list reduce the event (one all-reduce) and hand it to the writer (one
``log_metrics`` call). See ``docs/architecture.md`` for the flow of one step.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn
from typing_extensions import override

from lit_compute import agreement
from lit_compute._batch import TokenSpec
from lit_compute.timeline import LogEvent, Participant, StepRecord, Timeline, timeline_for
from lit_compute.writer import link_loggers, write_event

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["MeasuringCallback", "guarded", "measuring_callbacks", "resolve_every", "use_token_spec"]

F = TypeVar("F", bound=Callable[..., Any])

_EVAL_STAGES = ("validate", "test")


class MeasuringCallback(Callback):
    """A callback that measures and therefore must never stop training, fed by the shared timeline.

    **What the base does.** Lightning's hooks of the training, validation and test loops are implemented here,
    once. Each first feeds the trainer's :class:`~lit_compute.timeline.Timeline` (always, even when this callback
    is disabled, so marks and collectives stay identical on every rank), then calls the subclass's template
    method under a guard: an exception warns once with what failed and what is now disabled, calls
    :meth:`_teardown` and turns the callback off for the rest of the run; training goes on unchanged.

    **What a subclass implements** (each optional; decorate it with ``@override``):

    - ``_setup(trainer, pl_module, stage)``, ``_fit_start(trainer, pl_module)``, ``_train_start(trainer, pl_module)``;
    - ``_batch_start(trainer, pl_module, batch)`` and ``_batch_end(trainer, pl_module, batch, record)`` for every
      training batch (``record`` is the :class:`~lit_compute.timeline.StepRecord` the batch completed, or None
      while gradients accumulate);
    - ``_step_end(trainer, pl_module, record)`` after every step (bookkeeping: windows, running sums);
    - ``_log(trainer, pl_module, event)`` when the step or the evaluation run logs, that is when
      :meth:`logs_at` says so: ``event.log({...})`` adds metrics, and values that need every rank go through
      ``event.contribute(self, {key: value}, finish)`` with the keys declared in :attr:`reduce_keys`;
      ``finish(sums)`` returns the metrics to log once the sums over ranks are known;
    - ``_eval_start``, ``_eval_batch_start``, ``_eval_batch_end`` for validation and test (``stage`` is
      ``"validate"`` or ``"test"``);
    - ``_teardown()``: remove hooks, stop profilers (called on disable, on exception and at teardown).

    :attr:`timeline` is the trainer's timeline (set at ``setup``): its clock (:meth:`~Timeline.now`), labelled
    intervals (``with self.timeline.instrument("my_work"): ...`` leaves your own work out of every figure) and
    taints.

    **The one logging event.** Every lit_compute callback's metrics of one step share one step number (the one
    Lightning's ``self.log`` uses) and one ``log_metrics`` call; everything reduced over ranks shares one
    all-reduce whose layout depends only on :attr:`reduce_keys` and :meth:`logs_at` (configuration and step),
    never on a rank's own data, so no rank can wait for a collective another rank skipped.

    Attributes:
        reduce_keys: Keys this callback puts into the all-reduce of an event, per stage (``"train"``,
            ``"validate"``, ``"test"``).
        log_every_n_steps: The callback's own logging interval (None: the trainer's ``log_every_n_steps``).
        timeline: The trainer's timeline (set at ``setup``).

    Example:
        >>> import math
        >>> class GradNormMonitor(MeasuringCallback):
        ...     reduce_keys = {"train": ("grad_norm_sq",)}
        ...     def __init__(self, log_every_n_steps: int | None = None) -> None:
        ...         super().__init__()
        ...         self.log_every_n_steps = log_every_n_steps
        ...         self.last_norm_sq = math.nan
        ...     def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        ...         grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        ...         self.last_norm_sq = float(sum(g.pow(2).sum() for g in grads)) if grads else math.nan
        ...     def _log(self, trainer, pl_module, event):
        ...         event.contribute(self, {"grad_norm_sq": self.last_norm_sq},
        ...                          lambda sums: {"train/grad_norm_rms": math.sqrt(sums["grad_norm_sq"]
        ...                                                                          / trainer.world_size)})
    """

    #: Keys this callback puts into the all-reduce of an event, per stage ("train", "validate", "test").
    reduce_keys: Mapping[str, tuple[str, ...]] = {}
    #: The callback's own logging interval (None: the trainer's ``log_every_n_steps``).
    log_every_n_steps: int | None = None

    def __init__(self) -> None:
        super().__init__()
        self._trainer_timeline: Timeline | None = None
        self._disabled = False
        self._warned: set[str] = set()

    # -- the logging rule -------------------------------------------------------------------------------
    def logs_at(self, trainer: pl.Trainer, stage: str, step: int) -> bool:
        """Whether this callback logs in the event of ``stage`` at ``step``: training steps where
        ``(step + 1) % log_every_n_steps == 0``, as Lightning logs; no evaluation event by default.

        Must depend only on configuration, the stage and the step: it decides the layout of the event's
        all-reduce on every rank."""
        if stage == "train":
            return (step + 1) % resolve_every(trainer, self.log_every_n_steps) == 0
        return False

    # -- warn once, disable once ----------------------------------------------------------------------
    def _warn_once(self, key: str, message: str) -> None:
        warned = self.__dict__.setdefault("_warned", set())
        if key not in warned:
            warned.add(key)
            rank_zero_warn(message, category=UserWarning)

    def disable(self, reason: str) -> None:
        """Turn this callback off for the rest of the run: one warning saying ``reason`` and that training goes on,
        then :meth:`_teardown`. Its hooks still feed the timeline and the event's all-reduce (with NaN)."""
        if self._disabled:
            return
        self._disabled = True
        message = f"{type(self).__name__}: {reason}. {type(self).__name__} is now disabled; training goes on."
        rank = int(getattr(rank_zero_only, "rank", 0) or 0)
        if rank == 0:
            self._warn_once("disabled", message)
        else:  # a failure on one rank is that rank's news: rank_zero_warn would swallow it
            warnings.warn(f"[rank {rank}] {message}", UserWarning, stacklevel=2)
        with contextlib.suppress(Exception):  # teardown of a broken callback must not raise either
            self._teardown()

    def _guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._disabled:
            return None
        try:
            return fn(*args)
        except Exception as err:  # noqa: BLE001 - by design: measuring must not kill the run
            self.disable(f"{fn.__name__.lstrip('_')} failed with {type(err).__name__}: {err}")
            return None

    # -- template methods (see the class docstring) -----------------------------------------------------
    def _setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None: ...

    def _fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None: ...

    def _train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None: ...

    def _batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None: ...

    def _batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, record: StepRecord | None
    ) -> None: ...

    def _step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, record: StepRecord) -> None: ...

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, event: LogEvent) -> None: ...

    def _eval_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None: ...

    def _eval_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str, batch: Any) -> None: ...

    def _eval_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str, batch: Any) -> None: ...

    def _teardown(self) -> None:
        """Remove hooks / stop profilers. Overridden by subclasses."""

    # -- the Lightning hooks, once for every measuring callback ---------------------------------------
    @property
    def timeline(self) -> Timeline:
        """The trainer's timeline, set at ``setup`` (a ``RuntimeError`` before it)."""
        if self._trainer_timeline is None:
            raise RuntimeError(f"{type(self).__name__}.timeline is set at setup; this callback has not been set up")
        return self._trainer_timeline

    def _timeline(self, trainer: pl.Trainer) -> Timeline:
        self._trainer_timeline = timeline_for(trainer)
        return self._trainer_timeline

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._timeline(trainer)
        link_loggers(trainer)
        measuring = measuring_callbacks(trainer)
        if measuring and measuring[0] is self:  # once per set-up, on every rank
            self._agree(trainer, pl_module, measuring)
        self._guard(self._setup, trainer, pl_module, stage)

    def _agree(self, trainer: pl.Trainer, pl_module: pl.LightningModule, measuring: list[MeasuringCallback]) -> None:
        """The ranks must run with the same settings (:mod:`lit_compute.agreement`): one all-reduce; a mismatch
        raises :class:`~lit_compute.agreement.ConfigMismatchError` on every rank, before the first step."""
        try:
            values = agreement.settings(trainer, pl_module, measuring)
        except Exception as err:  # noqa: BLE001 - the collective still runs, with what every failing rank knows
            self._warn_once(
                "agreement",
                f"{type(self).__name__}: reading the settings the ranks must agree on failed "
                f"({type(err).__name__}: {err}); they are not compared.",
            )
            values = {"settings": "unknown"}
        agreement.check(trainer, values)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._guard(self._fit_start, trainer, pl_module)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._timeline(trainer).train_start(trainer)
        self._guard(self._train_start, trainer, pl_module)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._timeline(trainer).epoch_start()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._timeline(trainer).batch_start(trainer, batch)
        self._guard(self._batch_start, trainer, pl_module, batch)

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
        if trainer.training:
            self._timeline(trainer).before_backward()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        timeline = self._timeline(trainer)
        record = timeline.batch_end(trainer)
        # what lit_compute does after the batch's end mark (its bookkeeping, computing its metrics, the logging
        # all-reduce and writing) is its own work, on every rank: left out of the next batch's data wait, where rank
        # 0's larger share of it made it look slower than evenly loaded ranks logging every step
        with timeline.instrument("log_event"):
            self._guard(self._batch_end, trainer, pl_module, batch, record)
            if record is None:
                return
            event = timeline.event
            if event is not None and event.stage == "train":
                self._guard(self._step_end, trainer, pl_module, record)
                self._guard(self._log_event, trainer, pl_module, event)
            self._flush_if_last(trainer, timeline, "train")

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._evaluation_start(trainer, pl_module, "validate")

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._guard(self._eval_batch_start, trainer, pl_module, "validate", batch)

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._timeline(trainer).exit_batch_modes()
        self._guard(self._eval_batch_end, trainer, pl_module, "validate", batch)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._evaluation_end(trainer, pl_module, "validate")

    @override
    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._evaluation_start(trainer, pl_module, "test")

    @override
    def on_test_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._guard(self._eval_batch_start, trainer, pl_module, "test", batch)

    @override
    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._timeline(trainer).exit_batch_modes()
        self._guard(self._eval_batch_end, trainer, pl_module, "test", batch)

    @override
    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._evaluation_end(trainer, pl_module, "test")

    def _evaluation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._timeline(trainer).evaluation_start(stage)
        self._guard(self._eval_start, trainer, pl_module, stage)

    def _evaluation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        timeline = self._timeline(trainer)
        event = timeline.evaluation_end(trainer, stage)
        self._guard(self._log_event, trainer, pl_module, event)
        self._flush_if_last(trainer, timeline, stage)

    def _log_event(self, trainer: pl.Trainer, pl_module: pl.LightningModule, event: LogEvent) -> None:
        if self.logs_at(trainer, event.stage, event.step):
            self._log(trainer, pl_module, event)

    def _flush_if_last(self, trainer: pl.Trainer, timeline: Timeline, stage: str) -> None:
        measuring = measuring_callbacks(trainer)
        if measuring and measuring[-1] is self:
            write_event(trainer, timeline.flush(trainer, cast("list[Participant]", measuring), stage))

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        try:
            timeline = self._timeline(trainer)
            timeline.exit_batch_modes()
            timeline.stop_watching()
        except Exception:  # noqa: BLE001 - clean-up after an exception must not raise a second one
            pass
        self._safe_teardown()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        with contextlib.suppress(Exception):  # clean-up must not raise
            self._timeline(trainer).stop_watching()
        self._safe_teardown()

    def _safe_teardown(self) -> None:
        try:
            self._teardown()
        except Exception as err:  # noqa: BLE001 - clean-up after an exception must not raise a second one
            self._warn_once("teardown", f"{type(self).__name__}: cleaning up failed with {type(err).__name__}: {err}.")


def measuring_callbacks(trainer: pl.Trainer) -> list[MeasuringCallback]:
    """The trainer's measuring callbacks, in the order Lightning calls them (the event's participants)."""
    callbacks = cast(Any, trainer).callbacks  # set on the Trainer by Lightning's callback connector, undeclared
    return [cb for cb in callbacks if isinstance(cb, MeasuringCallback)]


def guarded(fn: F) -> F:
    """Decorate a :class:`MeasuringCallback` hook the base does not route: skip when disabled, disable on any
    exception."""

    @functools.wraps(fn)
    def wrapper(self: MeasuringCallback, *args: Any, **kwargs: Any) -> Any:
        if self._disabled:
            return None
        try:
            return fn(self, *args, **kwargs)
        except Exception as err:  # noqa: BLE001 - by design: measuring must not kill the run
            self.disable(f"{fn.__name__} failed with {type(err).__name__}: {err}")
            return None

    return wrapper  # type: ignore[return-value]


def resolve_every(trainer: pl.Trainer, every: int | None) -> int:
    """The logging interval in steps: ``every`` or the trainer's ``log_every_n_steps``."""
    return max(1, int(every if every is not None else cast(Any, trainer).log_every_n_steps or 1))


def use_token_spec(owner: MeasuringCallback, trainer: pl.Trainer, spec: TokenSpec | None) -> None:
    """Install a callback's ``tokens=`` on the trainer's timeline (one spec per trainer; a different second one
    warns)."""
    if spec is None:
        return
    timeline = timeline_for(trainer)
    if timeline.token_spec is not None and timeline.token_spec != spec:
        owner._warn_once(
            "tokens",
            f"{type(owner).__name__}(tokens={spec}) differs from {timeline.token_spec}, which "
            "another lit_compute callback set; the first one is used.",
        )
        return
    timeline.token_spec = spec
