"""``TrialRecorder``: what one ``lit-compute tune`` trial measured, written to a JSON file the tune reads back.

It rides in the trial's own ``lit-compute fit`` (the trial config lists it as a callback), so a trial is the
user's config as ``fit`` runs it. It reads the shared timeline's step records: the first ``warmup_steps`` steps
and every tainted step (compilation, FLOP counting, profiler export, an epoch's loader start) are left out of the
throughput; it stops the fit once the throughput's 95% confidence interval is within ``target_ci`` (or the time
allowance is spent), after at least ``loss_steps`` steps whose training losses the tune compares between trials.
At ``on_train_start`` it also records what the tune's knobs need to know about the model: convolutions and norm
layers, the loader's settings, the optimizers, the strategy and the precision.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Annotated, Any, cast

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from lit_compute import _compat
from lit_compute._validate import Check, validated
from lit_compute.callback import MeasuringCallback
from lit_compute.cpu_load import CpuSample, cpu_sample, others_cores
from lit_compute.files import write_whole
from lit_compute.intervals import half_width
from lit_compute.speedup.channels_last import has_channels_last_weights
from lit_compute.speedup.fused_optimizer import fusable
from lit_compute.timeline import StepRecord
from lit_compute.tuning.measurement import Measurement
from lit_compute.writer import log_scalars, log_text


def relative_ci(rates: list[float]) -> float:
    """Half-width of the 95% confidence interval of the mean of ``rates``, relative to the mean."""
    if len(rates) < 2:
        return math.inf
    mean = statistics.fmean(rates)
    return half_width(rates) / mean if mean > 0 else math.inf


#: steps per batch mean in the warm-up detection (MSER-5)
MSER_BATCH = 5


def steady_start(durations: list[float], batch: int = MSER_BATCH) -> int:
    """Where a run's step times settle: the number of leading steps to drop, by the marginal standard error rule
    (MSER-5, White 1997): over means of ``batch`` consecutive steps, the truncation point ``d`` that minimizes the
    squared standard error of the mean of what is left, ``sum((x - mean)^2) / (n - d)^2``, searched over the first
    half. A run whose first steps are slow (oneDNN preparing bf16 or channels-last kernels, caches filling) drops
    them; a run that is steady from the start drops none. Fewer than two batches: none."""
    means = [statistics.fmean(durations[i : i + batch]) for i in range(0, len(durations) - batch + 1, batch)]
    if len(means) < 2:
        return 0
    best, best_d = math.inf, 0
    for d in range(len(means) // 2 + 1):
        rest = means[d:]
        if len(rest) < 2:
            break
        mean = statistics.fmean(rest)
        value = sum((x - mean) ** 2 for x in rest) / len(rest) ** 2
        if value < best - 1e-18:
            best, best_d = value, d
    return best_d * batch


def _loss_of(outputs: Any) -> float | None:
    value = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach().float())
    return float(value) if isinstance(value, (int, float)) else None


def _logged_loss(trainer: pl.Trainer) -> tuple[str, float] | None:
    """A loss the step logged (``self.log("train_loss", ...)``: manual optimization returns none), by name."""
    metrics = cast(Any, trainer).callback_metrics
    names = sorted(
        (k for k in metrics if "loss" in k.lower() and not k.endswith("_epoch")),
        key=lambda k: (not k.endswith("_step"), len(k)),
    )
    for name in names:
        value = metrics[name]
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return name, float(value.detach().float())
    return None


def _path(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _init_args(obj: Any) -> list[str]:
    if obj is None:
        return []
    return sorted(p for p in inspect.signature(type(obj).__init__).parameters if p != "self")


def model_facts(trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
    """What the knobs need to know about the model, its data, optimizers and strategy (JSON-friendly); what the run
    ran on (device, chip, precision, ranks, cores) from the run's record, as report and whatif read it."""
    from lit_compute.writer import run_record

    record = run_record(trainer)
    modules = list(pl_module.modules())
    norms = sorted(
        {
            type(m).__name__
            for m in modules
            if isinstance(m, (_compat.NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm))
            or type(m).__name__.endswith("Norm")
        }
    )
    datamodule = getattr(trainer, "datamodule", None)
    loader = trainer.train_dataloader
    loader_facts: dict[str, Any] = {}
    if isinstance(loader, torch.utils.data.DataLoader):
        loader_facts = {
            "class": _path(loader),
            "num_workers": loader.num_workers,
            "pin_memory": loader.pin_memory,
            "persistent_workers": loader.persistent_workers,
            "prefetch_factor": loader.prefetch_factor,
            "batch_size": loader.batch_size,
        }
    elif loader is not None:
        loader_facts = {"class": _path(loader)}
    return {
        "model_class": _path(pl_module),
        "parameters": sum(p.numel() for p in pl_module.parameters()),
        "conv2d": any(isinstance(m, torch.nn.Conv2d) for m in modules),
        "channels_last": has_channels_last_weights(pl_module),
        "norms": norms,
        "compiled": any(_compat.compiled_in_place(m) for m in modules),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "datamodule_class": _path(datamodule) if datamodule is not None else None,
        "datamodule_args": _init_args(datamodule),
        "datamodule_mode": getattr(datamodule, "mode", None),
        "loader": loader_facts,
        "optimizers": [
            {
                "class": _path(o),
                "fusable": fusable(o) is None,
                "why_not": fusable(o),
                "fused": bool(o.param_groups and o.param_groups[0].get("fused")),
            }
            for o in trainer.optimizers
        ],
        "automatic_optimization": pl_module.automatic_optimization,
        "strategy": _path(trainer.strategy),
        "ddp": isinstance(trainer.strategy, DDPStrategy),
        "world_size": record.world_size,
        "device": trainer.strategy.root_device.type,
        "device_name": record.device,
        "chip": record.chip,
        "precision": record.precision,
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        "num_training_batches": trainer.num_training_batches if math.isfinite(trainer.num_training_batches) else None,
        "epoch_samples": _epoch_samples(trainer),
        "cpu_count": record.cpu_cores,
    }


