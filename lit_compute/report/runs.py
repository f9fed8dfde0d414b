"""Runs read back from their TensorBoard event files, and named apart (``lit-compute report``)."""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_compute.run_record import RunRecord, from_legacy, read_record

__all__ = ["OUR_PREFIXES", "ReportError", "Run", "find_runs", "load_run", "name_runs"]

OUR_PREFIXES = ("compute/", "time/", "amp/", "device/", "profiler/", "comm/", "tune/", "memory/")
# a tune trial's steady-state measurement (TrialRecorder) read as the run's one timed window
_TRIAL_FIGURES = {
    "tune/samples_per_sec": "time/samples_per_sec",
    "tune/tokens_per_sec": "time/tokens_per_sec",
    "tune/step_ms": "time/step_ms",
    "tune/timed_steps": "time/timed_steps",
    "tune/data_wait_fraction": "time/data_wait_fraction",
    "tune/mfu": "compute/mfu",
}


class ReportError(ValueError):
    """A log dir that cannot be reported on (no event files, none of our tags), or an output that cannot be written."""


# -- one run ------------------------------------------------------------------------------------------------------
@dataclass
class Run:
    """One run's numbers, read back from its event files."""

    path: Path
    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)
    hparams: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    _record: RunRecord | None = field(default=None, repr=False)
    notes: list[str] = field(default_factory=list)  # what reading it found wrong (a cut-short event file)

    def values(self, tag: str) -> list[float]:
        return [v for _, v in self.scalars.get(tag, [])]

    def mean(self, tag: str) -> float | None:
        vals = [v for v in self.values(tag) if math.isfinite(v)]
        return statistics.fmean(vals) if vals else None

    def last(self, tag: str) -> float | None:
        vals = self.values(tag)
        return vals[-1] if vals else None

    def maximum(self, *tags: str) -> float | None:
        vals = [v for t in tags for v in self.values(t)]
        return max(vals) if vals else None

    @property
    def record(self) -> RunRecord | None:
        """The run's :class:`~lit_compute.run_record.RunRecord`: its ``run.json``, or for a run written by 0.3.0 the
        record read from its run-info table and op-class texts (None: neither)."""
        if self._record is None:
            self._record = read_record(self.path) or from_legacy(
                self.texts.get("lit_compute/run", []), self.texts.get("compute/op_classes", [])
            )
        return self._record

    def stopped_early(self) -> tuple[int, int] | None:
        """``(steps trained, steps planned)`` when the run ended before its ``max_steps`` (interrupted, crashed, or
        still running), from the last training step logged; None when it finished or nothing says what was planned."""
        if "tune/trial" in self.texts:  # a tune trial stops once measured, by design
            return None
        want = self.record.planned_steps if self.record else None
        steps = [
            s for tag in ("train/loss", "time/step_ms", "compute/flops_per_step") for s, _ in self.scalars.get(tag, [])
        ]
        if not want or not steps:
            return None
        done = max(steps) + 1
        # a run logs every log_every_n_steps: the last logged step may trail the end by less than one interval
        intervals = sorted({b - a for a, b in zip(sorted(set(steps)), sorted(set(steps))[1:])})
        slack = intervals[0] if intervals else 1
        return (done, want) if done + slack <= want else None

    def window_seconds(self, family: str) -> dict[int, float]:
        """Each logging window's timed seconds by step: ``time/*`` windows from ``time/timed_steps x time/step_ms``,
        ``compute/*`` windows from ``compute/timed_seconds``."""
        if family == "time":
            steps, ms = dict(self.scalars.get("time/timed_steps", [])), dict(self.scalars.get("time/step_ms", []))
            return {s: steps[s] * ms[s] / 1e3 for s in steps if s in ms}
        return dict(self.scalars.get("compute/timed_seconds", []))

    def total(self, tag: str) -> float | None:
        """A rate or a fraction of time over the whole run: total work over total timed time, that is each logging
        window's value weighted by the seconds it was measured over. Runs that did not log their windows' time
        (older versions) get the mean of the windows."""
        weights = self.window_seconds("time" if tag.startswith("time/") else "compute")
        pairs = [(v, weights[s]) for s, v in self.scalars.get(tag, []) if math.isfinite(v) and weights.get(s, 0) > 0]
        if not pairs:
            return self.mean(tag)
        return sum(v * w for v, w in pairs) / sum(w for _, w in pairs)

    @property
    def mean_step_ms(self) -> float | None:
        """Total timed time over timed steps (the mean of the windows for older runs)."""
        steps, ms = dict(self.scalars.get("time/timed_steps", [])), dict(self.scalars.get("time/step_ms", []))
        pairs = [(ms[s], steps[s]) for s in steps if s in ms and steps[s] > 0]
        if not pairs:
            return self.mean("time/step_ms")
        return sum(m * n for m, n in pairs) / sum(n for _, n in pairs)

    def timed_span(self) -> tuple[int, int, int] | None:
        """``(timed steps, first logging step, last logging step)`` the totals are over (None: not logged)."""
        steps = self.scalars.get("time/timed_steps", [])
        if not steps:
            return None
        return int(sum(n for _, n in steps)), steps[0][0], steps[-1][0]

    @property
    def samples_per_sec(self) -> float | None:
        return self.total("time/samples_per_sec")

    @property
    def time_per_sample_ms(self) -> float | None:
        sps = self.samples_per_sec
        return 1e3 / sps if sps else None

    @property
    def forward_gflops(self) -> float | None:
        value = self.last("compute/forward_gflops_per_sample")
        if value is None:
            value = self.hparams.get("compute/forward_gflops_per_sample")
        return float(value) if value is not None else None

    @property
    def workload(self) -> tuple[str, str]:
        """What a run trains, for comparing like with like: its data (the datamodule's class, or its dataloaders) and
        its model's forward FLOPs per sample (3 significant figures; a different model or input size differs).
        Precision, memory format, loaders and compilation leave it unchanged, so tuned variants compare."""
        gflops = self.forward_gflops
        return (
            (self.record.data if self.record else "") or "?",
            f"{gflops:.3g} GFLOPs forward per sample" if gflops else "FLOPs unknown",
        )

    @property
    def tokens(self) -> bool:
        return "time/tokens_per_sec" in self.scalars or "compute/padding_fraction" in self.scalars

    def windows(self) -> list[tuple[int, int]]:
        """Profiler windows as ``(first step, last step)``: ``profiler/window_first_step`` logged at each window's
        last step (runs of 0.3.0: the header of each window's op table, "Window N: steps A-B")."""
        logged = [(int(v), step) for step, v in self.scalars.get("profiler/window_first_step", []) if math.isfinite(v)]
        if logged or not self.texts.get("profiler/top_ops"):
            return logged
        out = []
        for text in self.texts["profiler/top_ops"]:
            steps = text.partition(": steps ")[2].partition(",")[0]
            first, dash, last = steps.partition("-")
            if dash and first.isdigit() and last.isdigit():
                out.append((int(first), int(last)))
        return out

    def validation_steps(self) -> list[int]:
        for tag in ("val/loss", "compute/val_flops_per_step", "val/acc"):
            if tag in self.scalars:
                return sorted({s for s, _ in self.scalars[tag]})
        return []


