"""ProfilerWindow: trace files, scalars, windows across resume, robustness."""

from __future__ import annotations

import json
import re
import time

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lit_compute import ProfilerWindow

from ..conftest import make_trainer, read_events, scalar_values, text_values


class _Small(pl.LightningModule):
    def __init__(self, sleep_at: int | None = None, raise_at: int | None = None):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
        self.sleep_at, self.raise_at = sleep_at, raise_at

    def training_step(self, batch, batch_idx):
        if self.global_step == self.sleep_at:
            time.sleep(0.5)
        if self.global_step == self.raise_at:
            raise RuntimeError("boom inside the window")
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Sleepy(Dataset):
    def __init__(self, sleep):
        self.sleep = sleep

    def __len__(self):
        return 256

    def __getitem__(self, i):
        if self.sleep:
            time.sleep(self.sleep)
        return torch.randn(3, 16, 16), i % 4


def _loader(sleep=0.0):
    if sleep:
        return DataLoader(_Sleepy(sleep), batch_size=4)
    return DataLoader(TensorDataset(torch.randn(256, 3, 16, 16), torch.randint(0, 4, (256,))), batch_size=4)


def _traces(trainer):
    return sorted((_log_dir(trainer) / "profiler").glob("*.pt.trace.json"))


def _log_dir(trainer):
    from pathlib import Path

    return Path(trainer.log_dir)


def _profiler_steps(path) -> list[int]:
    events = json.loads(path.read_text())["traceEvents"]
    return sorted(
        int(m.group(1))
        for e in events
        if e.get("ph") == "X"
        and not str(e.get("cat", "")).startswith("gpu_")  # the GPU timeline's copy of the range
        and (m := re.match(r"^ProfilerStep#(\d+)$", str(e.get("name", ""))))
    )


def test_window_at_steps_5_to_7_writes_trace_table_and_scalars(tmp_path):
    window = ProfilerWindow(start_step=5, warmup=2, active=3)
    trainer = make_trainer(
        tmp_path, max_steps=10, limit_train_batches=10, callbacks=[window], val_check_interval=6, limit_val_batches=2
    )  # validation runs inside the window
    trainer.fit(_Small(), train_dataloaders=_loader(), val_dataloaders=_loader())
    traces = _traces(trainer)
    assert [t.name for t in traces] == ["window1_steps5-7.pt.trace.json"]
    assert _profiler_steps(traces[0]) == [5, 6, 7]
    assert (traces[0].parent / "window1_steps5-7.key_averages.txt").read_text().count("aten::") > 3
    acc = read_events(trainer.log_dir)
    for tag in (
        "profiler/step_time_ms",
        "profiler/dataloader_fraction",
        "profiler/top_op_fraction",
        "profiler/peak_memory_mb",
    ):
        assert [s for s, _ in scalar_values(acc, tag)] == [7], tag  # once, at the window's last step
    assert 0 < scalar_values(acc, "profiler/top_op_fraction")[0][1] <= 1
    assert "aten::" in text_values(acc, "profiler/top_ops")[0]


def test_every_n_steps_gives_two_windows(tmp_path):
    window = ProfilerWindow(start_step=2, warmup=1, active=2, every_n_steps=6, max_windows=2)
    trainer = make_trainer(tmp_path, max_steps=16, limit_train_batches=16, callbacks=[window], limit_val_batches=0)
    trainer.fit(_Small(), train_dataloaders=_loader())
    traces = _traces(trainer)
    assert [_profiler_steps(t) for t in traces] == [[2, 3], [8, 9]]


def test_dataloader_fraction(tmp_path):
    """A loader that sleeps 20 ms a batch takes a larger share of the window than one that does not (a relation in
    one test, not a threshold on how fast this machine runs)."""
    fractions = []
    for sleep in (0.02, 0.0):
        window = ProfilerWindow(start_step=2, warmup=1, active=3)
        trainer = make_trainer(
            tmp_path / str(sleep), max_steps=6, limit_train_batches=6, callbacks=[window], limit_val_batches=0
        )
        trainer.fit(_Small(), train_dataloaders=_loader(sleep))
        fractions.append(scalar_values(read_events(trainer.log_dir), "profiler/dataloader_fraction")[0][1])
    slept, plain = fractions
    assert 0 <= plain < slept <= 1


def test_conflict_with_another_profiler_warns_and_training_completes(tmp_path):
    window = ProfilerWindow(start_step=1, warmup=0, active=2)
    trainer = make_trainer(tmp_path, max_steps=4, callbacks=[window], profiler="pytorch", limit_val_batches=0)
    with pytest.warns(UserWarning, match=r"Trainer\(profiler='pytorch'\) already runs torch.profiler"):
        trainer.fit(_Small(), train_dataloaders=_loader())
    assert trainer.global_step == 4
    assert not (_log_dir(trainer) / "profiler").exists() or not _traces(trainer)


def test_exception_inside_a_window_still_writes_the_partial_trace(tmp_path):
    window = ProfilerWindow(start_step=3, warmup=1, active=4)
    trainer = make_trainer(tmp_path, max_steps=10, limit_train_batches=10, callbacks=[window], limit_val_batches=0)
    with pytest.raises(RuntimeError, match="boom inside the window"):
        trainer.fit(_Small(raise_at=5), train_dataloaders=_loader())
    traces = _traces(trainer)
    assert len(traces) == 1
    assert _profiler_steps(traces[0])[:2] == [3, 4]


def test_windows_already_captured_are_not_captured_again_after_resume(tmp_path):
    first = ProfilerWindow(start_step=2, warmup=0, active=2)
    trainer = make_trainer(tmp_path / "a", max_steps=5, callbacks=[first], limit_val_batches=0)
    trainer.fit(_Small(), train_dataloaders=_loader())
    assert len(_traces(trainer)) == 1
    resumed = ProfilerWindow(start_step=2, warmup=0, active=2)
    resumed.load_state_dict(first.state_dict())
    trainer2 = make_trainer(tmp_path / "b", max_steps=5, callbacks=[resumed], limit_val_batches=0)
    trainer2.fit(_Small(), train_dataloaders=_loader())
    assert _traces(trainer2) == []


def test_bad_arguments_list_what_is_accepted():
    with pytest.raises(ValueError, match=r"ProfilerWindow\(active=0\) must be an integer >= 1"):
        ProfilerWindow(active=0)
    with pytest.raises(ValueError, match=r"ProfilerWindow\(start_step=-1\)"):
        ProfilerWindow(start_step=-1)
    with pytest.raises(ValueError, match=r"sort_by='fastest'.*self_cpu_time_total"):
        ProfilerWindow(sort_by="fastest")
