"""The writer: one ``log_metrics`` call per logging event and logger, failed loggers skipped, the run info."""

from __future__ import annotations

import traceback
import warnings
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from torch.utils.data import DataLoader

from lit_compute import DeviceMonitor, FlopsLogger, StepTimeMonitor
from lit_compute.formatting import read_key_value_table
from lit_compute.report import OUR_PREFIXES
from lit_compute.run_record import from_legacy
from lit_compute.timeline import LogEvent
from lit_compute.writer import run_info, run_record, write_event, writer_for

from .conftest import DrivenClock, TimedImages, TimedNet, clocked_trainer, in_lit_compute


class RecordingLogger(Logger):
    """A logger that records every ``log_metrics`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics, step=None) -> None:
        self.calls.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


def test_each_logging_event_is_exactly_one_log_metrics_call(tmp_path):
    clock, recording = DrivenClock(), RecordingLogger()
    trainer = clocked_trainer(
        tmp_path,
        clock,
        max_steps=6,
        limit_train_batches=6,
        log_every_n_steps=2,
        val_check_interval=3,
        limit_val_batches=2,
        logger=[TensorBoardLogger(str(tmp_path), name="tb"), recording],
        callbacks=[FlopsLogger(peak_flops=1e11), StepTimeMonitor(), DeviceMonitor(gpu=False)],
    )
    loaders = {
        "train_dataloaders": DataLoader(TimedImages(clock, 0.001), batch_size=4),
        "val_dataloaders": DataLoader(TimedImages(clock, 0.001), batch_size=4),
    }
    trainer.fit(TimedNet(clock, compute_s=0.01), **loaders)
    ours = [(step, m) for step, m in recording.calls if any(k.startswith(OUR_PREFIXES) for k in m)]
    by_step: dict[int, list[dict]] = {}
    for step, metrics in ours:
        by_step.setdefault(step, []).append(metrics)
    for step in (1, 3, 5):  # the training logging steps: everything of the step in one call
        assert len(by_step[step]) == 1 + (step in (2, 5)), by_step[step]
        train = next(m for m in by_step[step] if "time/step_ms" in m)
        assert {
            "compute/flops_per_step",
            "compute/tflops_per_sec",
            "compute/mfu",
            "time/step_ms",
            "device/rss_gb",
        } <= set(train)
    # each validation run is one event too (its own call, at the step Lightning's self.log uses)
    val_calls = [(s, m) for s, m in ours if any(k.startswith("compute/val_") for k in m)]
    assert [s for s, _ in val_calls] == [2, 5]
    assert all(len(by_step[s]) == 1 + (s == 5) for s, _ in val_calls)
    assert all(not any(k.startswith("compute/val_") for k in m) for s, m in ours if s not in (2, 5))
    # the only call outside an event: the forward GFLOPs per sample, once, at step 0
    assert by_step[0] == [
        {"compute/forward_gflops_per_sample": pytest.approx(by_step[0][0]["compute/forward_gflops_per_sample"])}
    ]


class _Broken(RecordingLogger):
    def log_metrics(self, metrics, step=None) -> None:
        raise OSError(28, "No space left on device")


class _Stub(SimpleNamespace):
    """A namespace the writer can key a weak reference on, as it keys a trainer."""

    __hash__ = object.__hash__


def _stub_trainer(loggers) -> _Stub:
    return _Stub(
        loggers=loggers,
        is_global_zero=True,
        global_step=0,
        precision="32-true",
        precision_plugin=SimpleNamespace(),
        world_size=1,
        datamodule=None,
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=0)),
    )


def test_write_event_is_one_call_per_logger_and_a_broken_logger_is_skipped_after_one_warning():
    good, broken = RecordingLogger(), _Broken()
    trainer = _stub_trainer([broken, good])
    with pytest.warns(UserWarning, match="writing metrics to _Broken failed with OSError.*No space left"):
        write_event(trainer, LogEvent("train", 3, metrics={"time/step_ms": 2.0, "compute/mfu": 0.5}))
    write_event(trainer, LogEvent("train", 5, metrics={"time/step_ms": 3.0}))
    write_event(trainer, LogEvent("train", 7))  # nothing to write: no call
    write_event(trainer, None)
    assert good.calls == [(3, {"time/step_ms": 2.0, "compute/mfu": 0.5}), (5, {"time/step_ms": 3.0})]
    assert writer_for(trainer).failed_loggers == {id(broken)}
    assert writer_for(trainer).tags == {"time/step_ms", "compute/mfu"}


def test_only_rank_zero_writes():
    logger = RecordingLogger()
    trainer = _stub_trainer([logger])
    trainer.is_global_zero = False
    write_event(trainer, LogEvent("train", 1, metrics={"time/step_ms": 1.0}))
    assert logger.calls == []


def test_the_run_info_table_renders_the_run_record():
    trainer = _stub_trainer([])
    text = run_info(trainer)
    table = read_key_value_table(text)
    assert table["precision"] == "32-true"
    assert table["device"] == "cpu"
    assert table["world size"] == "1"
    # the table is the record for people: the 0.3.0 reader gets the same facts back from it
    record, back = run_record(trainer), from_legacy([text], [])
    for name in (
        "precision",
        "device",
        "world_size",
        "nodes",
        "devices_per_node",
        "data_parallel",
        "tensor_parallel",
        "strategy",
        "data",
        "cpu_cores",
        "torch_threads",
        "planned_steps",
        "planned_epochs",
    ):
        assert getattr(back, name) == getattr(record, name), name


# -- a log folder that breaks mid-run (issue: faults) ---------------------------------------------------------
def _only_lit_compute(tmp_path, callbacks, max_steps=8):
    """A run in which only lit_compute writes to TensorBoard (Lightning's BoringModel logs nothing itself)."""
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel

    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        log_every_n_steps=1,
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=TensorBoardLogger(str(tmp_path), name="tb"),
        callbacks=[StepTimeMonitor(log_every_n_steps=1), *callbacks],
    )
    return trainer, BoringModel()


