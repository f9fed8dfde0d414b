"""FlopsLogger: FLOPs per step counted from the real batches, achieved TFLOP/s and MFU."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.data import extract_batch_size
from torch.utils._pytree import tree_flatten

from lit_compute._compat import eager_compiled_code
from lit_compute._utils import (
    MeasuringCallback,
    guarded,
    log_scalars,
    log_text,
    markdown_table,
    resolve_every,
)
from lit_compute.flops.counting import FlopCount, SafeFlopCounterMode, build_count
from lit_compute.flops.peaks import measure_peak_flops, peak_flops

if TYPE_CHECKING:
    import lightning.pytorch as pl


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


def batch_signature(stage: str, batch: Any) -> str:
    """Shapes and dtypes of the tensors in a batch (plus the stage): one FLOP count per distinct signature."""
    leaves, _ = tree_flatten(batch)
    parts = [(tuple(t.shape), str(t.dtype).replace("torch.", "")) for t in leaves if isinstance(t, torch.Tensor)]
    return repr((stage, tuple(parts)))


class FlopsLogger(MeasuringCallback):
    """FLOPs per training step counted automatically from the real batches, TFLOP/s and MFU.

    The first batch of each distinct *signature* (shapes and dtypes of the batch's tensors) runs its real
    training step (forward, loss, backward; the optimizer update is outside) under
    ``torch.utils.flop_counter.FlopCounterMode`` extended with lit_compute's formulas (every attention
    path, corrected depthwise-convolution backward). Nothing else happens in that step: it is the step the
    trainer runs anyway, so training is bitwise unchanged. Later batches of that signature reuse the count.
    ``torch.compile``d code runs eagerly during that one step so every op is seen. Cost of one count: the
    dispatch mode's bookkeeping, measured at 24 ms on top of a 160 ms ResNet-18 step (batch 32, 64 px, 2 CPU
    cores), once per signature.

    Convention: one multiply-add = 2 FLOPs; matmul, convolution and attention are counted, elementwise
    ops are not (the convention of torchvision's published figures and of MFU).

    Timing: the time between two logging steps (wall clock, including data loading, optimizer and
    everything else the loop does; validation time excluded). On CUDA the device is synchronised only at
    logging steps. The step of a new signature (slowed by counting) is excluded from the window.

    Logged metrics:
        - ``compute/flops_per_step``: FLOPs of one optimizer step (forward + backward of every micro-batch
          accumulated into it).
        - ``compute/flops_per_sample``: forward + backward FLOPs per training sample.
        - ``compute/tflops_per_sec``: achieved TFLOP/s of this device (rank 0's).
        - ``compute/global_tflops_per_sec``: achieved TFLOP/s summed over all ranks (all-reduce).
        - ``compute/mfu``: ``global_tflops_per_sec / (world_size * peak_tflops)``; one device: achieved / peak.
        - ``compute/peak_tflops``: the per-device peak used as MFU's denominator.
        - ``compute/val_flops_per_step``, ``compute/val_flops_per_sample``, ``compute/val_tflops_per_sec``,
          ``compute/val_mfu``: the same for validation (forward only), once per validation run.
        - ``compute/forward_gflops_per_sample``: the model's forward GFLOPs per sample, once (also an hparam).
        - text ``compute/flops_by_module`` (per-module table).

    Args:
        log_every_n_steps: Log every n optimizer steps (default: the trainer's ``log_every_n_steps``).
        peak: ``"table"``: the dense peak of the device and dtype from :data:`~lit_compute.flops.PEAK_TABLE`
            (float32 on CUDA: TF32 for the convolutions and matmuls whose TF32 switch is on, weighted by their
            counted FLOPs);
            ``"measure"``: time a large GEMM in the training dtype on the device at fit start (how MFU works
            on CPUs and GPUs missing from the table); ``"none"``: no MFU.
        peak_flops: Per-device peak FLOP/s; overrides ``peak``.
        module_depth: Depth of the per-module table.
        count_validation: Also count and log validation FLOPs.

    Example:
        >>> import lightning.pytorch as pl
        >>> trainer = pl.Trainer(callbacks=[FlopsLogger(peak="measure")], max_steps=1, accelerator="cpu")
    """

    def __init__(
        self,
        log_every_n_steps: int | None = None,
        peak: Literal["table", "measure", "none"] = "table",
        peak_flops: float | None = None,
        module_depth: int = 2,
        count_validation: bool = True,
    ) -> None:
        super().__init__()
        if log_every_n_steps is not None and log_every_n_steps < 1:
            raise ValueError(f"FlopsLogger(log_every_n_steps={log_every_n_steps}) must be >= 1 or None")
        if peak not in ("table", "measure", "none"):
            raise ValueError(f"FlopsLogger(peak={peak!r}) must be one of 'table', 'measure', 'none'")
        if peak_flops is not None and peak_flops <= 0:
            raise ValueError(f"FlopsLogger(peak_flops={peak_flops}) must be > 0 (FLOP/s per device) or None")
        if module_depth < 1:
            raise ValueError(f"FlopsLogger(module_depth={module_depth}) must be >= 1")
        self.log_every_n_steps = log_every_n_steps
        self.peak = peak
        self.peak_flops = peak_flops
        self.module_depth = module_depth
        self.count_validation = count_validation
        # signature -> FlopCount (None: counting failed for it)
        self.counts: dict[str, FlopCount | None] = {}
        self.peak_used: float | None = None
        self._counting: tuple[str, SafeFlopCounterMode, contextlib.ExitStack] | None = None
        self._fwd_snapshot: Any = None
        self._count_started = 0.0
        self._table_logged = False
        self._reset_run_state()

    # -- state ----------------------------------------------------------------------------------------
    def _reset_run_state(self) -> None:
        self._win_start: float | None = None
        self._win_flops = 0
        self._win_valid = True
        self._paused = 0.0
        self._pause_start: float | None = None
        self._step_flops = 0
        self._step_known = True
        self._last_step_flops: int | None = None
        self._last_sample_flops: float | None = None
        self._batch_global_step = 0
        self._batch_sig = ""
        self._counted_in_batch = False
        self._last_batch_size: int | None = None
        self._val = {"flops": 0, "samples": 0, "batches": 0, "excluded": 0.0, "valid": True, "start": 0.0}

    def state_dict(self) -> dict[str, Any]:
        return {
            "counts": {sig: [c.forward, c.backward] for sig, c in self.counts.items() if c is not None},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for sig, (fwd, bwd) in state_dict.get("counts", {}).items():
            self.counts[sig] = FlopCount(forward=int(fwd), backward=int(bwd))

    # -- set-up ---------------------------------------------------------------------------------------
    @guarded
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset_run_state()
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
            rank_zero_info(f"FlopsLogger: measured peak {measured / 1e12:.2f} TFLOP/s ({dtype}, {device})")
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

    # -- counting -------------------------------------------------------------------------------------
    def _start_count(self, sig: str, pl_module: pl.LightningModule) -> None:
        stack = contextlib.ExitStack()
        counter = SafeFlopCounterMode(root=pl_module)
        stack.enter_context(eager_compiled_code())
        stack.enter_context(counter)
        self._counting = (sig, counter, stack)
        self._fwd_snapshot = None
        self._count_started = time.perf_counter()

    def _finish_count(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> FlopCount | None:
        if self._counting is None:
            return None
        sig, counter, stack = self._counting
        self._counting = None
        stack.close()
        count = build_count(counter, self._fwd_snapshot)
        if count.total == 0 or count.errors:
            reason = "; ".join(count.errors[:3]) or (
                f"no matmul, convolution or attention ran ({', '.join(count.uncounted_ops) or 'no op with a formula'})"
            )
            self._warn_once(
                f"fail:{sig}",
                f"FlopsLogger could not count FLOPs for batches {sig}: {reason}. Nothing is logged for them; "
                "training goes on.",
            )
            self.counts[sig] = None
            return None
        if count.uncounted_ops:
            self._warn_once(
                "uncounted",
                f"FlopsLogger: ops without a FLOP formula ran ({', '.join(count.uncounted_ops)}); the counts are "
                "lower bounds. Register a formula with torch.utils.flop_counter.register_flop_formula.",
            )
        self.counts[sig] = count
        self._refine_peak(trainer, count)
        return count

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
    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._batch_global_step = trainer.global_step
        try:
            self._last_batch_size = int(extract_batch_size(batch))
        except Exception:  # noqa: BLE001 - a batch without a recognisable size
            self._last_batch_size = None
        self._batch_sig = batch_signature("train", batch)
        self._counted_in_batch = self._batch_sig not in self.counts
        if self._counted_in_batch:
            self._start_count(self._batch_sig, pl_module)

    @guarded
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        if self._counting is not None:
            self._fwd_snapshot = self._counting[1].snapshot()

    @guarded
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self._counting is not None and self._batch_sig.startswith("('train'"):
            count = self._finish_count(trainer, pl_module)
            self._after_train_count(trainer, count)

    def _after_train_count(self, trainer: pl.Trainer, count: FlopCount | None) -> None:
        if count is None or self._table_logged or not trainer.is_global_zero:
            return
        self._table_logged = True
        samples = self._last_batch_size
        per_sample = count.forward / samples if samples else None
        rows = [
            [f"`{path}`", f"{fwd / 1e9:.4f}", f"{tot / 1e9:.4f}", f"{100 * tot / count.total:.1f}%"]
            for path, fwd, tot in count.table(self.module_depth)
        ]
        table = markdown_table(["module", "forward GFLOPs", "fwd+bwd GFLOPs", "share"], rows)
        head = (
            f"Batch {self._batch_sig}: forward {count.forward / 1e9:.4f} GFLOPs, backward {count.backward / 1e9:.4f} "
            f"GFLOPs, total {count.total / 1e9:.4f} GFLOPs (1 multiply-add = 2 FLOPs).\n\n"
        )
        log_text(trainer, "compute/flops_by_module", head + table)
        msg = f"FlopsLogger: {count.total / 1e9:.3f} GFLOPs per batch (forward {count.forward / 1e9:.3f})"
        if per_sample is not None:
            msg += f", forward {per_sample / 1e9:.4f} GFLOPs per sample"
            for logger in trainer.loggers:
                logger.log_hyperparams({"compute/forward_gflops_per_sample": per_sample / 1e9})
            log_scalars(trainer, {"compute/forward_gflops_per_sample": per_sample / 1e9})
        rank_zero_info(msg)

    @guarded
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        counted_now = self._counted_in_batch
        if self._counting is not None:  # gradient accumulation: no optimizer step ran in this batch
            self._after_train_count(trainer, self._finish_count(trainer, pl_module))
        count = self.counts.get(self._batch_sig)
        if count is not None:
            self._step_flops += count.total
            if self._last_batch_size:
                self._last_sample_flops = count.total / self._last_batch_size
        else:
            self._step_known = False
        stepped = trainer.global_step > self._batch_global_step
        now = self._now(trainer, sync=counted_now)
        if counted_now or self._win_start is None:
            self._open_window(now)
        else:
            self._win_flops += count.total if count is not None else 0
            self._win_valid &= count is not None
        if not stepped:
            return
        self._last_step_flops = self._step_flops if self._step_known else None
        self._step_flops, self._step_known = 0, True
        every = resolve_every(trainer, self.log_every_n_steps)
        if trainer.global_step % every == 0 and not counted_now:
            self._log_train(trainer, self._now(trainer, sync=True))

    def _now(self, trainer: pl.Trainer, sync: bool) -> float:
        device = trainer.strategy.root_device
        if sync and device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def _open_window(self, now: float) -> None:
        self._win_start, self._win_flops, self._win_valid, self._paused = now, 0, True, 0.0

    def _log_train(self, trainer: pl.Trainer, now: float) -> None:
        elapsed = now - (self._win_start or now) - self._paused
        local = self._win_flops / elapsed / 1e12 if self._win_valid and elapsed > 0 and self._win_flops else float("nan")
        world = trainer.world_size
        reduced = trainer.strategy.reduce(
            torch.tensor(local, dtype=torch.float64, device=trainer.strategy.root_device), reduce_op="sum"
        )
        global_tflops = float(reduced)
        self._open_window(now)
        metrics: dict[str, float] = {}
        if self._last_step_flops is not None:
            metrics["compute/flops_per_step"] = float(self._last_step_flops)
        if self._last_sample_flops is not None:
            metrics["compute/flops_per_sample"] = self._last_sample_flops
        if local == local and global_tflops == global_tflops:  # not NaN on any rank
            metrics["compute/tflops_per_sec"] = local
            metrics["compute/global_tflops_per_sec"] = global_tflops
            if self.peak_used:
                metrics["compute/peak_tflops"] = self.peak_used / 1e12
                metrics["compute/mfu"] = global_tflops / (world * self.peak_used / 1e12)
        if trainer.is_global_zero:
            log_scalars(trainer, metrics)

    # -- validation -----------------------------------------------------------------------------------
    @guarded
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        now = time.perf_counter()
        if trainer.training or trainer.state.fn == "fit":
            self._pause_start = now
        self._val = {"flops": 0, "samples": 0, "batches": 0, "excluded": 0.0, "valid": True, "start": now}

    @guarded
    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        if not self.count_validation:
            return
        self._batch_sig = batch_signature("val", batch)
        if self._batch_sig not in self.counts:
            self._start_count(self._batch_sig, pl_module)

    @guarded
    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if not self.count_validation:
            return
        if self._counting is not None:
            self._finish_count(trainer, pl_module)
            self._val["excluded"] += self._now(trainer, sync=True) - self._count_started
            return
        count = self.counts.get(batch_signature("val", batch))
        if count is None:
            self._val["valid"] = False
            return
        self._val["flops"] += count.forward
        self._val["batches"] += 1
        try:
            self._val["samples"] += int(extract_batch_size(batch))
        except Exception:  # noqa: BLE001
            pass

    @guarded
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        now = self._now(trainer, sync=True)
        if self._pause_start is not None:
            self._paused += now - self._pause_start
            self._pause_start = None
        v = self._val
        if trainer.sanity_checking or not self.count_validation or not v["batches"] or not v["valid"]:
            return
        elapsed = now - v["start"] - v["excluded"]
        local = v["flops"] / elapsed / 1e12 if elapsed > 0 else float("nan")
        reduced = float(trainer.strategy.reduce(
            torch.tensor(local, dtype=torch.float64, device=trainer.strategy.root_device), reduce_op="sum"
        ))
        metrics = {"compute/val_flops_per_step": v["flops"] / v["batches"]}
        if v["samples"]:
            metrics["compute/val_flops_per_sample"] = v["flops"] / v["samples"]
        if local == local and reduced == reduced:
            metrics["compute/val_tflops_per_sec"] = local
            if self.peak_used:
                metrics["compute/val_mfu"] = reduced / (trainer.world_size * self.peak_used / 1e12)
        if trainer.is_global_zero:
            log_scalars(trainer, metrics)

    # -- clean-up -------------------------------------------------------------------------------------
    def _teardown(self) -> None:
        if self._counting is not None:
            _, _, stack = self._counting
            self._counting = None
            stack.close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._teardown()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._teardown()
