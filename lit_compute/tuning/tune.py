"""``lit-compute tune`` and :func:`tune`: the fastest configuration of the user's own config, measured.

``lit-compute tune --config my.yaml [--budget 15m] [--out my.tuned.yaml] [--log-dir tune_logs]`` trains the
config unchanged (the baseline), inspects the model it built to find the knobs that apply, searches them
greedily with successive halving inside the budget, guards every trial (crashes, out-of-memory, hangs, losses
that drift from the baseline's), measures the winner beside the baseline, and writes the winner as a config
``lit-compute fit`` accepts unchanged. Every tune works in its own folder under ``--log-dir``, named after the
config and a hash of it (``tune_logs/baseline-3f2a9c01/``), locked while it runs: its trials' TensorBoard runs
(``lit-compute report tune_logs/baseline-3f2a9c01/runs`` compares them), their configs and logs, and its journal
``tune.jsonl``, so any number of tunes share a log dir. A tune stopped by Ctrl-C resumes where it stopped.

Exit codes of ``lit-compute tune``: 0 done, 2 bad input or a tune that cannot go on (the baseline fails, a full
disk, another tune of the same config running), 130 interrupted (run the same command again to resume).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_compute import _compat
from lit_compute.files import write_whole
from lit_compute.tuning.config_yaml import ConfigError, config_hash, load_config
from lit_compute.tuning.knobs import KNOB_ORDER, Knob, Machine, apply_settings, find_knobs
from lit_compute.tuning.search import Budget, Options, Outcome, Search, rate_text
from lit_compute.tuning.summary import (
    drift_text,
    final_line,
    not_applied,
    table,
    tuned_faster,
    tuned_yaml,
    untuned_yaml,
)
from lit_compute.tuning.trials import DiskFullError, Journal, TrialResult, TrialSpec, run_trial


class TuneError(RuntimeError):
    """The tune cannot go on (the baseline itself fails, bad arguments): the message says why and what to do."""


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C: the finished trials are kept in ``journal``; the same command resumes."""

    def __init__(self, journal: Path) -> None:
        super().__init__(str(journal))
        self.journal = journal


def check_paths(out: Path, log_dir: Path) -> None:
    """``--out`` and ``--log-dir`` checked before the first trial (one line each, not a traceback minutes later)."""
    parent = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        raise TuneError(f"--out {out} is a folder; give the tuned YAML's file name, e.g. {out / 'tuned.yaml'}")
    if not parent.is_dir():
        what = "is a file" if parent.exists() else "does not exist"
        raise TuneError(f"--out {out}: its folder {parent} {what}; create the folder or choose another --out")
    if not os.access(parent, os.W_OK):
        raise TuneError(f"--out {out}: its folder {parent} is not writable; choose another --out")
    if log_dir.exists() and not log_dir.is_dir():
        raise TuneError(f"--log-dir {log_dir} is a file; give a folder for the trials (default tune_logs)")
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TuneError(f"--log-dir {log_dir} cannot be created ({err.strerror}); choose another folder") from None