class TrialRecorder(MeasuringCallback):
    """Measure one tune trial and write ``out`` (JSON): steady-state throughput, losses, facts, failures.

    Args:
        out: The JSON file to write (rewritten at the end, and when a non-finite loss ends the trial).
        warmup_steps: Steps left out at the start (besides tainted ones).
        min_steps: Timed steps needed before the trial may stop.
        max_timed_steps: The trial stops after this many timed steps whatever the interval.
        seconds: Wall-clock allowance after warm-up; the trial stops when it is spent.
        target_ci: Stop once the 95% interval of the throughput is within this fraction of its mean.
        loss_steps: Training losses of the first steps recorded for the numerics check (the trial runs at
            least this many steps).
        check_steps: A drift check (``lit-compute tune --check-steps N``): record the loss of each of the first N
            steps and stop after exactly N, whatever the time or the interval.
        validate: With ``check_steps``: stop at the end of the validation run after step N instead (the trial's
            config schedules one there) and record its metrics.
    """

    @validated
    def __init__(
        self,
        out: str,
        warmup_steps: Annotated[int, Check(ge=0)] = 3,
        min_steps: Annotated[int, Check(ge=2)] = 5,
        max_timed_steps: Annotated[int, Check(ge=2)] = 400,
        seconds: Annotated[float, Check(gt=0)] = 30.0,
        target_ci: Annotated[float, Check(gt=0)] = 0.03,
        loss_steps: Annotated[int, Check(ge=0)] = 8,
        check_steps: Annotated[int, Check(ge=0)] = 0,
        validate: bool = False,
    ) -> None:
        super().__init__()
        self.check_steps = check_steps
        self.validate = validate and check_steps > 0
        loss_steps = max(loss_steps, check_steps)
        self.out = out
        self.warmup_steps = warmup_steps
        self.min_steps = min_steps
        self.max_timed_steps = max_timed_steps
        self.seconds = seconds
        self.target_ci = target_ci
        self.loss_steps = loss_steps
        self._reset()

    def _reset(self) -> None:
        self.facts: dict[str, Any] = {}
        self.losses: list[float] = []
        self.steps: list[dict[str, Any]] = []  # timed steps: duration, wait, samples, tokens
        self.settling_steps = 0  # timed steps before the step time settled (left out: steady_start)
        self._real_tokens: list[Any] = []
        self._pending_loss: float | None = None
        self._seen = 0
        self._timing_since: float | None = None
        self._skipped = 0
        self._scale: float | None = None
        self.stop_reason = ""
        self.loss_source = "returned by training_step"
        self._cpu_start: CpuSample | None = None
        self._cpu_end: CpuSample | None = None
        self.val_metrics: dict[str, float] = {}

    # -- hooks ----------------------------------------------------------------------------------------
    @override
    def _train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.facts = model_facts(trainer, pl_module)
        self._trainer = trainer

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = _loss_of(outputs)
        if loss is None and not pl_module.automatic_optimization and (logged := _logged_loss(trainer)) is not None:
            self.loss_source, loss = f"logged as {logged[0]}", logged[1]
        if loss is not None:
            self._pending_loss = loss if self._pending_loss is None else self._pending_loss + loss
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    @override
    def _step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, record: StepRecord) -> None:
        loss, self._pending_loss = self._pending_loss, None
        self._count_skipped(trainer)
        if loss is not None and len(self.losses) < self.loss_steps:
            self.losses.append(loss)
        self._seen += 1
        if loss is not None and not math.isfinite(loss):
            self._stop(trainer, f"the training loss is {loss} at step {self._seen - 1}")
            return
        if self._seen <= self.warmup_steps:
            return
        if self._timing_since is None:
            self._timing_since = time.perf_counter()
            self._cpu_start = cpu_sample()  # what other processes take of the CPUs while this trial is timed
        if record.clean and record.samples:
            self.steps.append(
                {"s": record.duration_s, "wait": record.wait_s, "samples": record.samples, "batches": record.batches}
            )
            self._real_tokens.append(record.real_tokens if record.real_tokens is not None else record.tokens)
        self._maybe_stop(trainer)

    def _count_skipped(self, trainer: pl.Trainer) -> None:
        """fp16: a step whose loss scale dropped skipped its update (inf/NaN gradients)."""
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is None or not hasattr(scaler, "get_scale"):
            return
        scale = float(scaler.get_scale())
        if self._scale is not None and scale < self._scale:
            self._skipped += 1
        self._scale = scale

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self.validate or trainer.sanity_checking or self._seen < self.check_steps:
            return
        metrics = cast(Any, trainer).callback_metrics
        self.val_metrics = {
            k: float(v)
            for k, v in metrics.items()
            if "val" in k.lower() and isinstance(v, torch.Tensor) and v.numel() == 1
        }
        self._stop(trainer, f"validated after {self._seen} steps")

    def _maybe_stop(self, trainer: pl.Trainer) -> None:
        if self.check_steps:  # a drift check runs its steps whatever the time (validation stops it when asked)
            if self._seen >= self.check_steps and not self.validate:
                self._stop(trainer, f"{self._seen} steps (drift check)")
            return
        if len(self.losses) < self.loss_steps and self._seen < self.loss_steps:
            return
        n = len(self.steps)
        elapsed = time.perf_counter() - (self._timing_since or time.perf_counter())
        if n >= self.max_timed_steps:
            self._stop(trainer, f"{n} timed steps")
        elif n >= self.min_steps and relative_ci(self._rates()) <= self.target_ci:
            self._stop(trainer, f"95% interval within +-{100 * self.target_ci:g}%")
        elif elapsed >= self.seconds and n >= 2:
            self._stop(trainer, f"time allowance of {self.seconds:g} s spent")

    def _stop(self, trainer: pl.Trainer, reason: str) -> None:
        self.stop_reason = reason
        self._cpu_end = cpu_sample()
        trainer.should_stop = True

    def _full(self) -> list[int]:
        """Indices of the timed steps with full batches in the run's steady state: an epoch's remainder batch is left
        out, so trials that stop at different points (before or after an epoch's end) compare like with like, and so
        are the steps before the step time settles (:func:`steady_start`, found per run)."""
        most = max((s["samples"] for s in self.steps), default=0)
        full = [i for i, s in enumerate(self.steps) if s["samples"] == most and s["s"] > 0]
        self.settling_steps = steady_start([self.steps[i]["s"] for i in full])
        return full[self.settling_steps :]

    def _rates(self) -> list[float]:
        return [self.steps[i]["samples"] / self.steps[i]["s"] for i in self._full()]

    @override
    def _teardown(self) -> None:
        if self.facts or self.steps or self.losses:
            self.write()
            self._log_measurement()

    def _log_measurement(self) -> None:
        """The trial's steady-state figures in its TensorBoard run (``tune/*``, once, at its last step), and a text
        saying it stopped once measured: ``lit-compute report`` on a tune's runs reads them (a trial logs too few
        steps for StepTimeMonitor's windows, and its planned steps are a ceiling, not a plan)."""
        trainer = self.__dict__.pop("_trainer", None)
        if trainer is None or not trainer.is_global_zero:
            return
        result = self.result()
        step = max(0, int(trainer.global_step) - 1)
        figures = {
            "tune/samples_per_sec": result["samples_per_sec"],
            "tune/tokens_per_sec": result.get("tokens_per_sec"),
            "tune/timed_steps": float(result["timed_steps"]),
            "tune/data_wait_fraction": result["data_wait"],
        }
        if result["samples_per_sec"] and result["samples_per_step"]:
            figures["tune/step_ms"] = 1e3 * result["samples_per_step"] / result["samples_per_sec"]
        mfu = _mfu(trainer, result)
        if mfu is not None:
            figures["tune/mfu"] = mfu
        log_scalars(trainer, {k: float(v) for k, v in figures.items() if v is not None}, step=step)
        log_text(
            trainer,
            "tune/trial",
            f"lit-compute tune trial: stopped after {result['steps_seen']} steps "
            f"({self.stop_reason or 'the run ended'}); {result['timed_steps']} timed steps.",
            step=step,
        )

    # -- the result -----------------------------------------------------------------------------------
    def result(self) -> Measurement:
        """Everything measured so far, as the tune reads it."""
        full = self._full()
        steps = [self.steps[i] for i in full]
        tokens = [int(t.item()) if isinstance(t, torch.Tensor) else t for t in (self._real_tokens[i] for i in full)]
        total_s = sum(s["s"] for s in steps)
        samples = sum(s["samples"] for s in steps)
        rates = self._rates()
        result: Measurement = {
            "facts": self.facts,
            "losses": self.losses,
            "loss_source": self.loss_source if self.losses else None,
            "timed_steps": len(steps),
            "remainder_steps": len(self.steps) - len(steps),
            "steps_seen": self._seen,
            "samples_per_sec": samples / total_s if total_s > 0 else None,
            "ci": relative_ci(rates) if len(rates) >= 2 else None,
            "step_rates": [round(r, 6) for r in rates],
            "settling_steps": self.settling_steps,
            "data_wait": sum(s["wait"] for s in steps) / total_s if total_s > 0 else None,
            "samples_per_step": samples / len(steps) if steps else None,
            "samples_per_batch": samples / max(1, sum(s["batches"] for s in steps)) if steps else None,
            "skipped_steps": self._skipped,
            "stop_reason": self.stop_reason,
            "peak_memory_gb": _peak_memory_gb(),
            "other_cores": (
                others_cores(self._cpu_start, self._cpu_end or cpu_sample()) if self._cpu_start is not None else None
            ),
            "cpu_count": os.cpu_count() or 1,
        }
        if self.val_metrics:
            result["val_metrics"] = self.val_metrics
        if tokens and all(t is not None for t in tokens) and total_s > 0:
            token_rates = [t / s["s"] for t, s in zip(tokens, steps) if s["s"] > 0]
            result["tokens_per_sec"] = sum(tokens) / total_s
            result["tokens_ci"] = relative_ci(token_rates) if len(token_rates) >= 2 else None
            result["tokens_per_batch"] = sum(tokens) / max(1, sum(s["batches"] for s in steps))
            result["step_rates"] = [round(r, 3) for r in token_rates]
        return result

    def write(self) -> None:
        if int(os.environ.get("LOCAL_RANK", "0") or 0) != 0 or int(os.environ.get("NODE_RANK", "0") or 0) != 0:
            return
        path = Path(self.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, json.dumps(self.result(), default=str))


