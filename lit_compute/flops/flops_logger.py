"""FlopsLogger: model and hardware FLOPs per step counted from the real batches, TFLOP/s, MFU and HFU.

The hooks live here; the bookkeeping apart from them: counts by signature in
:class:`~lit_compute.flops.count_book.CountBook`, peaks in :mod:`lit_compute.flops.peaks`, evaluation sums in
:class:`EvalTally`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import torch
from typing_extensions import override

from lit_compute import _batch, _compat
from lit_compute._batch import TokenSpec
from lit_compute._validate import Check, validated
from lit_compute.callback import MeasuringCallback, guarded, use_token_spec
from lit_compute.flops.count_book import CountBook, Values
from lit_compute.flops.counting import (
    FlopCount,
    SafeFlopCounterMode,
    count_flops,
    is_sharded,
    sharded_module_names,
)
from lit_compute.flops.peaks import PeakPolicy, precision_dtype
from lit_compute.flops.tables import module_table, op_class_table
from lit_compute.formatting import flops_rate, human
from lit_compute.model_state import ModelState
from lit_compute.timeline import LogEvent, StepRecord
from lit_compute.writer import log_scalars, log_text, save_hparam, say

if TYPE_CHECKING:
    import lightning.pytorch as pl

_MAX_FAILED_COUNTS = 3
_STAGE_PREFIX = {"validate": "val", "test": "test"}


def batch_signature(stage: str, batch: Any) -> tuple:
    """Paths, shapes and dtypes of every tensor in a batch (dataclasses and custom objects included), and the
    stage: one FLOP count per distinct signature."""
    return _batch.signature(stage, batch)


@dataclass
class EvalTally:
    """One evaluation run's FLOPs, samples and clean time. Every batch's FLOPs count in the per-step and per-sample
    figures, counted batches included; a counted batch's time is instrument time, so the rate is taken over the
    other batches."""

    start: float = 0.0  # raw clock at the run's start
    instrument: float = 0.0  # the timeline's instrument total at the run's start
    flops: int = 0
    samples: int = 0
    batches: int = 0
    timed_flops: int = 0  # FLOPs of the batches that were not counted (their time is the run's clean time)
    valid: bool = True  # False once a batch's FLOPs were unknown
    estimated: bool = False  # True once a batch's FLOPs were an estimate (a value-dependent signature)
    excluded: float = 0.0  # seconds of counted batches

    def add(self, flops: int, samples: int, timed: bool) -> None:
        self.flops += flops
        self.samples += samples
        self.batches += 1
        if timed:
            self.timed_flops += flops

    def tflops(self, raw_now: float, instrument_now: float) -> float:
        """Model TFLOP/s over the run's clean time; NaN when unknown."""
        if not (self.timed_flops and self.valid):
            return math.nan
        elapsed = raw_now - self.start - (instrument_now - self.instrument) - self.excluded
        return self.timed_flops / elapsed / 1e12 if elapsed > 0 else math.nan


