"""ProfilerWindow: torch.profiler over chosen training-step windows; traces, tables and scalars per window."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import torch
from lightning.pytorch.profilers import PyTorchProfiler
from torch.profiler import ProfilerAction, ProfilerActivity
from typing_extensions import override

from lit_compute import _compat
from lit_compute._validate import Check, validated
from lit_compute.callback import MeasuringCallback
from lit_compute.files import write_whole, written_whole
from lit_compute.formatting import markdown_table
from lit_compute.profiling.trace_summary import WindowSummary, summarize_trace
from lit_compute.timeline import StepRecord
from lit_compute.writer import log_scalars, log_text

if TYPE_CHECKING:
    import lightning.pytorch as pl

SORT_KEYS = (
    "cpu_time",
    "cuda_time",
    "device_time",
    "cpu_time_total",
    "cuda_time_total",
    "device_time_total",
    "self_cpu_time_total",
    "self_cuda_time_total",
    "self_device_time_total",
    "cpu_memory_usage",
    "self_cpu_memory_usage",
    "cuda_memory_usage",
    "self_cuda_memory_usage",
    "device_memory_usage",
    "self_device_memory_usage",
    "count",
)


class ProfilerWindow(MeasuringCallback):
    """Runs ``torch.profiler`` over chosen windows of training steps and turns each window into files and scalars.

    A window profiles ``active`` training steps starting at ``start_step``, after ``warmup`` steps of profiler
    warm-up (recorded, then discarded, so start-up cost stays out of the trace). Steps are the shared
    timeline's (:mod:`lit_compute.timeline`): optimizer steps, or training batches under manual optimization
    (a GAN's two ``optimizer.step()`` calls are one step), numbered as Lightning's ``self.log`` numbers them.
    A window opens at the first step at or after its warm-up's start (a run resumed inside a window records
    what is left of it; a window wholly before the resume step is reported once) and files are named after
    the steps they really hold (a window cut short by ``max_steps``/``max_time`` or an exception is written
    with the steps it got). Profiled steps are marked on the timeline, so other lit_compute callbacks leave
    them out of their figures, and the export is an instrument interval, so it never shows up as data wait.
    ``every_n_steps`` repeats the window every n steps, up to ``max_windows``; ``on_slow_step=k`` also captures
    the next window after a step slower than k times the running median step time (at most ``max_windows``
    such windows). Outside a window no profiler exists: zero overhead. Validation running inside a window
    is recorded inside the current step and does not break it.

    Each window writes, under ``<trainer.log_dir>/profiler/`` (the TensorBoard logger's ``log_dir``):
    ``window<k>_steps<a>-<b>[_rank<r>].pt.trace.json`` (Chrome/Perfetto trace; open it in
    https://ui.perfetto.dev), ``...key_averages.txt`` (the op table), and, when memory is profiled with stacks,
    ``...memory_timeline.html``. The op table also goes to TensorBoard text.

    Summary scalars come from the window's own trace events, logged at its last step, with the export's own
    duration.

    Logged metrics:
        - ``profiler/export_ms``: how long writing the window's trace and tables took (instrument time).
        - ``profiler/window_first_step``: the window's first step, logged at its last (what the report draws).
        - ``profiler/step_time_ms``: mean duration of the window's ``ProfilerStep#N`` ranges.
        - ``profiler/dataloader_fraction``: share of the window spent in ``enumerate(DataLoader)`` (waiting for
          batches).
        - ``profiler/top_op_fraction``: share of all op self time taken by the most expensive op.
        - ``profiler/peak_memory_mb``: peak allocated memory in the window (``profile_memory=True``).
        - ``profiler/gpu_idle_fraction``: GPU only; window span minus merged kernel time, as a share.
        - ``profiler/comm_fraction``: share of the window spent in collectives (NCCL kernels on GPU; gloo's
          collectives on CPU: DDP's all-reduce, FSDP2's all-gather and reduce-scatter, tensor parallelism's
          all-reduce).
        - ``profiler/comm_overlap_fraction``: share of that collective time overlapped by compute (kernels on GPU,
          ops on other threads on CPU).
        - text ``profiler/top_ops``: top ops by self time, per window; text ``profiler/key_averages``: the op table.

    Args:
        start_step: First profiled (active) step of the first window.
        warmup: Warm-up steps before each window (profiled and discarded).
        active: Steps recorded per window.
        every_n_steps: Repeat the window every n steps (None: one scheduled window).
        max_windows: Most scheduled windows (and, separately, most slow-step windows).
        on_slow_step: Capture the next window after a step slower than this multiple of the median (None: off).
        record_shapes: Record input shapes of ops.
        profile_memory: Record memory allocations.
        with_stack: Record Python stacks (needed for the memory timeline).
        with_flops: Estimate FLOPs of matmuls and convolutions in the table.
        sort_by: Column to sort the op table by (default: self device time on GPU, self CPU time otherwise).
        row_limit: Rows of the op table.

    Raises:
        ValueError: at construction for ``active < 1``, negative steps, or an unknown ``sort_by``.

    Example:
        >>> import lightning.pytorch as pl
        >>> trainer = pl.Trainer(callbacks=[ProfilerWindow(start_step=5, active=3)], accelerator="cpu", max_steps=10)
    """

    @validated
    def __init__(
        self,
        start_step: Annotated[int, Check(ge=0)] = 10,
        warmup: Annotated[int, Check(ge=0)] = 2,
        active: Annotated[int, Check(ge=1)] = 5,
        every_n_steps: Annotated[int | None, Check(ge=1)] = None,
        max_windows: Annotated[int, Check(ge=1)] = 1,
        on_slow_step: Annotated[float | None, Check(gt=1.0, hint="a multiple of the median step time")] = None,
        record_shapes: bool = True,
        profile_memory: bool = True,
        with_stack: bool = False,
        with_flops: bool = False,
        sort_by: Annotated[str | None, Check(choices=SORT_KEYS, hint="a key_averages column")] = None,
        row_limit: Annotated[int, Check(ge=1)] = 20,
    ) -> None:
        super().__init__()
        if every_n_steps is not None and every_n_steps < warmup + active:
            raise ValueError(
                f"ProfilerWindow(every_n_steps={every_n_steps}) must be >= warmup + active "
                f"({warmup + active}) so windows do not overlap"
            )
        self.start_step = start_step
        self.warmup = warmup
        self.active = active
        self.every_n_steps = every_n_steps
        self.max_windows = max_windows
        self.on_slow_step = on_slow_step
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.with_flops = with_flops
        self.sort_by = sort_by
        self.row_limit = row_limit
        self.windows_done: list[int] = []  # planned first active step of every window completed or reported missed
        self.windows_written = 0  # trace files written (numbers the next one)
        self.slow_windows = 0
        self.summaries: list[WindowSummary] = []
        self.exported: list[Path] = []
        self._profiler: torch.profiler.profile | None = None
        self._window: dict[str, Any] | None = None
        self._trainer: pl.Trainer | None = None
        self._durations: list[float] = []
        self._slow_next: int | None = None
        self._first_batch = True
        self._dir: Path | None = None  # <trainer.log_dir>/profiler, resolved at setup on every rank

    # -- state ----------------------------------------------------------------------------------------
    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "windows_done": list(self.windows_done),
            "slow_windows": self.slow_windows,
            "windows_written": self.windows_written,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.windows_done = [int(s) for s in state_dict.get("windows_done", [])]
        self.windows_written = int(state_dict.get("windows_written", len(self.windows_done)))
        self.slow_windows = int(state_dict.get("slow_windows", 0))

    # -- scheduling -----------------------------------------------------------------------------------
    def scheduled_starts(self) -> list[int]:
        """First active steps of the scheduled windows."""
        if self.every_n_steps is None:
            return [self.start_step]
        return [self.start_step + k * self.every_n_steps for k in range(self.max_windows)]

    def _plan_at(self, step: int) -> tuple[int, int, int] | None:
        """``(planned first active step, first active step, last active step)`` of a window that should be running
        at ``step``: the first step at or after its warm-up begins (a run resumed inside a window records what
        is left of it)."""
        for first in self.scheduled_starts():
            last = first + self.active - 1
            if first not in self.windows_done and max(0, first - self.warmup) <= step <= last:
                return first, max(first, step), last
        if self._slow_next is not None and step >= self._slow_next:
            first = self._slow_next + self.warmup
            return first, max(first, step), first + self.active - 1
        return None

    @override
    def _setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # trainer.log_dir broadcasts (a collective): every rank resolves it here, at the same point, never later
        # inside an export that only one rank may run
        self._dir = Path(trainer.log_dir or trainer.default_root_dir) / "profiler"
        if isinstance(cast(Any, trainer).profiler, PyTorchProfiler):
            self.disable(
                "Trainer(profiler='pytorch') already runs torch.profiler and two profilers cannot run at once; "
                "remove one of them"
            )

    @override
    def _train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._durations, self._slow_next = [], None
        self._first_batch = True

    def _report_missed(self, current: int) -> None:
        """A run resumed after a window's steps: say so once (at the first batch, when the step number is right)."""
        for first in self.scheduled_starts():
            last = first + self.active - 1
            if first not in self.windows_done and last < current:
                self.windows_done.append(first)
                self._warn_once(
                    f"missed{first}",
                    f"ProfilerWindow: the window of steps {first}-{last} was not "
                    f"captured: this run starts at step {current}, after it (resumed from a checkpoint).",
                )

    @override
    def _batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        timeline = self.timeline
        if self._first_batch and timeline.current is not None:
            self._first_batch = False
            self._report_missed(timeline.current.index)
            callbacks = getattr(trainer, "callbacks", [])  # set by Lightning's callback connector, not declared
            if any(getattr(callback, "gpm_active", False) for callback in callbacks):
                self._warn_once(
                    "gpm",
                    "ProfilerWindow: DeviceMonitor samples NVML's GPM, which reads the GPU's performance counters "
                    "as DCGM's profiling does; a CUDA profiler uses that hardware too, so device/prof_* over a "
                    "window's steps may be missing or disturbed (docs/monitoring.md). DeviceMonitor(gpm=False) "
                    "turns the sampling off.",
                )
        if self._profiler is not None:
            timeline.taint("profiler")
            return
        step = timeline.current
        if step is None or step.batches > 0:  # windows open at a step's first micro-batch only
            return
        plan = self._plan_at(step.index)
        if plan is None:
            return
        if self._slow_next is not None and plan[0] == self._slow_next + self.warmup:
            self._slow_next = None
            self.slow_windows += 1
        self._start(trainer, *plan, begin=step.index)
        if self._profiler is not None:
            timeline.taint("profiler")

    def _start(self, trainer: pl.Trainer, planned: int, first: int, last: int, begin: int) -> None:
        def schedule(step: int) -> ProfilerAction:
            if step < first:
                return ProfilerAction.WARMUP
            if step < last:
                return ProfilerAction.RECORD
            if step == last:
                return ProfilerAction.RECORD_AND_SAVE
            return ProfilerAction.NONE

        activities = [ProfilerActivity.CPU]
        if trainer.strategy.root_device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
            torch.cuda.reset_peak_memory_stats(trainer.strategy.root_device)
        else:  # Kineto's "gpuGetDeviceCount failed" and trace-marker lines are noise on a CPU run
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        self._trainer = trainer
        self._window = {"planned": planned, "first": first, "last": last, "recorded": [], "current": begin}
        profiler = torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self._on_trace_ready,
            record_shapes=self.record_shapes or (self.profile_memory and self.with_stack),
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
        )
        try:
            _compat.start_profiler_at_step(profiler, begin)
        except RuntimeError as err:  # another profiler (torch's or Lightning's) is already running
            self._window = None
            self.disable(f"could not start torch.profiler ({err}); is another profiler active?")
            return
        self._profiler = profiler

    @override
    def _batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, record: StepRecord | None
    ) -> None:
        window = self._window
        if self._profiler is None or window is None or record is None:
            return  # gradient accumulation: the step (and the profiler step) is not over yet
        if record.index >= window["first"]:
            window["recorded"].append(record.index)
        window["current"] = record.index + 1
        with self.timeline.instrument("profiler_export"):
            if record.index < window["last"] and _compat.is_last_training_step(trainer):
                self._finish()  # training ends inside the window: write what it holds, without an empty next step
            else:
                self._profiler.step()  # closes ProfilerStep#<step just run>; after the last one, exports the window
                if record.index >= window["last"]:
                    self._finish()

    @override
    def _step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, record: StepRecord) -> None:
        if self.on_slow_step is None or self._profiler is not None or not record.clean:
            return
        duration = record.duration_s
        if len(self._durations) >= 5 and self._slow_next is None and self.slow_windows < self.max_windows:
            median = statistics.median(self._durations[-50:])
            if duration > self.on_slow_step * median:
                self._slow_next = record.index + 1  # the next step begins the window (warm-up first)
        self._durations.append(duration)

    def _finish(self) -> None:
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            profiler.stop()  # closes the open step range; the trace was saved by RECORD_AND_SAVE
        self._window = None

    # -- output ---------------------------------------------------------------------------------------
    def _out_dir(self, trainer: pl.Trainer) -> Path:
        path = self._dir if self._dir is not None else Path(trainer.default_root_dir) / "profiler"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _on_trace_ready(self, profiler: torch.profiler.profile) -> None:
        trainer, window = self._trainer, self._window
        if trainer is None or window is None:
            return
        try:
            self._export(trainer, profiler, window)
        except Exception as err:  # noqa: BLE001 - a broken export must not stop training
            self.disable(f"exporting the profiler window failed with {type(err).__name__}: {err}")

    def _export(self, trainer: pl.Trainer, profiler: torch.profiler.profile, window: dict[str, Any]) -> None:
        timeline = self.timeline
        started = timeline.raw()
        recorded = window["recorded"]
        first = recorded[0] if recorded else window["first"]
        last = recorded[-1] if recorded else first
        if timeline.in_batch and window["current"] >= first:  # stopped inside a step (an exception): it is in the trace
            last = window["current"]
        if window["recorded"] and window["recorded"][-1] >= window["last"]:
            self.windows_done.append(window["planned"])  # complete; one cut short is continued by a resumed run
        self.windows_written += 1
        index = self.windows_written
        rank = f"_rank{trainer.global_rank}" if trainer.world_size > 1 else ""
        stem = f"window{index}_steps{first}-{last}{rank}"
        out = self._out_dir(trainer)
        trace_path = out / f"{stem}.pt.trace.json"
        with written_whole(trace_path) as tmp:  # a full disk leaves no partial, 0-byte or .tmp trace behind
            profiler.export_chrome_trace(str(tmp))
        on_gpu = trainer.strategy.root_device.type == "cuda"
        sort_by = self.sort_by or ("self_cuda_time_total" if on_gpu else "self_cpu_time_total")
        averages = profiler.key_averages()
        table = averages.table(sort_by=sort_by, row_limit=self.row_limit)
        write_whole(out / f"{stem}.key_averages.txt", table + "\n")
        if self.profile_memory and self.with_stack:
            try:
                profiler.export_memory_timeline(str(out / f"{stem}.memory_timeline.html"))
            except Exception as err:  # noqa: BLE001 - optional output (needs matplotlib)
                self._warn_once("memory-timeline", f"ProfilerWindow: no memory timeline ({err}).")
        summary = summarize_trace(trace_path)
        if on_gpu:
            summary.peak_memory_mb = torch.cuda.max_memory_allocated(trainer.strategy.root_device) / 2**20
        top_rows, top_fraction = _top_ops(averages, on_gpu, self.row_limit)
        self.summaries.append(summary)
        self.exported.append(trace_path)
        scalars = summary.scalars()
        if top_fraction is not None:
            scalars["profiler/top_op_fraction"] = top_fraction
        header = (
            f"Window {index}: steps {first}-{last}, trace `{trace_path.name}` in `{out}`. "
            f"Mean step {summary.step_time_ms or 0:.2f} ms, "
            f"data loader {100 * (summary.dataloader_fraction or 0):.1f}%.\n\n"
        )
        log_text(
            trainer,
            "profiler/top_ops",
            header + markdown_table(["op", "calls", "self time ms", "share"], top_rows),
            step=last,
        )
        log_text(trainer, "profiler/key_averages", "```\n" + table + "\n```", step=last)
        scalars["profiler/export_ms"] = (timeline.raw() - started) * 1e3
        scalars["profiler/window_first_step"] = float(first)
        event = timeline.event
        if event is not None and event.stage == "train" and event.step == last:
            event.log(scalars)  # written with the rest of this step's event, whether or not the step logs
        else:
            log_scalars(trainer, scalars, step=last)

    # -- robustness -----------------------------------------------------------------------------------
    @override
    def _teardown(self) -> None:
        profiler, self._profiler = self._profiler, None
        window = self._window
        if profiler is None:
            return
        try:
            if window is not None and window["current"] < window["first"]:
                self._warn_once(
                    f"warmup{window['planned']}",
                    f"ProfilerWindow: the window of steps {window['first']}-"
                    f"{window['last']} was not captured: the run ended at step {window['current']}, during "
                    "its warm-up.",
                )
            profiler.stop()  # a recording profiler saves what it recorded: a window cut short is still written
        finally:
            self._window = None


def _top_ops(averages: Any, on_gpu: bool, limit: int) -> tuple[list[list[Any]], float | None]:
    attr = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    rows = [
        (e.key, e.count, float(getattr(e, attr, 0.0) or 0.0))
        for e in averages
        if not e.key.startswith("ProfilerStep") and not e.key.startswith("enumerate(DataLoader)")
    ]
    total = sum(t for _, _, t in rows)
    rows.sort(key=lambda r: r[2], reverse=True)
    table = [[f"`{k}`", n, f"{t / 1e3:.3f}", f"{100 * t / total:.1f}%" if total else "n/a"] for k, n, t in rows[:limit]]
    return table, (rows[0][2] / total if rows and total > 0 else None)
