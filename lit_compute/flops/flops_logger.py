"""FlopsLogger: model and hardware FLOPs per step counted from the real batches, TFLOP/s, MFU and HFU."""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Annotated, Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info

from lit_compute import _batch, _compat
from lit_compute._batch import TokenSpec
from lit_compute._compat import eager_compiled_code
from lit_compute._utils import MeasuringCallback, guarded, log_text, markdown_table
from lit_compute._validate import Check, validated
from lit_compute.flops.counting import FlopCount, SafeFlopCounterMode, count_flops
from lit_compute.flops.peaks import measure_peak_flops, peak_flops
from lit_compute.flops.predict import ShapePredictor
from lit_compute.report import flops_rate, human
from lit_compute.timeline import LogEvent, StepRecord, timeline_for

if TYPE_CHECKING:
    import lightning.pytorch as pl

_MAX_FAILED_COUNTS = 3
_STAGE_PREFIX = {"validate": "val", "test": "test"}


def precision_dtype(precision: str) -> torch.dtype:
    """The dtype matmuls run in under a Lightning precision string ("bf16-mixed" -> bfloat16, ...)."""
    p = str(precision)
    if p.startswith("bf16"):
        return torch.bfloat16
    if p.startswith("16"):
        return torch.float16
    if p.startswith("64"):
        return torch.float64
    if p.startswith("transformer-engine"):
        return torch.bfloat16
    return torch.float32