def _natural(path: Path) -> tuple:
    """A sort key that puts ``version_2`` before ``version_10`` (numbers compared as numbers)."""
    parts: list[tuple[int, int | str]] = []
    for part in path.parts:
        digits = "".join(c if c.isdigit() else " " for c in part).split()
        words = "".join(" " if c.isdigit() else c for c in part).split()
        parts += [(1, w) for w in words] + [(0, int(d)) for d in digits]
    return tuple(parts)


def find_runs(log_dir: str | Path, latest: bool = False) -> list[Path]:
    """Directories under ``log_dir`` (itself included; an event file stands for its folder) that hold TensorBoard
    event files, in natural order (``version_2`` before ``version_10``)."""
    root = Path(log_dir)
    if not root.exists():
        raise ReportError(f"lit-compute report: {root} does not exist")
    if root.is_file() and root.name.startswith("events.out.tfevents."):
        root = root.parent
    dirs = sorted({p.parent for p in root.rglob("events.out.tfevents.*")}, key=_natural)
    if not dirs:
        raise ReportError(f"lit-compute report: no TensorBoard event files (events.out.tfevents.*) under {root}")
    if latest:
        dirs = [max(dirs, key=lambda d: max(f.stat().st_mtime for f in d.glob("events.out.tfevents.*")))]
    return dirs


