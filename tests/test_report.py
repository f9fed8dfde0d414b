"""lit-compute report and what TensorBoard serves for a lit_compute run."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import lightning.pytorch as pl
import pytest
from PIL import Image
from torch.utils.data import DataLoader

from lit_compute import (
    DeviceMonitor,
    FlopsLogger,
    FP32BatchNormPrecision,
    LossScaleMonitor,
    ProfilerWindow,
    StepTimeMonitor,
)
from lit_compute.report import ReportError, build_report, load_run, main

from .conftest import DrivenClock, TimedImages, clocked_trainer, read_events, scalar_values, tiny_model


def _train(root: Path, name: str, load_s: float = 0.0005, steps: int = 8) -> Path:
    callbacks = [FlopsLogger(peak_flops=1e11, log_every_n_steps=2), StepTimeMonitor(log_every_n_steps=2, window=4),
                 DeviceMonitor(log_every_n_steps=2), LossScaleMonitor(log_every_n_steps=2),
                 ProfilerWindow(start_step=3, warmup=1, active=2)]
    logger = pl.loggers.TensorBoardLogger(str(root), name=name, version=0)
    clock = DrivenClock()
    trainer = clocked_trainer(root, clock, max_steps=steps, limit_train_batches=steps, callbacks=callbacks,
                              logger=logger, plugins=[FP32BatchNormPrecision("16-mixed")], limit_val_batches=0)
    model = tiny_model()
    model.training_step = _timed(model.training_step, clock, 0.02)
    trainer.fit(model, train_dataloaders=DataLoader(TimedImages(clock, load_s, n=64, size=32), batch_size=8))
    return Path(logger.log_dir)


def _timed(step, clock: DrivenClock, seconds: float):
    def training_step(*args, **kwargs):
        clock.advance(seconds)
        return step(*args, **kwargs)

    return training_step


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return root, _train(root, "fast"), _train(root, "slow", load_s=0.004)  # 32 ms of loading per batch of 8


def test_report_sections_match_the_event_file(runs, tmp_path):
    _, fast, _ = runs
    out = tmp_path / "report.md"
    text, loaded = build_report([str(fast)], out, None, None)
    acc = read_events(fast)
    mean_step = sum(v for _, v in scalar_values(acc, "time/step_ms")) / len(scalar_values(acc, "time/step_ms"))
    assert f"| mean step time (ms) | {mean_step:.3g} |" in text
    gflops = scalar_values(acc, "compute/forward_gflops_per_sample")[0][1]
    assert f"| model forward GFLOPs per sample | {gflops:.4g} |" in text
    assert "of 0.1 TFLOP/s peak per device" in text
    assert "| precision | 16-mixed (FP32BatchNormPrecision) |" in text
    assert "### Profiler windows" in text and "aten::" in text
    assert "### Advice" in text
    pngs = sorted((tmp_path / "report_plots").glob("*.png"))
    assert {p.name for p in pngs} == {"run1_step_time.png", "run1_tflops_mfu.png", "run1_loss_scale.png"}
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert Image.open(p).size[0] > 300
        assert f"]({p.relative_to(tmp_path).as_posix()})" in text


def test_comparison_ratios_and_cost(runs, tmp_path):
    _, fast, slow = runs
    text, loaded = build_report([str(fast), str(slow)], tmp_path / "cmp.md", None, 3.0)
    fast_run, slow_run = loaded
    ratio = slow_run.samples_per_sec / fast_run.samples_per_sec
    assert ratio < 0.9  # the slow run really is slower
    row = next(line for line in text.splitlines() if line.startswith("| slow/version_0 |"))
    assert f"| {ratio:.3g} |" in row
    saved = 1 - fast_run.samples_per_sec / slow_run.samples_per_sec
    assert f"slow/version_0 costs {abs(saved):.1%} more per sample than the baseline fast/version_0." in text
    assert "Input-bound" in text  # the slow run's advice cites its data-wait fraction


def test_report_errors_are_plain(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no TensorBoard event files"):
        build_report([str(tmp_path / "empty")], tmp_path / "r.md", None, None)
    plain = pl.loggers.TensorBoardLogger(str(tmp_path), name="plain", version=0)
    plain.log_metrics({"loss": 1.0}, step=0)
    plain.finalize("success")
    with pytest.raises(ReportError, match="none of lit_compute's tags"):
        load_run(Path(plain.log_dir))
    assert main([str(tmp_path / "empty"), "--out", str(tmp_path / "r.md")]) == 2
    assert "no TensorBoard event files" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str):
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read())


def test_tensorboard_serves_our_tags_text_and_layout(runs):
    root, fast, _ = runs
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(root), "--host", "127.0.0.1", "--port", str(port),
         "--load_fast=false", "--reload_interval=1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        run = "fast/version_0"
        scalars = {}
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                scalars = _get(port, "/data/plugin/scalars/tags")
                if run in scalars and "compute/mfu" in scalars[run]:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert {"compute/mfu", "compute/tflops_per_sec", "time/data_wait_fraction", "amp/loss_scale",
                "device/cpu_percent", "profiler/step_time_ms"} <= set(scalars[run])
        texts = _get(port, "/data/plugin/text/tags")
        served = {t.removesuffix("/text_summary") for t in texts[run]}
        assert {"compute/flops_by_module", "profiler/top_ops", "lit_compute/run"} <= served
        layout = _get(port, "/data/plugin/custom_scalars/layout")
        titles = {c["title"] for c in layout["category"]}
        assert {"Compute", "Time", "Precision", "Device", "Profiler windows"} <= titles
        assert "Communication" not in titles  # only charts whose tags exist
    finally:
        proc.terminate()
        proc.wait(timeout=10)
