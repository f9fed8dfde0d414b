"""One tune trial: the user's config with one set of knob values, trained by ``lit-compute fit`` in its own
process, measured by :class:`~lit_compute.tuning.recorder.TrialRecorder`; a crash, an out-of-memory or a hang
(the timeout) is recorded, never raised. The journal (``tune.jsonl``) keeps every finished trial so an
interrupted tune resumes where it stopped.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lit_compute.formatting import exit_status
from lit_compute.tuning.config_yaml import add_callback, as_list, class_name, dump_yaml, section, short
from lit_compute.tuning.measurement import Measurement
from lit_compute.warm_start import start_process, stop_group

# what a measurement leaves out; everything else (the model summary's forward of example_input_array included)
# runs as the user's fit runs it, so a setting that breaks the user's fit breaks its trial
_DROPPED_IN_TRIALS = ("ModelCheckpoint", "EarlyStopping", "RichProgressBar", "TQDMProgressBar")


class DiskFullError(OSError):
    """The disk the tune writes to is full: no trial's knob is to blame; the tune stops and keeps its journal."""

    def __init__(self, folder: Path, what: str) -> None:
        import shutil

        try:
            free = f"{shutil.disk_usage(folder).free / 1e6:.0f} MB free"
        except OSError:
            free = "free space unknown"
        super().__init__(
            errno.ENOSPC,
            f"the disk holding {folder} is full ({free}) while {what}: no knob is "
            "blamed and the journal is kept; free some space and run the same command again to resume",
        )


_DISK_FULL = ("no space left on device", "errno 28", "enospc", "disk quota exceeded")


@dataclass
class TrialSpec:
    """What to run: knob values, the rung (``short``, ``long`` or ``final``), a repeat index, a time allowance."""

    settings: dict[str, Any]
    rung: str
    repeat: int = 0
    seconds: float = 30.0

    @property
    def key(self) -> str:
        return json.dumps({"settings": self.settings, "rung": self.rung, "repeat": self.repeat}, sort_keys=True)

    def slug(self, index: int) -> str:
        parts = [f"{k}-{v}" for k, v in sorted(self.settings.items())] or ["baseline"]
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", "+".join(parts))[:80]
        return f"t{index:02d}_{self.rung}{self.repeat or ''}_{name}"