def tune_folder(log_dir: Path, config_path: Path, digest: str) -> Path:
    """The tune's own folder under ``log_dir``: the config's name and a hash of it (and of the trial settings)."""
    return log_dir / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', config_path.stem)}-{digest[:8]}"


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold ``folder/.lock`` for the tune's run: a second tune of the same config at once stops with one line."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.seek(0)
            pid = lock.read().strip() or "?"
            raise TuneError(
                f"another tune of this config is running in {folder} (pid {pid}); wait for it, or tune "
                "with another --log-dir"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass
class TuneResult:
    """What :func:`tune` found. ``speedup`` is tuned / baseline throughput measured side by side (None when no
    knob was accepted)."""

    out: Path | None
    settings: dict[str, Any]
    speedup: float | None
    baseline_rate: float | None
    tuned_rate: float | None
    unit: str
    table: str
    summary: str
    journal: Path
    outcome: Outcome = field(repr=False, default=None)  # type: ignore[assignment]


def parse_budget(text: str | float | int) -> float:
    """``15m``, ``900s``, ``1h``, ``1h30m`` or a number of seconds, as seconds (a ValueError naming --budget)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        parts = re.fullmatch(
            r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m(?:in)?)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", str(text)
        )
        if not parts or not any(parts.groups()):
            raise ValueError(f"--budget {text!r} is not a duration; write it as 15m, 900s, 1h or 1h30m")
        h, m, s = (float(g) if g else 0.0 for g in parts.groups())
        seconds = 3600 * h + 60 * m + s
    if seconds < 30:
        raise ValueError(
            f"--budget {text!r} is {seconds:g} s: a tune needs at least 30 s (the baseline alone "
            "trains for a while); try 15m"
        )
    return seconds


def measure_machine(device: str) -> Machine:
    """bf16 support and speed (:func:`~lit_compute.hardware.this_machine.bf16_fast`, the answer ``whatif`` and the
    benches get too) and the float32/bf16 GEMM peaks (for MFU), measured once per tune."""
    import torch

    from lit_compute.data.dali_datamodule import dali_available
    from lit_compute.hardware.dtypes import has_tf32_cores
    from lit_compute.hardware.this_machine import bf16_fast, cached_peak_flops

    machine = Machine(device=device, dali=dali_available())
    # the same cached peaks FlopsLogger(peak="measure") uses: the table's MFU matches TensorBoard's compute/mfu
    fp32 = cached_peak_flops(device, torch.float32).flops
    peaks = {"float32": fp32}
    try:
        bf16 = cached_peak_flops(device, torch.bfloat16).flops
        peaks["bfloat16"] = bf16
        machine.bf16_supported = device == "cpu" or bool(torch.cuda.is_bf16_supported())
        machine.bf16_fast, why = bf16_fast(device)
        machine.note = f"float32 {fp32 / 1e12:.3g}, bfloat16 {bf16 / 1e12:.3g} TFLOP/s GEMM; {why}"
    except RuntimeError as err:
        machine.note = f"bfloat16 GEMM failed: {err}"
    machine.extras["peaks"] = peaks
    if device == "cuda":
        machine.extras["device_name"] = torch.cuda.get_device_name()
        machine.extras["tf32"] = has_tf32_cores()
    if machine.dali:
        import inspect

        from lit_compute.data import DALIImageDataModule

        machine.extras["dali_args"] = sorted(
            p for p in inspect.signature(DALIImageDataModule.__init__).parameters if p != "self"
        )
    return machine


class _Tuner:
    """One tune: the journal, the budget, the trial counter and the progress lines."""

    def __init__(
        self,
        config_path: Path,
        config: dict[str, Any],
        digest: str,
        budget_s: float,
        log_dir: Path,
        options: Options,
        recorder: dict[str, Any],
        fresh: bool,
        echo: Any,
    ) -> None:
        self.config_path = config_path
        self.config = config
        self.log_dir = log_dir
        self.options = options
        self.recorder = recorder
        self.echo = echo
        journal = log_dir / "tune.jsonl"
        if fresh and journal.is_file():
            journal.rename(journal.with_name(f"tune.{time.strftime('%Y%m%d-%H%M%S')}.jsonl"))
        self.journal = Journal(journal, digest)
        if self.journal.other_config:
            echo(f"note: {journal} also holds trials of another config (or other trial settings); they are ignored")
        if self.journal.results:
            echo(
                f"resuming from {journal}: {len(self.journal.results)} trial(s) done, "
                f"{self.journal.spent_s:.0f} s of the budget spent"
            )
        self.budget = Budget(budget_s, self.journal.spent_s)
        self.device_memory: int | None = None
        self.knobs: list[Knob] = []
        self.index = 0
        self.startup_s = 60.0
        self.step_s = 1.0
        self.interrupted = False  # set by Ctrl-C (see _remembered_ctrl_c)

    def estimate(self, spec: TrialSpec) -> float:
        """Seconds a trial takes: the baseline's start-up (process, data, model) plus warm-up and the allowance
        (and the knobs' own warm-up: compilation)."""
        warmup = (max(self.recorder["warmup_steps"], self.recorder["loss_steps"]) + 2) * self.step_s
        extra = sum(k.warmup_s for k in self.knobs if k.name in spec.settings)
        return self.startup_s + warmup + spec.seconds + extra

    def measure(
        self, spec: TrialSpec, estimate: float, limit: float, recorder_extra: dict[str, Any] | None = None
    ) -> TrialResult:
        if self.interrupted:  # a Ctrl-C something swallowed: stop before starting anything more
            raise KeyboardInterrupt
        index, self.index = self.index, self.index + 1
        cached = self.journal.results.get(spec.key)
        if cached is not None:
            self._progress(cached, cached=True)
            return cached
        # a hang is a trial past twice its estimate; never past what the search (or the budget) has left
        timeout = max(10.0, min(max(60.0, 2 * estimate + 30), limit))
        config = apply_settings(self.config, self.knobs, spec.settings)
        too_big = self.predicted_over(config, spec, index)
        if too_big is not None:
            self.journal.add(too_big)
            self._progress(too_big)
            return too_big
        try:
            result = run_trial(config, spec, index, self.log_dir, timeout, {**self.recorder, **(recorder_extra or {})})
            self.journal.add(result)
        except DiskFullError as err:
            raise TuneError(err.strerror) from None
        self._progress(result)
        return result

    def predicted_over(self, config: dict[str, Any], spec: TrialSpec, index: int) -> TrialResult | None:
        """With ``--device-memory``: a trial predicted (:func:`lit_compute.planning.estimate.predicted_peak`) to
        need more than the target device holds is not started; its result says so. None: run it."""
        if self.device_memory is None:
            return None
        from lit_compute.planning.estimate import EstimateError, predicted_peak
        from lit_compute.tuning.config_yaml import dump_yaml

        path = self.log_dir / "trials" / f"{spec.slug(index)}.predict.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump_yaml(config))
        start = time.monotonic()
        try:
            peak = predicted_peak(path).peak
        except EstimateError as err:
            self.echo(f"  {spec.slug(index)}: no memory prediction ({err}); the trial runs")
            return None
        finally:
            self.journal.add_overhead("memory prediction", time.monotonic() - start)
        if peak <= self.device_memory:
            return None
        return TrialResult(
            key=spec.key,
            slug=spec.slug(index),
            settings=spec.settings,
            rung=spec.rung,
            repeat=spec.repeat,
            status="skipped",
            reason=f"predicted peak {peak / 1e9:.3g} GB > --device-memory {self.device_memory / 1e9:.3g} GB "
            "(not started)",
        )

    def _progress(self, result: TrialResult, cached: bool = False) -> None:
        what = ", ".join(f"{k}={v}" for k, v in result.settings.items()) or "baseline"
        figure = (
            f"{rate_text(result.rate)} {result.unit}" + (f" +-{100 * result.ci:.1f}%" if result.ci else "")
            if result.rate
            else f"{result.status}: {result.reason}"
        )
        tail = " (from the journal)" if cached else f" [{result.wall_s:.0f} s]"
        self.echo(f"  {result.slug.split('_', 1)[0]} {result.rung:<5} {what}: {figure}{tail}")

    def baseline(self) -> TrialResult:
        spec = TrialSpec({}, "long", 0, self.options.long_s)
        earlier = self.journal.results.get(spec.key)
        if earlier is not None and not earlier.ok:  # never replayed: the model may have been fixed since
            self.journal.forget(spec.key)
            self.budget.spent_before_s = self.journal.spent_s
            self.echo(f"  the journal's baseline failed ({earlier.status}); running it again")
        result = self.measure(spec, self.estimate(spec), max(120.0, 0.5 * self.budget.total_s))
        if result.status == "skipped":  # predicted not to fit --device-memory: the fix is memory, not the config
            raise TuneError(
                f"the baseline (your config unchanged) is not started: {result.reason}. Give the device's "
                "real memory with --device-memory, or lower the config's batch size (lit-compute estimate "
                f"--config {self.config_path} --memory <size> finds the largest micro-batch that fits)"
            )
        if not result.ok:
            raise TuneError(
                f"the baseline (your config unchanged) failed: {result.status}: {result.reason}. "
                f"See {self.log_dir / 'trials' / (result.slug + '.log')}; `lit-compute fit --config "
                f"{self.config_path}` must train before it can be tuned (once it does, the same command "
                "runs the baseline again; --fresh also starts a new journal)"
            )
        facts = result.measured.get("facts", {})
        timed = result.measured.get("timed_steps") or 0
        per_step = (result.measured.get("samples_per_step") or 0) / (result.measured.get("samples_per_sec") or 1)
        self.step_s = per_step or 1.0
        self.startup_s = max(5.0, result.wall_s - timed * self.step_s - self.recorder["warmup_steps"] * self.step_s)
        if not facts:
            raise TuneError("the baseline trial recorded nothing about the model (did training start?)")
        return result

    def machine(self, device: str) -> Machine:
        """What this machine answered (``measure_machine``: the hardware room's cached peaks and bf16 answer), kept in
        the journal's folder once per journal so a resumed or replayed tune finds the same knobs."""
        path = self.log_dir / "machine.json"
        if path.is_file() and self.journal.results:
            data = json.loads(path.read_text())
            if data.get("config_hash") == self.journal.config_hash:
                data.pop("config_hash")
                return Machine(**data)
        start = time.monotonic()
        machine = measure_machine(device)
        self.journal.add_overhead("machine", time.monotonic() - start)
        path.write_text(json.dumps({"config_hash": self.journal.config_hash, **dataclasses.asdict(machine)}))
        return machine


def tune(
    config: str | Path,
    budget: str | float = "15m",
    out: str | Path | None = None,
    log_dir: str | Path = "tune_logs",
    knobs: list[str] | None = None,
    skip: list[str] | None = None,
    min_gain: float = 0.03,
    loss_tolerance: float = 0.05,
    trajectory_tolerance: float = 0.35,
    loss_steps: int = 8,
    warmup_steps: int = 3,
    short_seconds: float | None = None,
    long_seconds: float | None = None,
    side_by_side: int = 3,
    fresh: bool = False,
    echo: Any = None,
    device_memory: str | float | None = None,
    check_steps: int = 0,
    validate: bool = False,
) -> TuneResult:
    """Tune ``config`` (a ``lit-compute fit`` YAML) within ``budget`` and write the fastest configuration to ``out``.

    Args:
        config: The YAML you train with.
        budget: Wall-clock time for the whole tune (``"15m"``, ``"900s"``, seconds); kept within 10%.
        out: The tuned YAML (default: ``<config>.tuned.yaml`` beside the config).
        log_dir: Where the tune's own folder goes (``<config name>-<hash>/``: trial configs, logs, TensorBoard runs
            and the journal ``tune.jsonl``).
        knobs: Only these knobs (names of :data:`~lit_compute.tuning.knobs.KNOB_ORDER`); default: all that apply.
        skip: Knobs left out.
        min_gain: A knob is kept only when it is at least this much faster (0.03 = 3%).
        loss_tolerance: A trial whose first-step loss (same weights, same batch) differs from the baseline's by
            more than this fraction is rejected.
        trajectory_tolerance: A trial whose mean loss over the first ``loss_steps`` steps differs from the
            baseline's by more than this fraction is rejected (early training is chaotic: this catches divergence).
        loss_steps: Steps whose losses are compared (from the same seed).
        warmup_steps: Steps left out of every throughput.
        short_seconds: Timed seconds of a short trial (default: 1.5% of the budget, 2-20 s).
        long_seconds: Timed seconds of a long trial (default: 4% of the budget, 4-45 s).
        side_by_side: Pairs of final trials (baseline, tuned, alternating) the speed-up is measured from.
        fresh: Start anew (the old journal is kept under a dated name) instead of resuming.
        echo: Where progress lines go (default: standard output).
        device_memory: Tune for a device of this much memory (``"24GB"``, bytes): a trial whose step is predicted
            (:func:`lit_compute.estimate`, on fake tensors) to need more is not started, and the table says so.

    Returns:
        A :class:`TuneResult` (the speed-up, the settings, the table, the summary line).

    Raises:
        TuneError: the baseline itself fails, or an argument is wrong (the message names it).
    """
    echo = echo or (lambda line: (sys.stdout.write(line + "\n"), sys.stdout.flush()))
    try:
        budget_s = parse_budget(budget)
    except ValueError as err:
        raise TuneError(str(err)) from None
    for name, value in (("knobs", knobs), ("skip", skip)):
        unknown = sorted(set(value or []) - set(KNOB_ORDER))
        if unknown:
            raise TuneError(f"--{name} {','.join(unknown)}: no such knob; choose from {', '.join(KNOB_ORDER)}")
    if check_steps and check_steps < warmup_steps + 2:
        raise TuneError(
            f"--check-steps {check_steps}: a drift check needs more steps than the warm-up "
            f"({warmup_steps}); give at least {warmup_steps + 2}, e.g. --check-steps 200"
        )
    if check_steps < 0:
        raise TuneError(f"--check-steps {check_steps} must be positive (e.g. --check-steps 200), or 0 for none")
    if validate and not check_steps:
        raise TuneError("--validate compares validation after a drift check's steps: give --check-steps N too")
    if not 0 <= min_gain < 1:
        raise TuneError(f"--min-gain {min_gain} must be in [0, 1) (0.03 keeps knobs at least 3% faster)")
    for name, tolerance in (("loss-tolerance", loss_tolerance), ("trajectory-tolerance", trajectory_tolerance)):
        if not 0 < tolerance < 10:
            raise TuneError(f"--{name} {tolerance} must be a fraction in (0, 10), such as 0.05")
    config_path = Path(config)
    out_path = Path(out) if out else config_path.with_name(config_path.stem + ".tuned.yaml")
    options = Options(
        short_s=short_seconds or min(20.0, max(2.0, 0.015 * budget_s)),
        long_s=long_seconds or min(45.0, max(4.0, 0.04 * budget_s)),
        min_gain=min_gain,
        loss_tolerance=loss_tolerance,
        trajectory_tolerance=trajectory_tolerance,
        final_pairs=max(1, side_by_side),
    )
    recorder = {"warmup_steps": warmup_steps, "loss_steps": loss_steps}
    check_paths(out_path, Path(log_dir))
    capacity = None
    if device_memory is not None:
        from lit_compute.planning.capacity import CapacityError, parse_memory

        try:
            capacity = parse_memory(device_memory, option="--device-memory")
        except CapacityError as err:
            raise TuneError(str(err)) from None
    try:
        user_config = load_config(config_path)
    except ConfigError as err:
        raise TuneError(str(err)) from None
    digest = config_hash({"config": user_config, "recorder": recorder})
    folder = tune_folder(Path(log_dir), config_path, digest)
    with locked(folder):
        tuner = _Tuner(config_path, user_config, digest, budget_s, folder, options, recorder, fresh, echo)
        tuner.device_memory = capacity
        try:
            with _remembered_ctrl_c(tuner):
                return _tune(tuner, config_path, out_path, budget_s, knobs, skip, echo, check_steps, validate)
        except KeyboardInterrupt:
            raise TuneInterrupted(tuner.journal.path) from None


@contextlib.contextmanager
def _remembered_ctrl_c(tuner: _Tuner) -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt as always and is also remembered: one landing inside a C extension's import
    (DALI's, while the knobs are found) can be swallowed there, and the tune then stops before its next trial
    instead of tuning on."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_ctrl_c(signum: int, frame: Any) -> None:
        tuner.interrupted = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _drift_check(tuner: _Tuner, outcome: Outcome, steps: int, validate: bool, echo: Any) -> str:
    """``--check-steps``: the baseline and the tuned configuration trained ``steps`` steps each from the same seed
    (and with ``--validate`` validated right after), outside the budget; how far the tuned one drifted."""
    rung = f"check{steps}{'v' if validate else ''}"
    extra = {"check_steps": steps, "validate": validate}
    echo(
        f"drift check: baseline and tuned, {steps} steps each{' and a validation run' if validate else ''} "
        "(outside the budget)"
    )
    results = []
    for settings in ({}, dict(outcome.settings)):
        spec = TrialSpec(settings, rung, 0, 1.0)
        estimate = tuner.startup_s + (steps + 10) * tuner.step_s * (3 if validate else 1)
        results.append(tuner.measure(spec, estimate, math.inf, recorder_extra=extra))
    return drift_text(results[0], results[1], tuner.recorder["warmup_steps"], tuner.options.loss_tolerance)


def _tune(
    tuner: _Tuner,
    config_path: Path,
    out_path: Path,
    budget_s: float,
    knobs: list[str] | None,
    skip: list[str] | None,
    echo: Any,
    check_steps: int = 0,
    validate: bool = False,
) -> TuneResult:
    log_dir, options = tuner.log_dir, tuner.options
    echo(f"lit-compute tune: {config_path}, budget {budget_s:.0f} s, trials in {log_dir}/")
    baseline = tuner.baseline()
    facts = baseline.measured["facts"]
    machine = tuner.machine(str(facts.get("device", "cpu")))
    tuner.knobs, skipped = find_knobs(facts, machine, only=knobs, skip=skip)
    echo(
        f"knobs to try: {', '.join(k.name for k in tuner.knobs) or 'none'}; not applicable: "
        f"{', '.join(s.name for s in skipped) or 'none'}"
    )
    search = Search(
        tuner.knobs,
        tuner.measure,
        tuner.budget,
        options,
        tuner.estimate,
        cached=lambda spec: spec.key in tuner.journal.results,
    )
    outcome = search.run(baseline)
    peaks = machine.extras.get("peaks", {})
    summary = final_line(outcome)
    if check_steps and tuned_faster(outcome):
        summary += " " + _drift_check(tuner, outcome, check_steps, validate, echo)
    text = table(outcome, tuner.knobs, peaks)
    lines = not_applied(skipped, outcome)
    out_written: Path | None = None
    if tuned_faster(outcome):
        write_whole(
            out_path,
            tuned_yaml(
                tuner.config,
                tuner.knobs,
                outcome,
                str(config_path),
                skipped,
                summary,
                source_text=config_path.read_text(),
            ),
        )
        out_written = out_path
    else:  # always an --out: the user's file as it is, saying what was tried
        write_whole(out_path, untuned_yaml(config_path.read_text(), str(config_path), summary, outcome, skipped))
    echo("")
    echo(text)
    if lines:
        echo("\nNot applied:\n" + "\n".join(lines))
    echo(
        f"\nJournal: {tuner.journal.path}; TensorBoard runs: {log_dir / 'runs'} "
        f"(lit-compute report {log_dir / 'runs'} --out tune_report.md); budget {budget_s:.0f} s, "
        f"spent {tuner.budget.spent():.0f} s"
    )
    if out_written:
        echo(f"Tuned config: {out_written} (lit-compute fit --config {out_written})")
    else:
        echo(f"Nothing beat the baseline: {out_path} is your config unchanged, with what was tried in its header")
    echo(summary)
    tuned_rates = [r.rate for r in outcome.final_tuned if r.ok and r.rate]
    base_rates = [r.rate for r in outcome.final_baseline if r.ok and r.rate]
    return TuneResult(
        out=out_written,
        settings=dict(outcome.settings),
        speedup=outcome.speedup,
        baseline_rate=sum(base_rates) / len(base_rates) if base_rates else baseline.rate,
        tuned_rate=sum(tuned_rates) / len(tuned_rates) if tuned_rates else None,
        unit=baseline.unit,
        table=text,
        summary=summary,
        journal=tuner.journal.path,
        outcome=outcome,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lit-compute tune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="the YAML you train with (lit-compute fit --config FILE)")
    parser.add_argument(
        "--budget", default="15m", help="wall-clock time for the whole tune: 15m, 900s, 1h (default 15m)"
    )
    parser.add_argument("--out", default=None, help="the tuned YAML (default: CONFIG.tuned.yaml beside the config)")
    parser.add_argument(
        "--log-dir", default="tune_logs", help="trials, TensorBoard runs, the journal (default tune_logs)"
    )
    parser.add_argument("--knobs", default=None, help=f"only these knobs, comma-separated ({', '.join(KNOB_ORDER)})")
    parser.add_argument("--skip", default=None, help="knobs left out, comma-separated")
    parser.add_argument("--min-gain", type=float, default=0.03, help="keep a knob only when at least this much faster")
    parser.add_argument(
        "--loss-tolerance",
        type=float,
        default=0.05,
        help="reject a trial whose first-step loss differs more from the baseline's (0.05 = 5%%)",
    )
    parser.add_argument(
        "--trajectory-tolerance",
        type=float,
        default=0.35,
        help="reject a trial whose mean loss over the first --loss-steps differs more (divergence)",
    )
    parser.add_argument("--loss-steps", type=int, default=8, help="steps whose losses are compared")
    parser.add_argument("--short-seconds", type=float, default=None, help="timed seconds of a short trial")
    parser.add_argument("--long-seconds", type=float, default=None, help="timed seconds of a long trial")
    parser.add_argument(
        "--side-by-side",
        type=int,
        default=3,
        help="pairs of final trials (baseline, tuned, alternating) the speed-up comes from",
    )
    parser.add_argument("--fresh", action="store_true", help="start anew instead of resuming from the journal")
    parser.add_argument(
        "--markdown",
        default=None,
        help="also write the table and the result, with the command, commit, date and machine, to FILE",
    )
    parser.add_argument(
        "--check-steps",
        type=int,
        default=0,
        help="after the search, train the baseline and the tuned config N steps each from the same "
        "seed and say how far the tuned loss drifted (outside the budget)",
    )
    parser.add_argument(
        "--validate",
        action="store_true",
        help="with --check-steps: also validate both after their N steps and compare the metrics",
    )
    parser.add_argument(
        "--device-memory",
        default=None,
        help="tune for a device of this memory (24GB): trials predicted not to fit are not started",
    )
    args = parser.parse_args(argv)

    def split(text: str | None) -> list[str] | None:
        return [s.strip() for s in text.split(",") if s.strip()] if text else None

    try:
        result = tune(
            args.config,
            args.budget,
            args.out,
            args.log_dir,
            knobs=split(args.knobs),
            skip=split(args.skip),
            min_gain=args.min_gain,
            loss_tolerance=args.loss_tolerance,
            trajectory_tolerance=args.trajectory_tolerance,
            loss_steps=args.loss_steps,
            short_seconds=args.short_seconds,
            long_seconds=args.long_seconds,
            side_by_side=args.side_by_side,
            fresh=args.fresh,
            device_memory=args.device_memory,
            check_steps=args.check_steps,
            validate=args.validate,
        )
        if args.markdown:
            from lit_compute.figures import figure_header
            from lit_compute.hardware.this_machine import machine_line

            command = "lit-compute tune " + " ".join(a for a in argv if a != "--markdown" and a != args.markdown)
            Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(args.markdown).write_text(
                figure_header(command, machine_line()) + result.table + "\n\n" + result.summary + "\n"
            )
    except TuneError as err:
        sys.stderr.write(f"lit-compute tune: error: {err}\n")
        return 2
    except KeyboardInterrupt as err:
        _compat.forget_keyboard_interrupt()  # exit 130, not killed by SIGINT at exit
        where = err.journal if isinstance(err, TuneInterrupted) else Path(args.log_dir)
        sys.stderr.write(
            f"\nlit-compute tune: interrupted; finished trials are kept in {where}: "
            "run the same command again to resume\n"
        )
        return 130
    return 0