class FlopsLogger(MeasuringCallback):
    """Model and hardware FLOPs per training step, counted from the real batches; TFLOP/s, MFU and HFU.

    **Counting.** The first batch of each distinct *signature* (paths, shapes and dtypes of every tensor in the
    batch, inside dataclasses and custom objects too) runs its real ``training_step`` - forward, loss, every
    backward and every optimizer step of the batch, however many optimizers - under
    :class:`~lit_compute.flops.SafeFlopCounterMode` (hookless module tracking: ``torch.autograd.grad`` and
    double backward keep working). Nothing else happens in that step: it is the step the trainer runs anyway,
    so training is bitwise unchanged. ``torch.compile``d code runs eagerly during that one step so every op is
    seen. If counting a batch fails, the batch's count is abandoned with one warning and the step completes as
    without FlopsLogger; after three failed counts counting stops.

    **The model as it changes.** A count's key is the batch signature and the model's state: its module
    structure, each module's train/eval mode and which parameters require gradients
    (:class:`~lit_compute.model_state.ModelState`), so unfreezing a backbone (``BackboneFinetuning``), a
    mode switch inside ``training_step`` or a model grown between epochs is counted again.

    **Value-dependent FLOPs.** Where a batch's FLOPs depend on its values, not only its shapes (the nested
    tensors of ``nn.TransformerEncoder``'s fast path with a padding mask, packed sequences, a data-dependent
    branch), a count holds for that batch only. Such signatures are found when the count runs a nested-tensor
    or packing op, or when a recount of a signature (at its 16th, 64th, 256th... occurrence) differs; one warning
    names the module, later batches of that signature get the mean of its real counts, and
    ``compute/flops_estimated`` (``compute/val_flops_estimated``) says where a logged figure used one.

    **Variable shapes.** With ``predict_shapes=True`` new signatures of a structure already counted several
    times are predicted by an exact polynomial fit of the counts in the varying dimensions (see
    :mod:`lit_compute.flops.predict`); one new shape in 25 is still counted to check the fit, and a miss
    above 0.1% turns prediction off for that structure. Variable-length token batches are then counted a
    handful of times per run, not once per length.

    Convention: one multiply-add = 2 FLOPs; matmul, convolution, attention, expert and RNN matmuls are counted,
    elementwise ops are not (the convention of torchvision's published figures and of MFU). *Model FLOPs*
    (MFU, ``flops_per_step``, the per-module table): forward and backward of the model as written, no
    activation recomputation, attention backward = 2 x forward. *Hardware FLOPs* (HFU): everything executed,
    recomputation included (PaLM's definitions).

    **Parallel layouts.** Hardware FLOPs are what *this device executed*: under DDP and FSDP2 the whole model on
    its own batch; under tensor parallelism (DTensor, ``ModelParallelStrategy``) each sharded op at the local
    shapes DTensor ran it at, after any redistribution, and the work every tensor-parallel peer repeats (modules
    left whole: embeddings, norms, a tied head; ops on replicated DTensors) in full. Model FLOPs count that repeated
    work once per data-parallel replica: each of ``t`` peers counts ``1/t`` of it. ``global_tflops_per_sec`` sums the
    devices, so the model FLOPs of one global batch are the unsharded model's whatever the layout, MFU means the same
    thing under DDP, FSDP2 and tensor parallelism, and HFU includes the repeated work. The layout is in the run's
    ``lit_compute/run`` table.

    Timing: from the shared timeline (:mod:`lit_compute.timeline`): the steps between two logging steps, each
    from the previous step's end to its own (data wait, forward, backward, optimizer), with instrument work,
    validation and checkpoint saving removed, and steps tainted by instrument work (a counted step, a profiled
    window, compilation, the first batch of an epoch) left out. On CUDA the times come from CUDA events read at
    logging steps (one synchronisation per logging step). ``global_tflops_per_sec`` sums every rank's figure in
    one all-reduce at every logging step on every rank (NaN from a rank that knows nothing).

    Logged metrics:
        - ``compute/flops_per_step``: model FLOPs this device executed in the logging step (forward + backward of
          every micro-batch accumulated into it; under tensor parallelism its shards' share).
        - ``compute/hardware_flops_per_step``: hardware FLOPs of the same step.
        - ``compute/global_flops_per_step``: model FLOPs of the logging step summed over all ranks: one global
          batch's FLOPs, the same under DDP, FSDP2 and tensor parallelism.
        - ``compute/flops_per_sample``: the model's FLOPs per training sample (this device's FLOPs x its
          tensor-parallel peers / the samples of its batch).
        - ``compute/tflops_per_sec``: achieved model TFLOP/s of this device (rank 0's).
        - ``compute/global_tflops_per_sec``: achieved model TFLOP/s summed over all ranks.
        - ``compute/mfu``: ``global_tflops_per_sec / (world_size * peak_tflops)``.
        - ``compute/hfu``: the same from hardware FLOPs.
        - ``compute/peak_tflops``: the per-device peak used as the denominator.
        - ``compute/gflops_per_sec``, ``compute/global_gflops_per_sec``, ``compute/val_gflops_per_sec``,
          ``compute/peak_gflops`` (TensorBoard only): the FLOP/s figures in GFLOP/s (``mflops`` in MFLOP/s) when
          the run's first achieved FLOP/s is under 1 TFLOP/s (a CPU), for the Custom Scalars charts
          (:class:`~lit_compute.writer.Writer` writes them).
        - ``compute/timed_seconds``: this device's clean time the TFLOP/s, MFU and HFU of the logging step were
          measured over (``lit-compute report`` weighs each window by it: total work over total time).
        - ``compute/flops_estimated`` (``compute/val_flops_estimated``): logged once a batch's FLOPs were found to
          depend on its values (see *Value-dependent FLOPs*): 1 when the logged FLOPs used an estimate, else 0.
        - ``compute/val_flops_per_step``, ``compute/val_flops_per_sample``, ``compute/val_tflops_per_sec``,
          ``compute/val_mfu`` (and ``compute/test_*`` under ``trainer.test``): the same for evaluation (forward
          only), once per evaluation run.
        - ``compute/padding_fraction``: token batches with padding (an ``attention_mask``, or a pad id): the share of
          computed positions that were padding, over the steps since the last log.
        - ``compute/forward_gflops_per_sample``: the model's forward GFLOPs per sample, once (at step 0); also an
          hparam: with an ``example_input_array`` counted at fit start (TensorBoard's HParams tab and
          ``hparams.yaml``), otherwise added to ``hparams.yaml`` at the first counted batch.
        - text ``compute/flops_by_module`` (model FLOPs per module, with the bytes its ops move and their FLOPs per
          byte; TensorBoard only).
        - ``compute/bytes_per_step``: the bytes the logging step's ops read and wrote (forward, backward, the
          optimizer's step; views none), when every batch of it was counted for real (none for predicted shapes).
        - text ``compute/op_classes``: at each training batch counted for real, its hardware FLOPs, bytes and kernels
          by op class (matmul, attention, norm, elementwise, optimizer) with their arithmetic intensity: what
          ``lit-compute whatif`` prices on other hardware.

    Args:
        log_every_n_steps: Log every n steps (default: the trainer's ``log_every_n_steps``).
        peak: ``"table"``: the dense peak of the device and dtype from :data:`~lit_compute.flops.PEAK_TABLE`
            (float32 on CUDA: TF32 for the convolutions and matmuls whose TF32 switch is on, weighted by their
            counted FLOPs); ``"measure"``: the dense GEMM peak of this machine in the training dtype, timed once
            and cached with the conditions it was measured under (``$LIT_COMPUTE_CACHE/peaks.json``, keyed by device,
            dtype, threads and torch version: how MFU works on CPUs and GPUs missing from the table, comparable
            between runs); ``"remeasure"``: time it again and replace the cached value; ``"none"``: no MFU.
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
        self._bytes: dict[tuple, int] = {}  # bytes of each exactly counted training signature
        self.last_local_tflops: float | None = None  # this rank's figure at the last logging step (None: unknown)
        self._counting: tuple[tuple, SafeFlopCounterMode, float] | None = None
        self._model_state = ModelState()
        self._train_key: tuple[str, str, str, int] | None = None  # the model state of the last training batch
        self._reset_run()

    def _reset_run(self) -> None:
        self._table_logged = False
        self._batch_values: Values | None = None
        self._batch_estimated = False  # the batch's values are an estimate (a value-dependent signature)
        self._step = [0, 0, 0]  # model forward, model backward, hardware FLOPs of the step in progress
        self._step_known = True
        self._step_bytes: int | None = 0  # bytes of the step in progress (None: a batch of unknown bytes)
        self._last_bytes: int | None = None
        self._batch_sig: tuple | None = None
        self._step_estimated = False
        self._last_estimated = False
        self._window: list[tuple[StepRecord, int, int]] = []
        self._token_steps: list[StepRecord] = []  # every step's tokens since the last log (padding fraction)
        self._last: tuple[int, int, int | None] | None = None  # (model, hardware, samples) of the last step
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
        if measured is not None:
            say(trainer, f"FlopsLogger: peak {flops_rate(measured.flops / 1e12)} ({dtype}, {device}), "
                f"{measured.describe()}" + (" (peak='remeasure' measures again)" if measured.cached else ""))
            if not measured.quiet:
                self._warn_once("busy-peak", f"FlopsLogger: the peak was measured while other processes used the "
                                f"CPUs ({measured.describe()}); MFU is against it for this run only.")
        elif self.peaks.value is None and self.peak == "table":
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{device.type} device"
            self._warn_once("no-peak", f"FlopsLogger(peak='table') has no peak for {name} in {dtype}; MFU is not "
                            "logged. Use FlopsLogger(peak='measure') to measure one, or peak_flops=<FLOP/s> to set it.")

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
        example = getattr(pl_module, "example_input_array", None)
        if example is None or is_sharded(pl_module):  # FSDP2 sets itself up at the strategy's first forward, not ours
            return
        training = pl_module.training
        try:  # in eval mode under no_grad, as Lightning's model summary runs the example (BatchNorm takes a batch of 1)
            pl_module.eval()
            with self.timeline.instrument("flop_count"), torch.no_grad():
                args = example if isinstance(example, tuple) else (example,)
                kwargs = example if isinstance(example, dict) else {}
                count = count_flops(pl_module, *(() if kwargs else args), backward=False, **kwargs)
        except Exception:  # noqa: BLE001 - an example the model cannot take: the scalar comes with the first count
            return
        finally:
            pl_module.train(training)
        samples = _batch.batch_size(example)
        if count.forward and samples:
            _compat.add_initial_hparam(pl_module, "compute/forward_gflops_per_sample", count.forward / samples / 1e9)

    # -- counting -------------------------------------------------------------------------------------
    def _begin_batch(self, pl_module: pl.LightningModule, stage: str, batch: Any) -> None:
        key = self._model_state.key(pl_module)
        if stage == "train":
            if self._train_key is not None and key != self._train_key:
                say(pl_module.trainer, f"FlopsLogger: the model changed ({ModelState.describe(self._train_key, key)}); "
                    "its FLOPs are counted again")
            self._train_key = key
        sig = (*batch_signature(stage, batch), key)
        self._batch_sig = sig
        self._batch_values = self.book.values(sig)
        known = self._batch_values is not None
        self._batch_estimated = known and bool(self.book.estimated(sig))
        if not (self.book.wants_recount(sig) if known else self.book.wants_count(sig)):
            return
        self._batch_estimated = False  # counted for real: exact for this batch
        counter = SafeFlopCounterMode(display=False, depth=99, module_paths=pl_module, hookless=True)
        peers = _compat.parallel_layout(pl_module.trainer).tensor_parallel
        if peers > 1:
            counter.replicated_share = 1.0 / peers
            counter.sharded_modules = sharded_module_names(pl_module)
        self.timeline.enter_for_batch(_compat.eager_compiled_code())
        self.timeline.enter_for_batch(counter)  # exited at the batch's end mark, with every other mode of the batch
        self._counting = (sig, counter, self.timeline.raw())

    def _end_batch(self, trainer: pl.Trainer) -> Values | None:
        """Close a count started for this batch; the batch's values (None when unknown)."""
        if self._counting is None:
            return self._batch_values
        sig, counter, _ = self._counting
        self._counting = None
        self.timeline.exit_batch_modes()
        count = counter.result()
        booked = self.book.record(sig, count)
        if booked.values is None:
            self._warn_once("count-failed", f"FlopsLogger could not count the FLOPs of batches {_short(sig)}: "
                            f"{booked.reason}. Nothing is logged for them; training goes on.")
            if booked.exhausted:
                self._warn_once("count-off", f"FlopsLogger: counting failed for {_MAX_FAILED_COUNTS} batch shapes; "
                                "counting is now off (FlopsLogger logs nothing more); training goes on.")
            return None
        if count.uncounted_ops:
            self._warn_once("uncounted", f"FlopsLogger: ops without a FLOP formula ran ({', '.join(count.uncounted_ops)}); "
                            "the counts are lower bounds. Register a formula with "
                            "torch.utils.flop_counter.register_flop_formula.")
        if count.unnamed_modules:
            named = ", ".join(f"{cls} ({why})" for cls, why in sorted(count.unnamed_modules.items())[:3])
            self._warn_once("unnamed", f"FlopsLogger: the module tracker could not name {named}; their FLOPs are in "
                            "every total but not under their own names in compute/flops_by_module (the table is "
                            "incomplete there).")
        if booked.value_dependent:
            self._warn_once(f"value-dependent:{booked.value_dependent}", "FlopsLogger: the FLOPs of batches "
                            f"{_short(sig)} depend on their values, not only their shapes ({booked.value_dependent}); "
                            "batches of these shapes that are not counted for real get the mean of the real counts, "
                            "an estimate, and compute/flops_estimated (or compute/val_flops_estimated) is 1 where "
                            "the logged figure used one.")
        if booked.prediction_missed:
            self._warn_once("prediction-miss", f"FlopsLogger: the predicted count of batches {_short(sig)} missed the "
                            "real count; their shapes are counted for real from now on.")
        if sig[0] == "train":
            self.peaks.refine(count.by_op)
            self._bytes[sig] = count.bytes
            self._log_op_classes(trainer, count, sig)
        return booked.values

    # -- training -------------------------------------------------------------------------------------
    @override
    def _train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset_run()

    @override
    def _batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        self._begin_batch(pl_module, "train", batch)
        if self._counting is not None:
            self.timeline.taint("flop_count")

    @override
    def _batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                   record: StepRecord | None) -> None:
        values = self._end_batch(trainer)
        if values is None:
            self._step_known = False
        else:
            self._step = [a + b for a, b in zip(self._step, values)]
        moved = self._bytes.get(self._batch_sig) if self._batch_sig is not None else None
        self._step_bytes = self._step_bytes + moved if self._step_bytes is not None and moved is not None else None
        self._step_estimated |= self._batch_estimated
        self._log_table_once(trainer, batch)

    @override
    def _step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, record: StepRecord) -> None:
        model, hardware = self._step[0] + self._step[1], self._step[2]
        known, self._step, self._step_known = self._step_known, [0, 0, 0], True
        self._last_bytes, self._step_bytes = self._step_bytes, 0
        self._last = (model, hardware, record.samples) if known else None
        self._last_estimated, self._step_estimated = self._step_estimated, False
        if known and record.clean:
            self._window.append((record, model, hardware))
        if record.tokens is not None and record.real_tokens is not None:
            self._token_steps.append(record)

    @override
    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, event: LogEvent) -> None:
        if event.stage != "train":
            self._log_evaluation(trainer, event)
            return
        window, self._window = self._window, []
        token_steps, self._token_steps = self._token_steps, []
        positions = sum(r.tokens or 0 for r in token_steps)
        if positions:
            real = sum(r.real_token_count() or 0 for r in token_steps)
            event.log({"compute/padding_fraction": 1.0 - real / positions})
        seconds = sum(sum(r.device_times()) for r, _, _ in window)
        local = sum(m for _, m, _ in window) / seconds / 1e12 if seconds > 0 and window else math.nan
        local_hw = sum(h for _, _, h in window) / seconds / 1e12 if seconds > 0 and window else math.nan
        self.last_local_tflops = local if math.isfinite(local) else None
        if seconds > 0 and window:
            event.log({"compute/timed_seconds": seconds})
        if self._last is not None:
            step_model, step_hw, samples = self._last
            event.log({"compute/flops_per_step": step_model, "compute/hardware_flops_per_step": step_hw})
            if self._last_bytes:
                event.log({"compute/bytes_per_step": float(self._last_bytes)})
            if samples:
                event.log({"compute/flops_per_sample": _per_sample(trainer, step_model, samples)})
            if self.book.any_estimated:
                event.log({"compute/flops_estimated": float(self._last_estimated)})
        world = trainer.world_size
        step_flops = float(self._last[0]) if self._last is not None else math.nan

        def finish(reduced: dict[str, float]) -> dict[str, float]:
            total, total_hw = reduced.get("tflops", math.nan), reduced.get("hw_tflops", math.nan)
            out = {}
            if math.isfinite(reduced.get("flops", math.nan)):
                out["compute/global_flops_per_step"] = reduced["flops"]
            if not (math.isfinite(local) and math.isfinite(total)):
                return out
            out.update({"compute/tflops_per_sec": local, "compute/global_tflops_per_sec": total})
            return {**out, **self._utilisation(total, total_hw, world)}

        event.contribute(self, {"tflops": local, "hw_tflops": local_hw, "flops": step_flops}, finish)

    def _log_table_once(self, trainer: pl.Trainer, batch: Any) -> None:
        count = self.book.first_train
        if count is None or self._table_logged or not trainer.is_global_zero:
            return
        self._table_logged = True
        samples = _batch.batch_size(batch)
        peers = _compat.parallel_layout(trainer).tensor_parallel
        share = f", this device's share of {peers} tensor-parallel devices" if peers > 1 else ""
        log_text(trainer, "compute/flops_by_module", module_table(count, self.module_depth, samples, share), step=0)
        if samples:
            per_sample = _per_sample(trainer, count.forward, samples) / 1e9
            log_scalars(trainer, {"compute/forward_gflops_per_sample": per_sample}, step=0)
            save_hparam(trainer, "compute/forward_gflops_per_sample", per_sample)  # no example_input_array: now known
            say(trainer, f"FlopsLogger: forward {human(per_sample, 4)} GFLOPs per sample, {human(count.total / 1e9, 4)} "
                "GFLOPs per training batch (forward + backward, model FLOPs)")

    def _log_op_classes(self, trainer: pl.Trainer, count: FlopCount, sig: tuple) -> None:
        """A counted training batch's FLOPs and bytes by op class (``compute/op_classes``, what ``lit-compute whatif``
        prices), at the step it ran in."""
        if not trainer.is_global_zero or not count.by_class:
            return
        module = trainer.lightning_module
        params = list(module.parameters()) if module is not None else []
        samples = next((s[0] for _, s, _ in sig[1] if s), None)
        facts = {"parameters": sum(p.numel() for p in params),
                 "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
                 "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
                 "precision": str(trainer.precision), "accumulate_grad_batches": trainer.accumulate_grad_batches,
                 **_compat.communication_facts(trainer, module)}
        log_text(trainer, "compute/op_classes", op_class_table(count, samples, facts),
                 step=_compat.batches_that_stepped(trainer))

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
        tally = self._eval
        if counting is not None:  # a counted batch's time is instrument time; its FLOPs still count
            tally.excluded += self.timeline.raw() - counting[2]
        if values is None:
            tally.valid = False
            return
        tally.add(values[0], _batch.batch_size(batch) or 0, timed=counting is None)
        tally.estimated |= self._batch_estimated

    def _log_evaluation(self, trainer: pl.Trainer, event: LogEvent) -> None:
        tally, prefix = self._eval, _STAGE_PREFIX.get(event.stage, event.stage)
        local = tally.tflops(self.timeline.raw(), self.timeline.totals.get("instrument", 0.0))
        if tally.batches and tally.valid:
            event.log({f"compute/{prefix}_flops_per_step": tally.flops / tally.batches})
            if tally.samples:
                event.log({f"compute/{prefix}_flops_per_sample": _per_sample(trainer, tally.flops, tally.samples)})
            if self.book.any_estimated:
                event.log({f"compute/{prefix}_flops_estimated": float(tally.estimated)})
        world = trainer.world_size

        def finish(reduced: dict[str, float]) -> dict[str, float]:
            total = reduced.get("tflops", math.nan)
            if not (math.isfinite(local) and math.isfinite(total)):
                return {}
            out = {f"compute/{prefix}_tflops_per_sec": local}
            mfu = self._utilisation(total, math.nan, world).get("compute/mfu")
            if mfu is not None:
                out[f"compute/{prefix}_mfu"] = mfu
            return out

        event.contribute(self, {"tflops": local}, finish)

    # -- clean-up -------------------------------------------------------------------------------------
    @override
    def _teardown(self) -> None:
        self._counting = None  # its counter leaves the mode stack at the batch's end mark (or the exception's clean-up)


def _per_sample(trainer: pl.Trainer, flops: float, samples: int) -> float:
    """The model's FLOPs per sample from this device's FLOPs: tensor-parallel peers each execute a share of the
    same samples."""
    return flops * _compat.parallel_layout(trainer).tensor_parallel / samples


def _short(sig: tuple) -> str:
    stage, leaves = sig[0], sig[1]
    shown = ", ".join(f"{path or 'batch'}: {tuple(shape)}" for path, shape, _ in leaves[:4])
    return f"{stage} [{shown}{', ...' if len(leaves) > 4 else ''}]"
