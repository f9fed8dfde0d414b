"""No lit_compute code path calls a collective (or a Lightning property that does, such as ``trainer.log_dir``)
except the one all-reduce of the logging event, and ``setup``, which every rank runs at the same point."""

from __future__ import annotations

import traceback
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy

from lit_compute import (
    CommBenchmark,
    DeviceMonitor,
    FlopsLogger,
    LossScaleMonitor,
    ProfilerWindow,
    PrometheusLogger,
    StepTimeMonitor,
)

from .conftest import in_lit_compute, make_trainer, tiny_data, tiny_model


class CollectiveWatch(SingleDeviceStrategy):
    """Records every collective a lit_compute frame calls, outside ``setup`` and the logging event's all-reduce."""

    def __init__(self) -> None:
        super().__init__(device=torch.device("cpu"))
        self.violations: list[str] = []

    def _check(self, name: str) -> None:
        ours = [f for f in traceback.extract_stack()[:-2] if in_lit_compute(f.filename)]
        if not ours:
            return  # Lightning's own
        if any(f.name in ("_all_reduce_sum", "setup") for f in ours):
            return
        self.violations.append(
            f"{name} from {ours[-1].filename.split('/lit_compute/')[-1]}:{ours[-1].lineno} ({ours[-1].name})"
        )

    def broadcast(self, obj, src=0):
        self._check("broadcast")
        return super().broadcast(obj, src)

    def barrier(self, name=None):
        self._check("barrier")
        return super().barrier(name)

    def reduce(self, tensor, *args, **kwargs):
        self._check("reduce")
        return super().reduce(tensor, *args, **kwargs)

    def all_gather(self, tensor, group=None, sync_grads=False):
        self._check("all_gather")
        return super().all_gather(tensor, group=group, sync_grads=sync_grads)


def _run_everything(tmp_path) -> CollectiveWatch:
    watch = CollectiveWatch()
    callbacks = [
        FlopsLogger(peak="none", log_every_n_steps=1),
        StepTimeMonitor(log_every_n_steps=1),
        DeviceMonitor(gpu=False, log_every_n_steps=1),
        LossScaleMonitor(log_every_n_steps=1),
        ProfilerWindow(start_step=1, warmup=0, active=2),
        CommBenchmark(max_mb=0.1, seconds=1),
    ]
    trainer = make_trainer(
        tmp_path,
        max_steps=5,
        limit_train_batches=5,
        limit_val_batches=2,
        val_check_interval=2,
        strategy=watch,
        callbacks=callbacks,
        logger=[pl.loggers.TensorBoardLogger(str(tmp_path), name="tb"), PrometheusLogger(port=0)],
    )
    model, data = tiny_model(), tiny_data()
    trainer.fit(model, datamodule=data)
    trainer.validate(model, datamodule=data)
    trainer.test(model, datamodule=data)
    assert list((tmp_path / "tb" / "version_0" / "profiler").glob("window1_steps1-2*.pt.trace.json"))
    return watch


@pytest.mark.slow
def test_every_hook_of_every_component_calls_no_collective_outside_the_logging_event(tmp_path):
    assert _run_everything(tmp_path).violations == []


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.slow
def test_the_watch_sees_a_collective_inside_a_hook(tmp_path, monkeypatch):
    """The way ProfilerWindow found its folder before: ``trainer.log_dir`` (a broadcast) at export time, which
    only the rank that exports reaches."""

    def out_dir_at_export(self, trainer):
        path = Path(trainer.log_dir) / "profiler"
        path.mkdir(parents=True, exist_ok=True)
        return path

    monkeypatch.setattr(ProfilerWindow, "_out_dir", out_dir_at_export)
    violations = _run_everything(tmp_path).violations
    assert violations
    assert all("profiler_window.py" in v and v.startswith("broadcast") for v in violations)
