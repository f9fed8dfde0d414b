"""FlopsLogger: model and hardware FLOPs per step counted from the real batches, TFLOP/s, MFU and HFU.

The hooks live here; the bookkeeping apart from them: counts by signature in
:class:`~lit_compute.flops.count_book.CountBook`, peaks and MFU in :mod:`lit_compute.flops.peaks`, evaluation sums
in :class:`~lit_compute.flops.eval_tally.EvalTally`, the warnings a count gives in
:mod:`lit_compute.flops.count_messages`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, Literal

from typing_extensions import override

from lit_compute import _batch, _compat
from lit_compute._batch import TokenSpec
from lit_compute._validate import Check, validated
from lit_compute.callback import MeasuringCallback, guarded, use_token_spec
from lit_compute.flops.count_book import CountBook, Values
from lit_compute.flops.count_messages import count_warnings
from lit_compute.flops.counting import (
    FlopCount,
    SafeFlopCounterMode,
    example_gflops_per_sample,
)
from lit_compute.flops.eval_tally import EvalTally
from lit_compute.flops.peaks import PeakPolicy, precision_dtype
from lit_compute.flops.table_writer import per_sample_flops, write_module_table, write_op_classes
from lit_compute.flops.train_tally import TrainTally, global_rates
from lit_compute.model_state import ModelState
from lit_compute.timeline import LogEvent, StepRecord
from lit_compute.writer import say

if TYPE_CHECKING:
    import lightning.pytorch as pl

_MAX_FAILED_COUNTS = 3
_STAGE_PREFIX = {"validate": "val", "test": "test"}


class FlopsLogger(MeasuringCallback):
    """Model and hardware FLOPs per training step, counted from the real batches; TFLOP/s, MFU and HFU.

    The first batch of each distinct signature (the paths, shapes and dtypes of its tensors, and the model's state:
    structure, train/eval modes, which parameters require gradients) runs its real ``training_step`` under
    :class:`~lit_compute.flops.SafeFlopCounterMode`, so training is bitwise unchanged; later batches of that
    signature reuse the count, new shapes of a counted structure are predicted (``predict_shapes``), and FLOPs
    found to depend on a batch's values are logged as estimates. A count that fails warns once and the step goes
    on; after three failed counts counting stops. The conventions (model vs hardware FLOPs, attention, parallel
    layouts), the timing and the table of logged tags (``compute/*``) are in the docs' FLOPs page (docs/flops.md).

    Args:
        log_every_n_steps: Log every n steps (default: the trainer's ``log_every_n_steps``).
        peak: ``"table"``: the device's dense peak in the training dtype from :data:`~lit_compute.flops.PEAK_TABLE`;
            ``"measure"``: this machine's dense GEMM peak, timed once on a quiet machine and cached
            (``$LIT_COMPUTE_CACHE/peaks.json``); ``"remeasure"``: time it again; ``"none"``: no MFU.
        peak_flops: Per-device peak FLOP/s; overrides ``peak``.
        module_depth: Depth of the per-module table.
        count_validation: Also count and log validation and test FLOPs.
        predict_shapes: Predict the counts of new batch shapes from counted ones (see above).
        tokens: Where the batch's token ids, padding mask or pad id are (None: auto-detect ``input_ids`` /
            ``attention_mask``, or the datamodule's ``pad_token_id``).

    Example:
        >>> import lightning.pytorch as pl
        >>> trainer = pl.Trainer(callbacks=[FlopsLogger(peak="measure")], max_steps=1, accelerator="cpu")
    """

    reduce_keys = {"train": ("tflops", "hw_tflops", "flops"), "validate": ("tflops",), "test": ("tflops",)}

    @validated
    def __init__(
        self,
        log_every_n_steps: Annotated[int | None, Check(ge=1)] = None,
        peak: Literal["table", "measure", "remeasure", "none"] = "table",
        peak_flops: Annotated[float | None, Check(gt=0, hint="FLOP/s per device")] = None,
        module_depth: Annotated[int, Check(ge=1)] = 2,
        count_validation: bool = True,
        predict_shapes: bool = True,
        tokens: TokenSpec | None = None,
    ) -> None:
        super().__init__()
        self.tokens = tokens
        self.log_every_n_steps = log_every_n_steps
        self.peak = peak
        self.peak_flops = peak_flops
        self.module_depth = module_depth
        self.count_validation = count_validation
        self.predict_shapes = predict_shapes
        self.book = CountBook(predict_shapes=predict_shapes, max_failures=_MAX_FAILED_COUNTS)
        self.peaks = PeakPolicy(peak, peak_flops)
        self.last_local_tflops: float | None = None  # this rank's figure at the last logging step (None: unknown)
        self._counting: tuple[tuple, SafeFlopCounterMode, float] | None = None
        self._model_state = ModelState()
        self._train_key: tuple[str, str, str, int] | None = None  # the model state of the last training batch
        self._reset_run()

    def _reset_run(self) -> None:
        self._table_logged = False
        self._batch_values: Values | None = None
        self._batch_estimated = False  # the batch's values are an estimate (a value-dependent signature)
        self._train = TrainTally()
        self._batch_sig: tuple | None = None
        self._eval = EvalTally()

    @property
    def counts(self) -> dict[tuple, FlopCount | None]:
        """Exact counts by signature (None: counting failed)."""
        return self.book.counts

    @property
    def counted_batches(self) -> int:
        return self.book.counted

    @property
    def predicted_batches(self) -> int:
        return self.book.predicted

    @override
    def state_dict(self) -> dict[str, Any]:
        return self.book.state_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.book.load_state_dict(state_dict)

    @override
    def logs_at(self, trainer: pl.Trainer, stage: str, step: int) -> bool:
        if stage == "train":
            return super().logs_at(trainer, stage, step)
        return self.count_validation and not trainer.sanity_checking

    # -- set-up ---------------------------------------------------------------------------------------
    @property
    def peak_used(self) -> float | None:
        """The per-device peak FLOP/s MFU is against (None: no MFU); ``peaks.source`` says where it came from."""
        return self.peaks.value

    @override
    def _setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        use_token_spec(self, trainer, self.tokens)
        self._reset_run()
        device, dtype = trainer.strategy.root_device, precision_dtype(trainer.precision)
        self.peaks = PeakPolicy(self.peak, self.peak_flops)  # the arguments as they are now
        with self.timeline.instrument("peak_measure"):
            measured = self.peaks.resolve(device, dtype)
        line, warnings = self.peaks.notes(measured)
        if line:
            say(trainer, line)
        for key, message in warnings:
            self._warn_once(key, message)

    def _utilisation(self, tflops: float, hw_tflops: float, world: int) -> dict[str, float]:
        """MFU, HFU and the peak for an event (:meth:`PeakPolicy.utilisation`: never above 1); a re-measured peak
        is instrument time."""
        with self.timeline.instrument("peak_measure"):
            metrics, warning = self.peaks.utilisation(tflops, hw_tflops, world)
        if warning:
            self._warn_once(f"peak:{warning[:60]}", warning)
        return metrics

    @override
    def _fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """With an ``example_input_array``: the forward GFLOPs per sample as an hparam, in Lightning's own (first,
        only) ``log_hyperparams`` call, which comes right after ``on_fit_start``."""
        if getattr(pl_module, "example_input_array", None) is None:
            return
        with self.timeline.instrument("flop_count"):
            gflops = example_gflops_per_sample(pl_module)
        if gflops is not None:
            _compat.add_initial_hparam(pl_module, "compute/forward_gflops_per_sample", gflops)

    # -- counting -------------------------------------------------------------------------------------
    def _begin_batch(self, pl_module: pl.LightningModule, stage: str, batch: Any, force: bool = False) -> None:
        key = self._model_state.key(pl_module)
        if stage == "train":
            if self._train_key is not None and key != self._train_key:
                say(
                    pl_module.trainer,
                    f"FlopsLogger: the model changed ({ModelState.describe(self._train_key, key)}); "
                    "its FLOPs are counted again",
                )
                self.book.forget_optimizer()  # its optimizer's step too
            self._train_key = key
        sig = (*_batch.signature(stage, batch), key)
        self._batch_sig = sig
        self._batch_values = self.book.values(sig)
        known = self._batch_values is not None
        self._batch_estimated = known and bool(self.book.estimated(sig))
        wanted = self.book.wants_recount(sig) if known else self.book.wants_count(sig)
        if not (wanted or (force and not self.book.exhausted)):
            return
        self._batch_estimated = False  # counted for real: exact for this batch
        counter = SafeFlopCounterMode.for_module(pl_module)
        self.timeline.enter_for_batch(_compat.eager_compiled_code())
        # exited at the batch's end mark, with every other mode of the batch; a counter whose exit raises turns us off
        self.timeline.enter_for_batch(counter, on_error=self._counter_failed)
        self._counting = (sig, counter, self.timeline.raw())

    def _end_batch(self, trainer: pl.Trainer) -> Values | None:
        """Close a count started for this batch; the batch's values (None when unknown)."""
        if self._counting is None:
            return self._batch_values
        sig, counter, _ = self._counting
        self._counting = None
        self.timeline.exit_batch_modes()
        if self._disabled:  # the counter failed as it left the step (_counter_failed)
            return None
        count = counter.result()
        booked = self.book.record(sig, count)
        for key, message in count_warnings(booked, count, sig, _MAX_FAILED_COUNTS):
            self._warn_once(key, message)
        if booked.values is None:
            return None
        if sig[0] == "train":
            self.peaks.refine(count.by_op)
            count = self.book.with_optimizer(sig, count)
            if trainer.is_global_zero and count.by_class:
                write_op_classes(trainer, count, sig)
        return booked.values

    def _counter_failed(self, err: BaseException) -> None:
        """The counter raised as it left the batch's modes: no count of this batch, and FlopsLogger turns itself off
        (one warning); the user's step is not touched."""
        self._counting = None
        self.disable(f"the FLOP counter failed as it left the step ({type(err).__name__}: {err})")

    # -- training -------------------------------------------------------------------------------------
    @override
    def _train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset_run()

    @override
    def _batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        # an accumulated step's first batch steps no optimizer: the first batch that does is counted too (once), so
        # the op-class table whatif prices holds the optimizer's step
        force = not self.book.optimizer_counted and _compat.batch_will_step(trainer)
        self._begin_batch(pl_module, "train", batch, force=force)
        self.book.optimizer_counted |= force and self._counting is not None
        if self._counting is not None:
            self.timeline.taint("flop_count")

    @override
    def _batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, record: StepRecord | None
    ) -> None:
        values = self._end_batch(trainer)
        self._train.add_batch(values, self.book.batch_bytes(self._batch_sig), self._batch_estimated)
        if not self._table_logged and self.book.first_train is not None and trainer.is_global_zero:
            self._table_logged = True
            write_module_table(trainer, self.book.first_train, self.module_depth, _batch.batch_size(batch))

    @override
    def _step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, record: StepRecord) -> None:
        if self.book.optimizer_bytes is not None:
            self._train.add_step_bytes(self.book.optimizer_bytes)
        self._train.end_step(record)

    @override
    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, event: LogEvent) -> None:
        if event.stage != "train":
            self._log_evaluation(trainer, event)
            return
        local, local_hw, seconds, padding = self._train.take_rates()
        self.last_local_tflops = local if math.isfinite(local) else None
        last = self._train.last
        per_sample = per_sample_flops(trainer, last[0], last[2]) if last is not None and last[2] else None
        event.log(
            {
                **({"compute/padding_fraction": padding} if padding is not None else {}),
                **({"compute/timed_seconds": seconds} if seconds > 0 else {}),
                **self._train.last_step_metrics(per_sample, self.book.any_estimated),
            }
        )
        step_flops = float(last[0]) if last is not None else math.nan

        def finish(reduced: dict[str, float]) -> dict[str, float]:
            out = global_rates(local, reduced)
            if "compute/global_tflops_per_sec" in out:
                out.update(self._utilisation(reduced["tflops"], reduced.get("hw_tflops", math.nan), trainer.world_size))
            return out

        event.contribute(self, {"tflops": local, "hw_tflops": local_hw, "flops": step_flops}, finish)

    @guarded
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self._counting is not None:
            self._counting[1].in_optimizer_step = True  # the optimizer's ops are their own op class

    # -- validation and test --------------------------------------------------------------------------
    @override
    def _eval_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._eval = EvalTally(start=self.timeline.raw(), instrument=self.timeline.totals.get("instrument", 0.0))

    @override
    def _eval_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str, batch: Any) -> None:
        if self.count_validation and not trainer.sanity_checking:
            self._begin_batch(pl_module, _STAGE_PREFIX[stage], batch)

    @override
    def _eval_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str, batch: Any) -> None:
        if not self.count_validation or trainer.sanity_checking:
            return
        counting = self._counting
        values = self._end_batch(trainer)
        counted_s = self.timeline.raw() - counting[2] if counting is not None else None  # instrument time
        self._eval.add_batch(values, _batch.batch_size(batch) or 0, counted_s, self._batch_estimated)

    def _log_evaluation(self, trainer: pl.Trainer, event: LogEvent) -> None:
        tally, prefix = self._eval, _STAGE_PREFIX.get(event.stage, event.stage)
        local = tally.tflops(self.timeline.raw(), self.timeline.totals.get("instrument", 0.0))
        per_sample = per_sample_flops(trainer, tally.flops, tally.samples) if tally.samples else None
        event.log(tally.per_step_metrics(prefix, per_sample, self.book.any_estimated))

        def finish(reduced: dict[str, float]) -> dict[str, float]:
            total = reduced.get("tflops", math.nan)
            if not (math.isfinite(local) and math.isfinite(total)):
                return {}
            mfu = self._utilisation(total, math.nan, trainer.world_size).get("compute/mfu")
            out = {f"compute/{prefix}_tflops_per_sec": local}
            return out if mfu is None else {**out, f"compute/{prefix}_mfu": mfu}

        event.contribute(self, {"tflops": local}, finish)

    # -- clean-up -------------------------------------------------------------------------------------
    @override
    def _teardown(self) -> None:
        self._counting = None  # its counter leaves the mode stack at the batch's end mark (or the exception's clean-up)