def test_a_failing_custom_scalars_write_warns_with_the_real_cause_and_training_goes_on(tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter

    def full_disk(self, layout):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SummaryWriter, "add_custom_scalars", full_disk)
    trainer, model = _only_lit_compute(tmp_path, [])
    with pytest.warns(
        UserWarning,
        match=r"Custom Scalars layout to TensorBoard failed with OSError: \[Errno 28\] "
        r"No space left on device.*training goes on",
    ):
        trainer.fit(model)
    assert trainer.global_step == 8


def test_a_failing_scalar_write_names_the_cause_beneath_lightnings_message(tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter

    def gone(self, *args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "events.out.tfevents.0")

    monkeypatch.setattr(SummaryWriter, "add_scalar", gone)
    trainer, model = _only_lit_compute(tmp_path, [])
    with pytest.warns(
        UserWarning,
        match=r"writing metrics to TensorBoardLogger failed with FileNotFoundError: "
        r"\[Errno 2\] No such file or directory",
    ):
        trainer.fit(model)
    assert trainer.global_step == 8


def test_deleting_the_log_folder_mid_run_does_not_kill_the_run(tmp_path):
    import shutil

    from lightning.pytorch.callbacks import Callback

    class DeleteLogs(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 4:
                shutil.rmtree(trainer.logger.log_dir)

    trainer, model = _only_lit_compute(
        tmp_path, [DeleteLogs(), FlopsLogger(peak="none"), DeviceMonitor(gpu=False)], max_steps=12
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(FileNotFoundError) as raised:
            trainer.fit(model)
    # every step ran and lit_compute said what broke; what still raises is Lightning's own TensorBoardLogger
    # closing its event file at the end of fit (no lit_compute frame in the traceback)
    assert trainer.global_step == 12
    assert any("lit_compute: writing" in str(w.message) and "FileNotFoundError" in str(w.message) for w in caught)
    frames = traceback.extract_tb(raised.tb)
    assert not [f for f in frames if in_lit_compute(f.filename)]
    assert any(f.name == "finalize" for f in frames)


def _flops_line(text: str) -> list[str]:
    return [line for line in text.splitlines() if "FlopsLogger: forward" in line]


def test_messages_during_training_print_above_a_rich_progress_bar_as_whole_lines(tmp_path):
    """FlopsLogger's first line comes while the bar is live: it goes through rich's console (printed above the
    bar), not a logging stream the bar redraws over (which cut it in half in a terminal)."""
    import io

    from lightning.pytorch.callbacks import RichProgressBar

    from .conftest import make_trainer, tiny_data, tiny_model

    terminal = io.StringIO()
    bar = RichProgressBar(console_kwargs={"file": terminal, "force_terminal": True, "width": 300})
    trainer = make_trainer(tmp_path, enable_progress_bar=True, callbacks=[bar, FlopsLogger()])
    trainer.fit(tiny_model(), datamodule=tiny_data())
    (line,) = _flops_line(terminal.getvalue())
    assert "GFLOPs per sample" in line
    assert "GFLOPs per training batch (forward + backward, model FLOPs)" in line


def test_messages_during_training_go_through_tqdm_write(tmp_path, capsys):
    from lightning.pytorch.callbacks import TQDMProgressBar

    from .conftest import make_trainer, tiny_data, tiny_model

    trainer = make_trainer(tmp_path, enable_progress_bar=True, callbacks=[TQDMProgressBar(), FlopsLogger()])
    trainer.fit(tiny_model(), datamodule=tiny_data())
    (line,) = _flops_line(capsys.readouterr().out)
    assert line.startswith("FlopsLogger: forward")
    assert line.endswith("(forward + backward, model FLOPs)")


def _charts(log_dir) -> set[str]:
    """The chart titles of the latest Custom Scalars layout in the run's event files (what TensorBoard shows)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    if "custom_scalars__config__" not in acc.Tags()["tensors"]:
        return set()
    layout = layout_pb2.Layout()
    layout.ParseFromString(acc.Tensors("custom_scalars__config__")[-1].tensor_proto.string_val[0])
    return {chart.title for category in layout.category for chart in category.chart}


def test_a_chart_is_in_the_layout_once_it_can_draw_a_line(tmp_path):
    """One point is a lone dot, and TensorBoard scales a line chart of two different points to a fixed 0-1 axis (the
    line lies flat at the bottom or off the chart): such charts are left out of the layout until a line can be
    drawn (two equal points, or a third)."""
    from lit_compute.writer import log_scalars

    from .conftest import make_trainer

    trainer = make_trainer(tmp_path)
    log_dir = trainer.logger.log_dir
    flops, val = "validation FLOPs per step", "validation MFU (fraction of peak)"
    log_scalars(trainer, {"compute/mfu": 0.3}, step=5)
    assert _charts(log_dir) == set()  # nothing to draw a line with yet
    log_scalars(trainer, {"compute/mfu": 0.31, "compute/val_flops_per_step": 9e9, "compute/val_mfu": 0.02}, step=10)
    log_scalars(trainer, {"compute/mfu": 0.32}, step=15)
    charts = _charts(log_dir)
    assert "MFU and HFU (fraction of peak)" in charts
    assert not {flops, val} & charts
    log_scalars(trainer, {"compute/val_flops_per_step": 9e9, "compute/val_mfu": 0.025}, step=20)
    charts = _charts(log_dir)
    assert flops in charts
    assert val not in charts
    log_scalars(trainer, {"compute/val_flops_per_step": 9e9, "compute/val_mfu": 0.021}, step=30)
    assert {flops, val} <= _charts(log_dir)


@pytest.mark.parametrize(("compute_s", "unit", "peak"), [(1e-5, "GFLOP/s", 5e14), (1e-9, "TFLOP/s", 1e21)])
def test_flops_rate_charts_are_drawn_in_the_unit_that_fits_the_device(tmp_path, compute_s, unit, peak):
    """A CPU's FLOP/s on a TFLOP/s axis ticks ``4e-3``: a run achieving under 1 TFLOP/s (this small net at about 70
    GFLOP/s on the driven clock) also gives TensorBoard its FLOP/s figures in GFLOP/s (``compute/gflops_per_sec``...),
    and its charts draw those, the unit in their titles; the TFLOP/s tags stay, and other loggers get only them."""
    from .conftest import read_events, scalar_values

    clock, recording = DrivenClock(), RecordingLogger()
    trainer = clocked_trainer(
        tmp_path,
        clock,
        max_steps=6,
        limit_train_batches=6,
        log_every_n_steps=2,
        val_check_interval=2,
        limit_val_batches=2,
        logger=[TensorBoardLogger(str(tmp_path), name="tb"), recording],
        callbacks=[FlopsLogger(peak_flops=peak)],
    )  # a peak above what the driven clock makes it achieve
    loaders = {
        "train_dataloaders": DataLoader(TimedImages(clock), batch_size=4),
        "val_dataloaders": DataLoader(TimedImages(clock, compute_s), batch_size=4),
    }
    trainer.fit(TimedNet(clock, compute_s=compute_s), **loaders)
    acc = read_events(trainer.loggers[0].log_dir)
    twins = {
        "compute/gflops_per_sec": "compute/tflops_per_sec",
        "compute/global_gflops_per_sec": "compute/global_tflops_per_sec",
        "compute/val_gflops_per_sec": "compute/val_tflops_per_sec",
        "compute/peak_gflops": "compute/peak_tflops",
    }
    charts = _charts(trainer.loggers[0].log_dir)
    assert f"model {unit} (this device, all ranks)" in charts
    assert f"validation {unit}" in charts
    assert f"peak {unit} used for MFU" in charts
    assert not [c for c in charts if "FLOP/s" in c and unit not in c]
    assert set(twins.values()) <= set(acc.Tags()["scalars"])  # the logged unit is unchanged
    if unit == "TFLOP/s":
        assert not set(twins) & set(acc.Tags()["scalars"])
        return
    for twin, tag in twins.items():
        original = scalar_values(acc, tag)
        assert [s for s, _ in scalar_values(acc, twin)] == [s for s, _ in original]
        assert len(original) >= 2
        assert [v for _, v in scalar_values(acc, twin)] == pytest.approx([1000 * v for _, v in original], rel=1e-6)
    assert scalar_values(acc, "compute/peak_gflops")[-1][1] == pytest.approx(5e14 / 1e9)  # the peak too
    assert not [k for _, m in recording.calls for k in m if k in twins]  # CSV, Prometheus...: one tag per figure