@dataclass
class TrialResult:
    """What a trial gave: ``status`` is ``ok``, ``oom``, ``crashed`` or ``timeout`` (the numerics verdict is the
    search's)."""

    key: str
    slug: str
    settings: dict[str, Any]
    rung: str
    repeat: int
    status: str
    reason: str = ""
    wall_s: float = 0.0
    rate: float | None = None  # samples/s, or non-padding tokens/s for token batches, per device
    ci: float | None = None
    unit: str = "samples/s"
    measured: Measurement = field(default_factory=lambda: Measurement())

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.rate is not None and self.rate > 0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrialResult:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def trial_config(
    config: dict[str, Any], out_json: Path, log_dir: Path, slug: str, spec: TrialSpec, recorder: dict[str, Any]
) -> dict[str, Any]:
    """The trial's config: the user's (with the knob values) plus what a measurement needs: one TensorBoard logger
    under ``log_dir``, no checkpoints, no validation but Lightning's sanity check, no progress bar (the model
    summary stays as configured), a fixed seed, the recorder callback (and a
    FlopsLogger against the machine's cached peak, for MFU, when the config has none). Training length is the recorder's
    to decide."""
    c = copy.deepcopy(config)
    seed = c.get("seed_everything")
    c["seed_everything"] = seed if isinstance(seed, int) and not isinstance(seed, bool) else 0
    c.pop("ckpt_path", None)
    trainer = section(c, "trainer")
    trainer["logger"] = {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": str(log_dir), "name": "runs", "version": slug},
    }
    # validation: only Lightning's sanity check at the start (it proves the setting validates), none during training
    trainer.update(
        enable_checkpointing=False,
        enable_progress_bar=False,
        check_val_every_n_epoch=100_000,
        max_epochs=-1,
        max_steps=int(recorder.get("max_timed_steps", 400)) + 200,
    )
    for key in ("val_check_interval", "max_time", "min_steps", "min_epochs"):
        trainer.pop(key, None)
    check = int(recorder.get("check_steps", 0) or 0)
    if check:  # a drift check: exactly its steps, and with --validate one validation run right after them
        trainer["max_steps"] = check + (1 if recorder.get("validate") else 0)
        if recorder.get("validate"):  # on the whole validation set: a batch-count limit would cover fewer samples
            trainer.pop("limit_val_batches", None)  # at a smaller micro-batch, and the two runs would differ
            accumulate = trainer.get("accumulate_grad_batches", 1)
            trainer.update(
                check_val_every_n_epoch=None,
                val_check_interval=check * (accumulate if isinstance(accumulate, int) else 1),
            )
    if trainer.get("num_sanity_val_steps") == 0:  # a setting that breaks validation must fail its trial, not the fit
        trainer["num_sanity_val_steps"] = 2
    callbacks = [cb for cb in as_list(trainer, "callbacks") if short(class_name(cb)) not in _DROPPED_IN_TRIALS]
    trainer["callbacks"] = callbacks
    if not any(short(class_name(cb)) == "FlopsLogger" for cb in callbacks):
        add_callback(c, "lit_compute.FlopsLogger", {"peak": "measure"})  # the cached peak the tune's table uses
    add_callback(c, "lit_compute.tuning.TrialRecorder", {"out": str(out_json), "seconds": spec.seconds, **recorder})
    return c


def _classify_failure(returncode: int, log_tail: str) -> tuple[str, str]:
    lowered = log_tail.lower()
    if "out of memory" in lowered or "outofmemoryerror" in lowered or "not enough memory" in lowered:
        return "oom", "out of memory"
    if returncode in (-signal.SIGKILL, 137):
        return "oom", "killed by SIGKILL (the kernel's out-of-memory killer?)"
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    errors = [
        line
        for line in lines
        if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line) or line.startswith("lit-compute: error")
    ]
    # no error line: the process ended some other way (a signal, os._exit), which is said with its last line
    ended = exit_status(returncode)
    return "crashed", (errors[-1] if errors else (f"{ended}: {lines[-1]}" if lines else ended))[:300]


def _read_tb_scalar(run_dir: Path, tag: str) -> float | None:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            return float(acc.Scalars(tag)[-1].value)
    except Exception:  # noqa: BLE001 - a missing figure is shown as n/a
        return None
    return None


def run_trial(
    config: dict[str, Any], spec: TrialSpec, index: int, log_dir: Path, timeout: float, recorder: dict[str, Any]
) -> TrialResult:
    """Train ``config`` with the trial settings in a child process and read what it measured.

    Raises:
        DiskFullError: the trial (or writing its files) found the disk full; nothing is recorded."""
    slug = spec.slug(index)
    trials = log_dir / "trials"
    out_json, yaml_file, log_file = trials / f"{slug}.json", trials / f"{slug}.yaml", trials / f"{slug}.log"
    try:
        trials.mkdir(parents=True, exist_ok=True)
        out_json.unlink(missing_ok=True)
        yaml_file.write_text(
            dump_yaml(
                trial_config(config, out_json, log_dir, slug, spec, recorder),
                header=[f"lit-compute tune trial {slug} (not for training: see the tuned file)"],
            )
        )
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(log_dir, f"writing trial {slug}") from None
        raise
    env = {k: v for k, v in os.environ.items() if k != "LIT_COMPUTE_RUN_FILE"}
    env["PYTHONUNBUFFERED"] = "1"
    start = time.monotonic()
    result = TrialResult(
        key=spec.key, slug=slug, settings=spec.settings, rung=spec.rung, repeat=spec.repeat, status="ok"
    )
    with open(log_file, "w") as log:
        # forked from a helper that imported torch and Lightning once (a new interpreter where it cannot): each
        # trial saves the imports' seconds
        proc = start_process(["-m", "lit_compute.cli", "fit", "--config", str(yaml_file)], stdout=log, env=env)
        try:
            returncode = proc.wait(timeout=max(1.0, timeout))
        except BaseException as err:  # the timeout, or Ctrl-C in the tune: the trial's process group goes too
            stop_group(proc)
            if not isinstance(err, subprocess.TimeoutExpired):
                raise
            result.status, result.reason = "timeout", f"no result after {timeout:.0f} s (stopped)"
            returncode = None
    result.wall_s = time.monotonic() - start
    if returncode is not None and returncode != 0:
        tail = log_file.read_text(errors="replace")[-6000:]
        if any(mark in tail.lower() for mark in _DISK_FULL):
            raise DiskFullError(log_dir, f"trial {slug} ran (see {log_file})")
        result.status, result.reason = _classify_failure(returncode, tail)
    if result.status == "ok":
        _read_result(result, out_json, log_dir / "runs" / slug)
    return result


