"""StepTimeMonitor: where training step time goes (waiting for data vs computing), and what to do about it."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Annotated, Any

from torchvision.datasets import DatasetFolder
from typing_extensions import override

from lit_compute._batch import TokenSpec
from lit_compute._compat import available_cpu_cores, parallel_layout
from lit_compute._validate import Check, validated
from lit_compute.callback import MeasuringCallback, use_token_spec
from lit_compute.monitoring.rank_skew import StragglerWindow, communication_bound
from lit_compute.timeline import LogEvent, StepRecord
from lit_compute.writer import log_text

if TYPE_CHECKING:
    import lightning.pytorch as pl


_RATE_KEYS = ("samples_per_sec", "tokens_per_sec")
_RANK_KEYS = ("step_ms", "wait_ms", "forward_ms", "forward_comm_ms", "comm_ms")
_MAX_RANK_TAGS = 64


def _finite(value: float | None) -> bool:
    return value is not None and value == value and abs(value) != float("inf")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class StepTimeMonitor(MeasuringCallback):
    """Splits every training step into time waiting for the batch and time computing it.

    Reads the shared timeline (:mod:`lit_compute.timeline`): a *step* is an optimizer step (the micro-batches
    of an accumulated step add up) or, under manual optimization, a training batch. *Data wait* runs from the
    end of the previous batch to the arrival of this one (the trainer fetching it from the DataLoader,
    including worker hand-off and host-to-device copy); *compute* runs from the batch's arrival to the end of
    the step (forward, backward, optimizer). Instrument work of every lit_compute component (a profiler
    trace's export, FLOP counting, benchmarks), validation and checkpoint saving are removed from both, and
    steps tainted by instrument work that cannot be cut out (a counted or profiled step, compilation, the
    first batch of an epoch) are left out of every figure. On CUDA both spans come from CUDA events on the
    current stream, read only at logging steps (no per-step synchronisation): the data wait is then the time
    the GPU sat idle between steps. An interval whose steps were all tainted logs nothing.

    When the data-wait fraction over the last ``window`` steps exceeds ``stall_fraction``, it warns once
    with advice computed from the run (the DataLoader's ``num_workers`` vs the cores available,
    ``pin_memory``, ``persistent_workers``, DALI) and writes the advice to TensorBoard text.

    Logged metrics:
        - ``time/data_wait_ms``: mean wait for the batch per step since the last log.
        - ``time/compute_ms``: mean compute time per step since the last log.
        - ``time/step_ms``: mean step time (wait + compute) since the last log.
        - ``time/timed_steps``: the clean steps those means are over (``lit-compute report`` weighs each logging
          window by ``timed_steps x step_ms`` to give whole-run totals: total work over total time).
        - ``time/step_ms_p50``, ``time/step_ms_p90``, ``time/step_ms_max``: over the last ``window`` steps.
        - ``time/data_wait_fraction``: wait / step time since the last log.
        - ``time/samples_per_sec``: samples / step time since the last log (this process).
        - ``time/tokens_per_sec``: token batches only: non-padding tokens / step time since the last log (this
          process); all positions when the batch carries no padding information.
        - ``time/instrument_ms``: lit_compute's own instrument time per step since the last log (excluded from
          every other figure; it shows what observing costs).
        - ``time/global_samples_per_sec``, ``time/global_tokens_per_sec``: the sums over ranks, each data-parallel
          replica counted once (tensor-parallel peers share a batch; the layout is in ``lit_compute/run``).
        - With more than one rank, from the same all-reduce (world-size slots): ``time/step_ms_rank_max`` (the
          slowest rank's step time), ``time/rank_skew`` (the most *own work* per step - data wait + forward less
          the forward's time blocked in collectives - over the median rank's), ``time/slowest_rank``,
          ``time/comm_wait_ms`` (this rank's time in collective waits per step, :mod:`lit_compute.collective_clock`:
          the host's blocked time, under NCCL the current stream's stall between CUDA events), and up to 64 ranks
          ``rank/<r>/step_ms``, ``rank/<r>/data_wait_ms``, ``rank/<r>/forward_ms``, ``rank/<r>/comm_wait_ms`` (the
          report's per-rank table). See
          :mod:`lit_compute.monitoring.rank_skew`.
        - text ``time/advice``: the input-bound diagnosis, when it fires.
        - text ``time/straggler_advice``: when, over the last ``straggler_window`` logging steps, the same rank was
          the slowest in most and its median ``rank_skew`` exceeds ``straggler_skew``, and so does its mean beyond
          the window's scatter (a 95% interval): the slow rank, whether it waited on data or computed longer, and by
          how much (the window's medians).
        - ``time/rank_spikes``: once ``straggler_window`` logging steps are in, how many of the last
          ``straggler_window`` had their slowest rank over ``straggler_skew`` without it being the straggler: slow
          steps (a garbage collection, a page fault, a checkpoint on one node), not a slow rank.
        - text ``time/comm_advice``: when, at two logging steps in a row, every rank spent more than
          ``comm_fraction`` of the step blocked in collectives and no rank's own work stood out: the communication
          is slow (a network or a link), not one rank.

    Token batches (a mapping or object with ``input_ids``; padding from its ``attention_mask``, or a pad id the
    datamodule declares as ``pad_token_id``) are found automatically; ``tokens`` says where they are otherwise.

    Args:
        log_every_n_steps: Log every n steps (default: the trainer's ``log_every_n_steps``).
        window: Steps in the rolling window for percentiles and the stall check.
        stall_fraction: Data-wait fraction above which the run is called input-bound.
        tokens: Where the batch's token ids, padding mask or pad id are (None: auto-detect).
        straggler_skew: ``rank_skew`` above which the slowest rank is called a straggler.
        straggler_window: Logging steps over which a straggler must be the slowest rank most of the time (none is
            named before that many have been logged).
        comm_fraction: Share of the step above which time blocked in collectives on *every* rank (the one the
            others wait for included) is called slow communication.

    Example:
        >>> import lightning.pytorch as pl
        >>> trainer = pl.Trainer(callbacks=[StepTimeMonitor(window=20)], max_steps=1, accelerator="cpu")
    """

    @validated
    def __init__(
        self,
        log_every_n_steps: Annotated[int | None, Check(ge=1)] = None,
        window: Annotated[int, Check(ge=2)] = 50,
        stall_fraction: Annotated[float, Check(gt=0.0, lt=1.0)] = 0.2,
        tokens: TokenSpec | None = None,
        straggler_skew: Annotated[float, Check(gt=1.0)] = 1.25,
        straggler_window: Annotated[int, Check(ge=2)] = 8,
        comm_fraction: Annotated[float, Check(gt=0.0, lt=1.0)] = 0.25,
    ) -> None:
        super().__init__()
        self.straggler_skew = straggler_skew
        self.comm_fraction = comm_fraction
        self.comm_advice: str | None = None
        self._comm_logs = 0  # logging steps in a row whose collectives were slow on every rank
        self.straggler_advice: str | None = None
        self.straggler_window = straggler_window
        self.reduce_keys = {"train": _RATE_KEYS}
        self.tokens = tokens
        self.log_every_n_steps = log_every_n_steps
        self.window = window
        self.stall_fraction = stall_fraction
        self.advice: str | None = None
        self._reset()

    def _reset(self) -> None:
        self._interval: list[StepRecord] = []  # clean steps since the last log
        self._steps_since_log = 0
        self._instrument_mark = 0.0
        self._recent: deque[tuple[float, float]] = deque(maxlen=self.window)  # (wait_ms, compute_ms)
        self._stragglers = StragglerWindow(self.straggler_window, self.straggler_skew)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"advice": self.advice, "straggler_advice": self.straggler_advice, "comm_advice": self.comm_advice}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.advice = state_dict.get("advice")
        self.straggler_advice = state_dict.get("straggler_advice")
        self.comm_advice = state_dict.get("comm_advice")

    @override
    def _setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        use_token_spec(self, trainer, self.tokens)
        world = trainer.world_size  # the same on every rank: the all-reduce's layout
        slots = tuple(f"{key}_{r}" for r in range(world) for key in _RANK_KEYS) if world > 1 else ()
        self.reduce_keys = {"train": _RATE_KEYS + slots}

    @override
    def _train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()
        self._instrument_mark = self.timeline.totals.get("instrument", 0.0)

    @override
    def _step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, record: StepRecord) -> None:
        self._steps_since_log += 1
        if record.clean:
            self._interval.append(record)

    @override
    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, event: LogEvent) -> None:
        records, self._interval = self._interval, []
        steps, self._steps_since_log = self._steps_since_log, 0
        instrument = self.timeline.totals.get("instrument", 0.0)
        instrument_ms, self._instrument_mark = (instrument - self._instrument_mark) * 1e3 / steps, instrument
        event.log({"time/instrument_ms": instrument_ms})
        if not records:
            self._contribute(trainer, event, {})
            return
        times = [r.device_times() for r in records]
        for wait, compute in times:
            self._recent.append((wait * 1e3, compute * 1e3))
        waits = sum(w for w, _ in times) * 1e3
        computes = sum(c for _, c in times) * 1e3
        total = waits + computes
        n = len(records)
        recent = [w + c for w, c in self._recent]
        metrics = {
            "time/timed_steps": float(n),
            "time/data_wait_ms": waits / n,
            "time/compute_ms": computes / n,
            "time/step_ms": total / n,
            "time/step_ms_p50": _percentile(recent, 0.5),
            "time/step_ms_p90": _percentile(recent, 0.9),
            "time/step_ms_max": max(recent),
            "time/data_wait_fraction": waits / total if total > 0 else 0.0,
        }
        samples = [r.samples or 0 for r in records]
        if all(samples) and total > 0:
            metrics["time/samples_per_sec"] = sum(samples) / (total / 1e3)
        tokens = [r.real_token_count() if r.real_tokens is not None else r.tokens for r in records]
        if total > 0 and all(t is not None for t in tokens):
            metrics["time/tokens_per_sec"] = sum(t or 0 for t in tokens) / (total / 1e3)
        event.log(metrics)
        forward = sum(r.device_forward_time() for r in records) * 1e3 / n
        comms = [r.device_comm_times() for r in records]  # on the stream under NCCL, the host's blocked time elsewhere
        comm = sum(c for c, _, _ in comms) * 1e3 / n
        if trainer.world_size > 1:
            event.log({"time/comm_wait_ms": comm})
        self._contribute(
            trainer,
            event,
            {
                "step_ms": total / n,
                "wait_ms": waits / n,
                "forward_ms": forward,
                "forward_comm_ms": sum(f for _, f, _ in comms) * 1e3 / n,
                "comm_ms": comm,
                "samples_per_sec": metrics.get("time/samples_per_sec", float("nan")),
                "tokens_per_sec": metrics.get("time/tokens_per_sec", float("nan")),
            },
        )
        self._check_stall(trainer)

    def _contribute(self, trainer: pl.Trainer, event: LogEvent, mine: dict[str, float]) -> None:
        """This rank's rates and its own per-rank slots (0 in every other rank's slot, NaN in its own when it has
        no clean step), into the event's one all-reduce."""
        world, rank, nan = trainer.world_size, trainer.global_rank, float("nan")
        values = {key: mine.get(key, nan) for key in _RATE_KEYS}
        if world > 1:
            values.update(
                {f"{key}_{r}": (mine.get(key, nan) if r == rank else 0.0) for r in range(world) for key in _RANK_KEYS}
            )
        peers = parallel_layout(trainer).tensor_parallel

        def finish(sums: dict[str, float]) -> dict[str, float]:
            out = {f"time/global_{key}": sums[key] / peers for key in _RATE_KEYS if _finite(sums.get(key))}
            if world > 1:
                out.update(self._rank_metrics(trainer, sums, world))
            return out

        event.contribute(self, values, finish)

    def _rank_metrics(self, trainer: pl.Trainer, sums: dict[str, float], world: int) -> dict[str, float]:
        per_rank = {key: [sums.get(f"{key}_{r}", float("nan")) for r in range(world)] for key in _RANK_KEYS}
        if not all(_finite(v) for values in per_rank.values() for v in values):
            return {}
        out = {"time/step_ms_rank_max": max(per_rank["step_ms"])}
        if world <= _MAX_RANK_TAGS:
            for r in range(world):
                out.update(
                    {
                        f"rank/{r}/step_ms": per_rank["step_ms"][r],
                        f"rank/{r}/data_wait_ms": per_rank["wait_ms"][r],
                        f"rank/{r}/forward_ms": per_rank["forward_ms"][r],
                        f"rank/{r}/comm_wait_ms": per_rank["comm_ms"][r],
                    }
                )
        slowest = self._stragglers.add(**per_rank)  # its keys are _RANK_KEYS, add's arguments
        if slowest is None:
            return out
        out.update({"time/rank_skew": slowest.skew, "time/slowest_rank": float(slowest.rank)})
        # a straggler is the slowest rank most of the time (the window), a spike one logging step over the threshold
        straggler = self._stragglers.straggler()
        skewed = self._stragglers.spike(slowest, per_rank["step_ms"])
        if self._stragglers.full:
            out["time/rank_spikes"] = float(self._stragglers.spikes(straggler))
        if straggler is not None and self.straggler_advice is None:
            self.straggler_advice = straggler.advice(world, self.straggler_skew)
            self._warn_once("straggler", self.straggler_advice)
            log_text(trainer, "time/straggler_advice", self.straggler_advice)
        slow_comm = (
            None
            if skewed or straggler is not None
            else communication_bound(per_rank["comm_ms"], per_rank["step_ms"], self.comm_fraction)
        )
        self._comm_logs = self._comm_logs + 1 if slow_comm else 0
        if slow_comm and self._comm_logs >= 2 and self.comm_advice is None:
            self.comm_advice = slow_comm
            self._warn_once("communication", slow_comm)
            log_text(trainer, "time/comm_advice", slow_comm)
        return out

    def _check_stall(self, trainer: pl.Trainer) -> None:
        if self.advice is not None or len(self._recent) < min(self.window, 10):
            return
        wait = sum(w for w, _ in self._recent)
        total = wait + sum(c for _, c in self._recent)
        fraction = wait / total if total > 0 else 0.0
        if fraction <= self.stall_fraction:
            return
        self.advice = input_bound_advice(trainer, fraction, self.stall_fraction, len(self._recent))
        self._warn_once("stall", self.advice)
        log_text(trainer, "time/advice", self.advice)


def input_bound_advice(trainer: pl.Trainer, fraction: float, threshold: float, steps: int) -> str:
    """Advice for an input-bound run, computed from the trainer's actual DataLoader and device."""
    lines = [
        f"StepTimeMonitor: the run is input-bound: {fraction:.0%} of step time over the last {steps} steps was spent "
        f"waiting for data (threshold stall_fraction={threshold})."
    ]
    loader = trainer.train_dataloader
    loaders = (
        loader if isinstance(loader, (list, tuple)) else list(loader.values()) if isinstance(loader, dict) else [loader]
    )
    cores = available_cpu_cores()
    on_cuda = trainer.strategy.root_device.type == "cuda"
    for dl in loaders:
        workers = getattr(dl, "num_workers", None)
        if workers is None:
            continue
        suggested = max(1, int(cores * 0.75) // max(1, trainer.num_devices))
        if workers < suggested:
            lines.append(
                f"- DataLoader num_workers={workers} with {cores} CPU cores available: raise num_workers to about "
                f"{suggested} (75% of the cores, shared between {trainer.num_devices} device(s) on this node)."
            )
        if on_cuda and not getattr(dl, "pin_memory", False):
            lines.append(
                "- pin_memory=False while training on CUDA: set pin_memory=True for faster, asynchronous copies."
            )
        if workers > 0 and not getattr(dl, "persistent_workers", False):
            lines.append("- persistent_workers=False: workers restart every epoch; set persistent_workers=True.")
    datamodule = getattr(trainer, "datamodule", None)
    decodes_image_files = type(datamodule).__name__ == "TorchvisionImageDataModule" or any(
        isinstance(getattr(dl, "dataset", None), DatasetFolder) for dl in loaders
    )
    if decodes_image_files:  # DALI replaces decoding image files; it does nothing for tensors already in memory
        lines.append(
            "- Next step: decode and augment with NVIDIA DALI: lit_compute.data.DALIImageDataModule "
            "(same batches as TorchvisionImageDataModule; GPU decode on CUDA)."
        )
    return "\n".join(lines)
