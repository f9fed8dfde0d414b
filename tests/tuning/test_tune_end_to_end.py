"""``lit-compute tune`` end to end in its own processes, on a tiny model built to meet every guard: a knob that
doubles the throughput (micro-batches), one that makes the loss NaN (channels-last), one that runs out of memory
(a fused optimizer); interrupted by SIGINT after the baseline and resumed from the journal; the tuned YAML
trains with ``lit-compute fit``. And a trial that hangs is stopped at its timeout with its process group."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_compute.tuning.trials import TrialSpec, run_trial

pytestmark = pytest.mark.slow  # the fast tier (make test-fast) leaves these out

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {
    "seed_everything": 0,
    "trainer": {
        "accelerator": "cpu",
        "devices": 1,
        "max_steps": 3,
        "log_every_n_steps": 2,
        "enable_checkpointing": False,
        "logger": False,
    },
    "model": {"class_path": "tests.tuning.tune_models.SleepyRegression"},
    "data": {"class_path": "tests.tuning.tune_models.RandomRegressionData", "init_args": {"batch_size": 16}},
}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _journal(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _folder(logs: Path, name: str = "tiny") -> Path:
    """The tune's own folder under --log-dir (config name and hash)."""
    found = sorted(logs.glob(f"{name}-*"))
    return found[0] if found else logs / f"{name}-missing"


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
def test_tune_interrupted_resumes_rejects_nan_records_oom_and_writes_a_yaml_that_trains(tmp_path, monkeypatch):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    out, logs = tmp_path / "tiny.tuned.yaml", tmp_path / "tune_logs"
    command = [
        sys.executable,
        "-m",
        "lit_compute.cli",
        "tune",
        "--config",
        str(config),
        "--budget",
        "4m",
        "--out",
        str(out),
        "--log-dir",
        str(logs),
        "--knobs",
        "channels_last,fused_optimizer,micro_batch",
        "--short-seconds",
        "1",
        "--long-seconds",
        "2",
        "--loss-steps",
        "4",
        "--side-by-side",
        "1",
        "--markdown",
        str(tmp_path / "figures" / "tune.md"),
    ]
    first = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not _journal(_folder(logs) / "tune.jsonl") and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _journal(_folder(logs) / "tune.jsonl"), "the baseline trial never finished"
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 130, err[-2000:]
    assert "interrupted; finished trials are kept in" in err
    assert "run the same command again to resume" in err

    second = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    text = second.stdout
    assert "resuming from" in text
    assert "t00 long  baseline:" in text
    assert "(from the journal)" in text
    folder = _folder(logs)
    entries = [e["result"] for e in _journal(folder / "tune.jsonl") if e["kind"] == "trial"]
    assert sum(1 for e in entries if e["settings"] == {} and e["rung"] == "long") == 1  # the baseline ran once
    by_knob = {tuple(sorted(e["settings"])): e for e in entries if e["rung"] == "short"}
    nan = by_knob[("channels_last",)]["measured"]["losses"][0]
    assert nan != nan  # NaN
    assert by_knob[("fused_optimizer",)]["status"] == "oom"
    # the table says what happened to each
    assert "rejected: the training loss is nan at step 0 (the baseline's is finite)" in text
    assert "rejected: oom: out of memory" in text
    assert "micro-batch 8 x 2 accumulated (same global batch 16)" in text
    assert "Tuned: " in text
    assert "x samples/s measured side by side (1 run(s) each, alternating)" in text

    figure = (tmp_path / "figures" / "tune.md").read_text()  # the table and the result under the figure header
    assert figure.startswith(f"<!-- written by `lit-compute tune --config {config} --budget 4m")
    assert "--markdown" not in figure.splitlines()[0]
    assert "| t00 |" in figure
    assert "Tuned: " in figure

    tuned = yaml.safe_load(out.read_text())
    assert tuned["data"]["init_args"]["batch_size"] == 8
    assert tuned["trainer"]["accumulate_grad_batches"] == 2
    assert "speedup" not in str(tuned["trainer"].get("callbacks", []))  # the rejected knobs are not in it
    assert "# tune: micro-batch 8 x 2 accumulated (same global batch 16): " in out.read_text()
    # every trial is a TensorBoard run
    runs = sorted(p.name for p in (folder / "runs").iterdir())
    assert any(name.startswith("t00_long_baseline") for name in runs), runs
    acc = EventAccumulator(str(folder / "runs" / next(n for n in runs if n.startswith("t00"))))
    acc.Reload()
    assert "compute/flops_per_sample" in acc.Tags()["scalars"]
    # the report the tune suggests shows each trial's throughput, step time and MFU, and no trial "stopped early"
    # in this process: the console script is test_wheel's
    from lit_compute.cli import main as lit_compute_main

    assert (
        lit_compute_main(["report", str(folder / "runs"), "--out", str(tmp_path / "tune_report.md"), "--no-plots"]) == 0
    )
    text = (tmp_path / "tune_report.md").read_text()
    assert "stopped at step" not in text
    assert "Stopped early" not in text
    baseline_section = text[text.index("## t00_long_baseline") :].split("\n## ", 1)[0]
    for figure in ("mean step time (ms)", "samples/s", "MFU"):
        row = next(line for line in baseline_section.splitlines() if line.startswith(f"| {figure} |"))
        assert "n/a" not in row.split("|")[2], row

    # the tuned file is a config lit-compute fit accepts unchanged and trains (in this process; the console script a
    # user types is test_wheel's)
    monkeypatch.chdir(tmp_path)
    assert lit_compute_main(["fit", "--config", str(out)]) == 0