def _read_result(result: TrialResult, out_json: Path, run_dir: Path) -> None:
    if not out_json.is_file():
        result.status, result.reason = "crashed", "the trial wrote no measurement (did training start?)"
        return
    data: Measurement = json.loads(out_json.read_text())
    tokens = data.get("tokens_per_sec")
    result.unit = "tokens/s" if tokens else "samples/s"
    result.rate = tokens if tokens else data.get("samples_per_sec")
    result.ci = data.get("tokens_ci") if tokens else data.get("ci")
    data["flops_per_sample"] = _read_tb_scalar(run_dir, "compute/flops_per_sample")
    result.measured = data
    if result.rate is None:
        result.status, result.reason = "crashed", data.get("stop_reason") or "no clean training step was timed"


# -- the journal ---------------------------------------------------------------------------------------------
class Journal:
    """``tune.jsonl``: one line per finished trial (and the tune's header), appended as they finish."""

    def __init__(self, path: Path, config_hash: str) -> None:
        self.path = path
        self.config_hash = config_hash
        self.results: dict[str, TrialResult] = {}
        self.spent_s = 0.0
        self.other_config = False
        if path.is_file():
            self._read()

    def _read(self) -> None:
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill: that trial runs again
                continue
            if not isinstance(entry, dict):  # valid JSON that is no entry (null, a number): skipped
                continue
            if entry.get("config_hash") != self.config_hash:
                self.other_config = True
                continue
            try:
                if entry.get("kind") == "trial":
                    result = TrialResult.from_json(entry["result"])
                    self.results[result.key] = result
                    self.spent_s += float(result.wall_s)
                elif entry.get("kind") == "overhead":
                    self.spent_s += float(entry.get("seconds", 0.0))
            except (AttributeError, KeyError, TypeError, ValueError):  # a damaged entry: that trial runs again
                continue

    def forget(self, key: str) -> None:
        """Run this trial again instead of replaying it (a failed baseline: the user may have fixed the model)."""
        result = self.results.pop(key, None)
        if result is not None:
            self.spent_s -= result.wall_s

    def add(self, result: TrialResult) -> None:
        self.results[result.key] = result
        self.spent_s += result.wall_s
        self._append({"kind": "trial", "result": asdict(result)})

    def add_overhead(self, what: str, seconds: float) -> None:
        self.spent_s += seconds
        self._append({"kind": "overhead", "what": what, "seconds": seconds})

    def _append(self, entry: dict[str, Any]) -> None:
        line = json.dumps({"config_hash": self.config_hash, **entry}, default=str) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a+b") as f:
                if f.tell() > 0:  # a last line cut by a kill has no newline: end it, or this entry joins it
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        line = "\n" + line
                f.write(line.encode())
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError(self.path.parent, "writing the journal") from None
            raise