def unreadable_tail(path: Path) -> tuple[int, int] | None:
    """``(bytes readable, bytes in the file)`` of an event file that ends in a partial record (cut short, as when a
    run is killed while writing, or damaged): TensorBoard reads the records before it and says nothing. None when
    every record is whole. Records are TFRecords: an 8-byte length, a 4-byte check, the data, a 4-byte check."""
    import struct

    data = path.read_bytes()
    at = 0
    while at + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        end = at + 12 + length + 4
        if end > len(data):
            break
        at = end
    return None if at == len(data) else (at, len(data))


def load_run(path: Path) -> Run:
    """Read one run. Raises :class:`ReportError` when it has none of lit_compute's tags."""
    import yaml
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(
        str(path),
        size_guidance={"scalars": 0, "tensors": 0, "images": 1, "histograms": 1, "audio": 1, "compressedHistograms": 1},
    )
    acc.Reload()
    tags = acc.Tags()
    run = Run(path=path, name=f"{path.parent.name}/{path.name}")
    if not any(v for v in tags.values() if isinstance(v, list)):
        files = sorted(path.glob("events.out.tfevents.*"))
        sizes = ", ".join(f"{f.stat().st_size} bytes" for f in files[:4]) + (", ..." if len(files) > 4 else "")
        raise ReportError(
            f"lit-compute report: {path} holds no readable TensorBoard events ({len(files)} event "
            f"file(s): {sizes}): empty or cut short, as when a run is killed while writing"
        )
    for tag in tags.get("scalars", []):
        run.scalars[tag] = [(e.step, e.value) for e in acc.Scalars(tag)]
    if not any(t.startswith(OUR_PREFIXES) for t in run.scalars):
        raise ReportError(
            f"lit-compute report: {path} has none of lit_compute's tags ({', '.join(OUR_PREFIXES)}); "
            "train with lit_compute's callbacks (FlopsLogger, StepTimeMonitor, ...) to get them"
        )
    for tag in tags.get("tensors", []):
        if tag.endswith("/text_summary"):
            run.texts[tag[: -len("/text_summary")]] = [
                s.decode() for ev in acc.Tensors(tag) for s in ev.tensor_proto.string_val
            ]
    _read_trial(run)
    for events in sorted(path.glob("events.out.tfevents.*")):
        tail = unreadable_tail(events)
        if tail is not None:
            run.notes.append(
                f"{events.name} ends in a partial or damaged record after {tail[0]:,} of its {tail[1]:,} "
                "bytes (cut short while writing?): only what comes before it is read"
            )
    hp = path / "hparams.yaml"
    if hp.is_file():
        try:
            loaded = yaml.safe_load(hp.read_text()) or {}
        except yaml.YAMLError:
            loaded = {}
        if isinstance(loaded, dict):
            run.hparams = loaded
    return run


def _read_trial(run: Run) -> None:
    """A tune trial's measurement stands in for the windows it logged too few steps to have."""
    if not any(t in run.scalars for t in _TRIAL_FIGURES):
        return
    for trial_tag, tag in _TRIAL_FIGURES.items():
        if trial_tag in run.scalars and tag not in run.scalars:
            run.scalars[tag] = list(run.scalars[trial_tag])
    steps, ms = run.scalars.get("tune/timed_steps"), run.scalars.get("tune/step_ms")
    if steps and ms and "compute/timed_seconds" not in run.scalars:
        run.scalars["compute/timed_seconds"] = [(steps[-1][0], steps[-1][1] * ms[-1][1] / 1e3)]


def name_runs(runs: list[Run]) -> None:
    """Name each run by its path from the common folder of all runs (the last two parts for a single run)."""
    if len(runs) < 2:
        return
    common = Path(os.path.commonpath([str(r.path.resolve()) for r in runs]))
    for run in runs:
        rel = run.path.resolve().relative_to(common).as_posix()
        run.name = rel if rel != "." else run.path.name
    names = [r.name for r in runs]
    for run in runs:  # the same folder given twice
        if names.count(run.name) > 1:
            run.name = str(run.path)