def batch_signature(stage: str, batch: Any) -> tuple:
    """Paths, shapes and dtypes of every tensor in a batch (dataclasses and custom objects included), and the
    stage: one FLOP count per distinct signature."""
    return _batch.signature(stage, batch)


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

    Timing: from the shared timeline (:mod:`lit_compute.timeline`): the steps between two logging steps, each
    from the previous step's end to its own (data wait, forward, backward, optimizer), with instrument work,
    validation and checkpoint saving removed, and steps tainted by instrument work (a counted step, a profiled
    window, compilation, the first batch of an epoch) left out. On CUDA the times come from CUDA events read at
    logging steps (one synchronisation per logging step). ``global_tflops_per_sec`` sums every rank's figure in
    one all-reduce at every logging step on every rank (NaN from a rank that knows nothing).

    Logged metrics:
        - ``compute/flops_per_step``: model FLOPs of the logging step (forward + backward of every micro-batch
          accumulated into it).
        - ``compute/hardware_flops_per_step``: hardware FLOPs of the same step.
        - ``compute/flops_per_sample``: model FLOPs of that step per training sample.
        - ``compute/tflops_per_sec``: achieved model TFLOP/s of this device (rank 0's).
        - ``compute/global_tflops_per_sec``: achieved model TFLOP/s summed over all ranks.
        - ``compute/mfu``: ``global_tflops_per_sec / (world_size * peak_tflops)``.
        - ``compute/hfu``: the same from hardware FLOPs.
        - ``compute/peak_tflops``: the per-device peak used as the denominator.
        - ``compute/val_flops_per_step``, ``compute/val_flops_per_sample``, ``compute/val_tflops_per_sec``,
          ``compute/val_mfu`` (and ``compute/test_*`` under ``trainer.test``): the same for evaluation (forward
          only), once per evaluation run.
        - ``compute/padding_fraction``: token batches with padding (an ``attention_mask``, or a pad id): the share of
          computed positions that were padding, over the steps since the last log.
        - ``compute/forward_gflops_per_sample``: the model's forward GFLOPs per sample, once (at step 0); with an
          ``example_input_array`` also an hparam (TensorBoard's HParams tab, ``hparams.yaml``), counted at fit start.
        - text ``compute/flops_by_module`` (model FLOPs per module, TensorBoard only).

    Args:
        log_every_n_steps: Log every n steps (default: the trainer's ``log_every_n_steps``).
        peak: ``"table"``: the dense peak of the device and dtype from :data:`~lit_compute.flops.PEAK_TABLE`
            (float32 on CUDA: TF32 for the convolutions and matmuls whose TF32 switch is on, weighted by their
            counted FLOPs); ``"measure"``: time a large GEMM in the training dtype on the device at set-up (how
            MFU works on CPUs and GPUs missing from the table); ``"none"``: no MFU.
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

    _reduce_keys = {"train": ("tflops", "hw_tflops"), "validate": ("tflops",), "test": ("tflops",)}

    @validated
    def __init__(
        self,
        log_every_n_steps: Annotated[int | None, Check(ge=1)] = None,
        peak: Literal["table", "measure", "none"] = "table",
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
        self.counts: dict[tuple, FlopCount | None] = {}  # exact counts by signature (None: counting failed)
        self.peak_used: float | None = None
        self.counted_batches = 0
        self.predicted_batches = 0
        self.last_local_tflops: float | None = None  # this rank's figure at the last logging step (None: unknown)
        self._predictor = ShapePredictor(verify_every=25, tolerance=1e-3)
        self._failed_counts = 0
        self._table: FlopCount | None = None
        self._counting: tuple[tuple, SafeFlopCounterMode, contextlib.ExitStack, float] | None = None
        self._reset_run()

    def _reset_run(self) -> None:
        self._table_logged = False
        self._batch_values: tuple[int, int, int] | None = None
        self._step = [0, 0, 0]  # model forward, model backward, hardware FLOPs of the step in progress
        self._step_known = True
        self._window: list[tuple[StepRecord, int, int]] = []
        self._token_steps: list[StepRecord] = []  # every step's tokens since the last log (padding fraction)
        self._last: tuple[int, int, int | None] | None = None  # (model, hardware, samples) of the last step
        self._eval = {"flops": 0, "samples": 0, "batches": 0, "valid": True, "excluded": 0.0, "start": 0.0,
                      "instrument": 0.0}

    # -- state ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        table = self._table
        return {
            "counts": [[sig, [c.forward, c.backward, c.hardware]] for sig, c in self.counts.items() if c is not None],
            "table": None if table is None else {"forward": table.forward, "backward": table.backward,
                                                 "by_module": table.by_module,
                                                 "forward_by_module": table.forward_by_module},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for sig, (fwd, bwd, hw) in state_dict.get("counts", []):
            sig = _as_tuple(sig)
            self.counts[sig] = FlopCount(forward=int(fwd), backward=int(bwd), hardware=int(hw))
            self._predictor.add(sig, (int(fwd), int(bwd), int(hw)))
        table = state_dict.get("table")
        if table:
            self._table = FlopCount(forward=table["forward"], backward=table["backward"],
                                    by_module=dict(table["by_module"]),
                                    forward_by_module=dict(table["forward_by_module"]))

    # -- set-up ---------------------------------------------------------------------------------------
    def _setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        _batch.use_token_spec(self, trainer, self.tokens)
        self._reset_run()
        with timeline_for(trainer).instrument("peak_measure"):
            self.peak_used = self._resolve_peak(trainer)
        self._peak_refined = False

    def _resolve_peak(self, trainer: pl.Trainer) -> float | None:
        if self.peak_flops is not None:
            return float(self.peak_flops)
        if self.peak == "none":
            return None
        device = trainer.strategy.root_device
        dtype = precision_dtype(trainer.precision)
        if self.peak == "measure":
            measured = measure_peak_flops(device, dtype)
            rank_zero_info(f"FlopsLogger: measured peak {flops_rate(measured / 1e12)} ({dtype}, {device})")
            return measured
        value = peak_flops(device, dtype)
        if value is None:
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{device.type} device"
            self._warn_once(
                "no-peak",
                f"FlopsLogger(peak='table') has no peak for {name} in {dtype}; MFU is not logged. "
                "Use FlopsLogger(peak='measure') to measure one, or peak_flops=<FLOP/s> to set it.",
            )
        return value

    def _fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """With an ``example_input_array``: the forward GFLOPs per sample as an hparam, in Lightning's own (first,
        only) ``log_hyperparams`` call, which comes right after ``on_fit_start``."""
        example = getattr(pl_module, "example_input_array", None)
        if example is None:
            return
        training = pl_module.training
        try:  # in eval mode under no_grad, as Lightning's model summary runs the example (BatchNorm takes a batch of 1)
            pl_module.eval()
            with timeline_for(trainer).instrument("flop_count"), torch.no_grad():
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

    def _logs_at(self, trainer: pl.Trainer, stage: str, step: int) -> bool:
        if stage == "train":
            return super()._logs_at(trainer, stage, step)
        return self.count_validation and not trainer.sanity_checking

    # -- counting -------------------------------------------------------------------------------------
    def _values_for(self, sig: tuple) -> tuple[int, int, int] | None:
        """Known or predicted (model forward, model backward, hardware) FLOPs of a signature; None: count it."""
        if sig in self.counts:
            c = self.counts[sig]
            return None if c is None else (c.forward, c.backward, c.hardware)
        if self.predict_shapes:
            guess = self._predictor.predict(sig)
            if guess is not None:
                self.predicted_batches += 1
                return guess
        return None

    def _begin_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str, batch: Any) -> None:
        sig = batch_signature(stage, batch)
        self._batch_values = self._values_for(sig)
        if self._batch_values is not None or sig in self.counts or self._failed_counts >= _MAX_FAILED_COUNTS:
            return
        stack = contextlib.ExitStack()
        counter = SafeFlopCounterMode(display=False, depth=99, module_paths=pl_module, hookless=True)
        stack.enter_context(eager_compiled_code())
        stack.enter_context(counter)
        self._counting = (sig, counter, stack, timeline_for(trainer).raw())

    def _end_batch(self, trainer: pl.Trainer) -> tuple[int, int, int] | None:
        """Close a count started for this batch; the batch's values (None when unknown)."""
        if self._counting is None:
            return self._batch_values
        sig, counter, stack, _ = self._counting
        self._counting = None
        stack.close()
        count = counter.result()
        self.counted_batches += 1
        if count.total == 0 or count.errors:
            self._failed_counts += 1
            reason = "; ".join(count.errors[:3]) or (
                f"no matmul, convolution or attention ran ({', '.join(count.uncounted_ops) or 'no op with a formula'})"
            )
            self._warn_once("count-failed", f"FlopsLogger could not count the FLOPs of batches {_short(sig)}: {reason}. "
                            "Nothing is logged for them; training goes on.")
            if self._failed_counts == _MAX_FAILED_COUNTS:
                self._warn_once("count-off", f"FlopsLogger: counting failed for {_MAX_FAILED_COUNTS} batch shapes; "
                                "counting is now off (FlopsLogger logs nothing more); training goes on.")
            self.counts[sig] = None
            return None
        if count.uncounted_ops:
            self._warn_once(
                "uncounted",
                f"FlopsLogger: ops without a FLOP formula ran ({', '.join(count.uncounted_ops)}); the counts are "
                "lower bounds. Register a formula with torch.utils.flop_counter.register_flop_formula.",
            )
        self.counts[sig] = count
        values = (count.forward, count.backward, count.hardware)
        if self.predict_shapes and not self._predictor.add(sig, values):
            self._warn_once("prediction-miss", f"FlopsLogger: the predicted count of batches {_short(sig)} missed the "
                            "real count; their shapes are counted for real from now on.")
        if sig[0] == "train":
            if self._table is None:
                self._table = count
            self._refine_peak(trainer, count)
        return values

    def _refine_peak(self, trainer: pl.Trainer, count: FlopCount) -> None:
        """float32 on CUDA: convolutions and matmuls have separate TF32 switches; weigh the table peak by the count."""
        if self.peak != "table" or self.peak_flops is not None or getattr(self, "_peak_refined", True):
            return
        device = trainer.strategy.root_device
        if device.type != "cuda" or precision_dtype(trainer.precision) != torch.float32:
            return
        self._peak_refined = True
        value = peak_flops(device, torch.float32, count.by_op)
        if value:
            self.peak_used = value

    # -- training -------------------------------------------------------------------------------------
    def _train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset_run()

    def _batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        self._begin_batch(trainer, pl_module, "train", batch)
        if self._counting is not None:
            timeline_for(trainer).taint("flop_count")

    def _batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                   record: StepRecord | None) -> None:
        values = self._end_batch(trainer)
        if values is None:
            self._step_known = False
        else:
            self._step = [a + b for a, b in zip(self._step, values)]
        self._log_table_once(trainer, batch)
        if record is None:
            return
        model, hardware = self._step[0] + self._step[1], self._step[2]
        known, self._step, self._step_known = self._step_known, [0, 0, 0], True
        self._last = (model, hardware, record.samples) if known else None
        if known and record.clean:
            self._window.append((record, model, hardware))
        if record.tokens is not None and record.real_tokens is not None:
            self._token_steps.append(record)

    def _step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, record: StepRecord,
                  event: LogEvent) -> None:
        if not self._logs_at(trainer, "train", record.index):
            return
        window, self._window = self._window, []
        token_steps, self._token_steps = self._token_steps, []
        positions = sum(r.tokens or 0 for r in token_steps)
        if positions:
            real = sum(r.real_token_count() or 0 for r in token_steps)
            event.log({"compute/padding_fraction": 1.0 - real / positions})
        seconds = sum(sum(r.device_times()) for r, _, _ in window)
        model = sum(m for _, m, _ in window)
        hardware = sum(h for _, _, h in window)
        local = model / seconds / 1e12 if seconds > 0 and window else math.nan
        local_hw = hardware / seconds / 1e12 if seconds > 0 and window else math.nan
        self.last_local_tflops = local if math.isfinite(local) else None
        if self._last is not None:
            step_model, step_hw, samples = self._last
            event.log({"compute/flops_per_step": step_model, "compute/hardware_flops_per_step": step_hw})
            if samples:
                event.log({"compute/flops_per_sample": step_model / samples})
        world, peak = trainer.world_size, self.peak_used

        def finish(reduced: dict[str, float]) -> dict[str, float]:
            total, total_hw = reduced.get("tflops", math.nan), reduced.get("hw_tflops", math.nan)
            if not (math.isfinite(local) and math.isfinite(total)):
                return {}
            out = {"compute/tflops_per_sec": local, "compute/global_tflops_per_sec": total}
            if peak:
                out["compute/peak_tflops"] = peak / 1e12
                out["compute/mfu"] = total / (world * peak / 1e12)
                if math.isfinite(total_hw):
                    out["compute/hfu"] = total_hw / (world * peak / 1e12)
            return out

        self._contribute(trainer, {"tflops": local, "hw_tflops": local_hw}, finish)

    def _log_table_once(self, trainer: pl.Trainer, batch: Any) -> None:
        count = self._table
        if count is None or self._table_logged or not trainer.is_global_zero:
            return
        self._table_logged = True
        samples = _batch.batch_size(batch)
        rows = [
            [f"`{path}`", f"{fwd / 1e9:.4f}", f"{tot / 1e9:.4f}", f"{100 * tot / count.total:.1f}%"]
            for path, fwd, tot in count.table(self.module_depth)
        ]
        table = markdown_table(["module", "forward GFLOPs", "fwd+bwd GFLOPs", "share"], rows)
        head = (
            f"Model FLOPs of one training batch of {samples or '?'} samples: forward {count.forward / 1e9:.4f} GFLOPs, "
            f"backward {count.backward / 1e9:.4f} GFLOPs, total {count.total / 1e9:.4f} GFLOPs "
            "(1 multiply-add = 2 FLOPs; no recomputation).\n\n"
        )
        log_text(trainer, "compute/flops_by_module", head + table, step=0)
        if samples:
            per_sample = count.forward / samples / 1e9
            from lit_compute._utils import log_scalars

            log_scalars(trainer, {"compute/forward_gflops_per_sample": per_sample}, step=0)
            rank_zero_info(f"FlopsLogger: forward {human(per_sample, 4)} GFLOPs per sample, {human(count.total / 1e9, 4)} "
                           "GFLOPs per training batch (forward + backward, model FLOPs)")

    # -- validation and test --------------------------------------------------------------------------
    def _eval_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        timeline = timeline_for(trainer)
        self._eval = {"flops": 0, "samples": 0, "batches": 0, "valid": True, "excluded": 0.0,
                      "start": timeline.raw(), "instrument": timeline.totals.get("instrument", 0.0)}

    @guarded
    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_start(trainer, pl_module, "val", batch)

    @guarded
    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer, batch)

    @guarded
    def on_test_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                            batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_start(trainer, pl_module, "test", batch)

    @guarded
    def on_test_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer, batch)

    def _eval_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str, batch: Any) -> None:
        if self.count_validation and not trainer.sanity_checking:
            self._begin_batch(trainer, pl_module, stage, batch)

    def _eval_batch_end(self, trainer: pl.Trainer, batch: Any) -> None:
        if not self.count_validation or trainer.sanity_checking:
            return
        counting = self._counting
        values = self._end_batch(trainer)
        if counting is not None:  # a counted batch's time is instrument time
            self._eval["excluded"] += timeline_for(trainer).raw() - counting[3]
            return
        if values is None:
            self._eval["valid"] = False
            return
        self._eval["flops"] += values[0]
        self._eval["batches"] += 1
        self._eval["samples"] += _batch.batch_size(batch) or 0

    def _eval_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str, event: LogEvent) -> None:
        if not self._logs_at(trainer, stage, event.step):
            return
        timeline, v = timeline_for(trainer), self._eval
        prefix = _STAGE_PREFIX.get(stage, stage)
        local = math.nan
        if v["batches"] and v["valid"]:
            instrument = timeline.totals.get("instrument", 0.0) - v["instrument"]
            elapsed = timeline.raw() - v["start"] - instrument - v["excluded"]
            local = v["flops"] / elapsed / 1e12 if elapsed > 0 else math.nan
            event.log({f"compute/{prefix}_flops_per_step": v["flops"] / v["batches"]})
            if v["samples"]:
                event.log({f"compute/{prefix}_flops_per_sample": v["flops"] / v["samples"]})
        world, peak = trainer.world_size, self.peak_used

        def finish(reduced: dict[str, float]) -> dict[str, float]:
            total = reduced.get("tflops", math.nan)
            if not (math.isfinite(local) and math.isfinite(total)):
                return {}
            out = {f"compute/{prefix}_tflops_per_sec": local}
            if peak:
                out[f"compute/{prefix}_mfu"] = total / (world * peak / 1e12)
            return out

        self._contribute(trainer, {"tflops": local}, finish)

    # -- clean-up -------------------------------------------------------------------------------------
    def _teardown(self) -> None:
        if self._counting is not None:
            stack = self._counting[2]
            self._counting = None
            stack.close()


def _short(sig: tuple) -> str:
    stage, leaves = sig
    shown = ", ".join(f"{path or 'batch'}: {tuple(shape)}" for path, shape, _ in leaves[:4])
    return f"{stage} [{shown}{', ...' if len(leaves) > 4 else ''}]"


def _as_tuple(x: Any) -> Any:
    """Signatures come back from checkpoints as lists; make them tuples again (hashable)."""
    if isinstance(x, (list, tuple)):
        return tuple(_as_tuple(v) for v in x)
    return x