def test_a_trial_that_hangs_is_stopped_at_its_timeout_and_recorded(tmp_path, monkeypatch):
    """Here a trial is a new interpreter (warm start off: the fallback's path); the killed-tune test below stops a
    forked one."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("LIT_COMPUTE_WARM_START", "0")
    config = {**CONFIG, "model": {"class_path": "tests.tuning.tune_models.NeverStarts"}}
    result = run_trial(
        config, TrialSpec({}, "short", 0, 1.0), 0, tmp_path, timeout=3.0, recorder={"warmup_steps": 1, "loss_steps": 2}
    )
    assert result.status == "timeout"
    assert result.reason == "no result after 3 s (stopped)"
    assert result.wall_s >= 3.0  # it waited out its timeout (no upper bound: a busy machine is slower)
    assert (tmp_path / "trials" / "t00_short_baseline.yaml").is_file()


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
def test_ctrl_c_during_an_import_still_exits_130(tmp_path):
    """Ctrl-C landing while a dataclass is being built (``exec`` of a string inside an import) left CPython's mark of
    an unhandled KeyboardInterrupt set although the tune caught it: under ``python -m`` the process printed its
    resume line, then killed itself with SIGINT at exit (-2 instead of 130, seen on a loaded machine)."""
    (tmp_path / "any.yaml").write_text(yaml.safe_dump(CONFIG))
    (tmp_path / "interrupted_tune.py").write_text(
        "import sys\n"
        "import lit_compute.tuning.tune\n"
        "from lit_compute.cli import main\n"
        "def interrupted(*args, **kwargs):  # as Ctrl-C inside a dataclass's exec would\n"
        "    exec('from dataclasses import make_dataclass\\nraise KeyboardInterrupt')\n"
        "sys.modules['lit_compute.tuning.tune'].tune = interrupted  # (the package's `tune` is the function)\n"
        "sys.exit(main(['tune', '--config', 'any.yaml', '--log-dir', 'tune_logs']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "interrupted_tune"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "lit-compute tune: interrupted; finished trials are kept in tune_logs" in proc.stderr


def test_a_failed_baseline_is_run_again_and_a_full_disk_blames_no_knob(tmp_path, monkeypatch):
    """The user fixes a model bug (config unchanged): the same command runs the baseline again instead of replaying
    the crash; a full disk during a trial names the disk, journals nothing for the trial and ends the tune (exit 2)."""
    from lit_compute.tuning.tune import TuneError, tune

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    config = {**CONFIG, "model": {"class_path": "tests.tuning.tune_models.Faulty"}}
    (tmp_path / "faulty.yaml").write_text(yaml.safe_dump(config))
    args = {
        "budget": "2m",
        "log_dir": tmp_path / "logs",
        "short_seconds": 1,
        "long_seconds": 1,
        "side_by_side": 1,
        "echo": lambda line: lines.append(line),
    }
    lines: list[str] = []
    (tmp_path / "fault.txt").write_text("crash")
    with pytest.raises(TuneError, match=r"the baseline .* failed: crashed: RuntimeError: a bug in the model.*--fresh"):
        tune("faulty.yaml", **args)
    journal = _folder(tmp_path / "logs", "faulty") / "tune.jsonl"
    assert [e["result"]["status"] for e in _journal(journal) if e["kind"] == "trial"] == ["crashed"]
    (tmp_path / "fault.txt").write_text("disk full")  # "fixed" - and now the disk fills up
    with pytest.raises(TuneError, match=r"the disk holding .*logs.* is full .* no knob is blamed") as info:
        tune("faulty.yaml", **args)
    assert "\n" not in str(info.value)
    assert any("running it again" in line for line in lines)  # not replayed from the journal
    assert [e["result"]["status"] for e in _journal(journal) if e["kind"] == "trial"] == ["crashed"]


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
def test_a_killed_tune_leaves_no_trial_running(tmp_path):
    """SIGKILL cannot be caught: the trial's process gets the kernel's parent-death signal instead of training on
    as an orphan."""
    import psutil

    config = {**CONFIG, "model": {"class_path": "tests.tuning.tune_models.NeverStarts"}}
    (tmp_path / "hang.yaml").write_text(yaml.safe_dump(config))
    tune = subprocess.Popen(
        [sys.executable, "-m", "lit_compute.cli", "tune", "--config", "hang.yaml", "--budget", "5m"],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, trials, everyone = time.monotonic() + 120, [], []
        while not trials and time.monotonic() < deadline and tune.poll() is None:
            # a trial is forked by the tune's warm helper (a grandchild), or started as `python -m lit_compute.cli fit`
            with contextlib.suppress(psutil.NoSuchProcess):
                everyone = psutil.Process(tune.pid).children(recursive=True)
                trials = [c for c in everyone if c.ppid() != tune.pid or "fit" in " ".join(c.cmdline())]
            time.sleep(0.2)
        assert trials, "the trial never started"
        tune.kill()
        tune.wait(timeout=30)
        gone, alive = psutil.wait_procs(everyone, timeout=30)  # a bound for a dead machine, not a speed test
        assert not alive, f"{[(p.pid, p.cmdline()) for p in alive]} outlived the killed tune"
    finally:
        tune.kill()