def _epoch_samples(trainer: pl.Trainer) -> int | None:
    """Samples in one epoch on one device: its sampler's length, less a last batch ``drop_last`` leaves out (None
    when the loader has no length or a batch limit cuts the epoch)."""
    loader = cast(Any, trainer).train_dataloader
    if loader is None or not isinstance(trainer.limit_train_batches, float) or trainer.limit_train_batches != 1.0:
        return None
    try:
        samples = len(loader.sampler) if getattr(loader, "sampler", None) is not None else len(loader.dataset)
    except TypeError:
        return None
    batch = getattr(loader, "batch_size", None)
    return samples - samples % batch if getattr(loader, "drop_last", False) and batch else samples


def _mfu(trainer: pl.Trainer, result: Measurement) -> float | None:
    """The trial's MFU from its FlopsLogger's count and peak (None when either is unknown)."""
    flops_logger = next((cb for cb in cast(Any, trainer).callbacks if type(cb).__name__ == "FlopsLogger"), None)
    count = getattr(getattr(flops_logger, "book", None), "first_train", None)
    peak = getattr(flops_logger, "peak_used", None)
    per_batch, rate = result.get("samples_per_batch"), result.get("samples_per_sec")
    if count is None or not peak or not per_batch or not rate:
        return None
    return count.total / per_batch * rate / peak


def _peak_memory_gb() -> float:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: KiB
