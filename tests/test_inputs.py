"""Bad input is named before training; measuring components never kill the run; nothing is lost across resume."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import socket
import types
import typing
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from PIL import Image
from torch.utils.data import DataLoader

import lit_compute
from lit_compute import (
    FlopsLogger,
    FP32BatchNormPrecision,
    LossScaleMonitor,
    ProfilerWindow,
    PrometheusLogger,
    StepTimeMonitor,
    TorchvisionImageDataModule,
)
from lit_compute._validate import Check
from lit_compute.data import make_synthetic_image_folder

from .conftest import (
    DrivenClock,
    TimedImages,
    TimedNet,
    clocked_trainer,
    make_trainer,
    read_events,
    scalar_values,
)

# -- every public constructor argument, with wrong types, NaN, inf and out-of-range values --------------------
PUBLIC = sorted(
    n
    for n in lit_compute.__all__
    if inspect.isclass(getattr(lit_compute, n)) and n not in ("Timeline", "SafeFlopCounterMode")
)


def _hints(cls: type) -> dict[str, Any]:
    if dataclasses.is_dataclass(cls):
        return typing.get_type_hints(cls, include_extras=True)
    init = inspect.unwrap(cls.__init__)
    return typing.get_type_hints(init, include_extras=True)


def _split(tp: Any) -> tuple[Any, list[Check], bool]:
    """(base type, checks, accepts None)."""
    checks: list[Check] = []
    if get_origin(tp) is typing.Annotated:
        tp, *meta = get_args(tp)
        checks = [m for m in meta if isinstance(m, Check)]
    optional = False
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        optional = len(args) < len(get_args(tp))
        tp = args[0] if len(args) == 1 else tp
    return tp, checks, optional


def _bad_values(tp: Any) -> list[Any]:
    base, checks, optional = _split(tp)
    out: list[Any] = [] if optional else [None]
    if base is bool:
        return out + ["yes", 2]
    if base is int:
        out += ["5", 2.5, True, [1]]
    elif base is float:
        out += ["x", math.nan, math.inf, -math.inf, True]
    elif base is str:
        out += [5, ["a"]]
    elif get_origin(base) is Literal:
        return out + ["no-such-choice", 3]
    elif get_origin(base) in (list, tuple):
        return out + ["abc", 5]
    elif inspect.isclass(base) and base.__module__.startswith(("lit_compute", "datetime")):
        return out + ["x", 5]
    else:
        return []  # Any, callables, mappings: nothing a type can refuse
    for c in checks:
        if c.choices is not None:
            out.append("no-such-choice")
        step = 1 if base is int else 0.5
        if c.ge is not None:
            out.append(type(c.ge)(c.ge - step) if base is int else c.ge - step)
        if c.gt is not None:
            out.append(c.gt)
        if c.le is not None:
            out.append(c.le + step)
        if c.lt is not None:
            out.append(c.lt)
    return out


CASES = [
    (name, arg, value)
    for name in PUBLIC
    for arg, tp in _hints(getattr(lit_compute, name)).items()
    if arg != "return"
    for value in _bad_values(tp)
]


@pytest.mark.parametrize(("name", "arg", "value"), CASES, ids=[f"{n}.{a}={v!r}" for n, a, v in CASES])
def test_every_constructor_names_the_argument_and_the_value(name, arg, value):
    cls = getattr(lit_compute, name)
    with pytest.raises(ValueError, match=rf"^{name}\({arg}=") as err:
        cls(**{arg: value})
    message = str(err.value)
    assert message.startswith(f"{name}({arg}=")
    assert repr(value) in message or str(value) in message


def test_the_sweep_is_wide():
    assert len(CASES) > 250
    assert len({n for n, _, _ in CASES}) >= 15


YAML_CASES = [
    (
        "trainer:\n  callbacks:\n    - class_path: lit_compute.FlopsLogger\n      init_args:\n"
        "        peak_flops: .nan\n",
        "FlopsLogger(peak_flops=nan) must be a finite number > 0",
    ),
    (
        "trainer:\n  callbacks:\n    - class_path: lit_compute.StepTimeMonitor\n      init_args:\n        window: 1\n",
        "StepTimeMonitor(window=1) must be an integer >= 2",
    ),
    (
        "trainer:\n  callbacks:\n    - class_path: lit_compute.ProfilerWindow\n      init_args:\n"
        "        on_slow_step: .inf\n",
        "ProfilerWindow(on_slow_step=inf) must be a finite number > 1",
    ),
    (
        "trainer:\n  plugins:\n    - class_path: lit_compute.FP32BatchNormPrecision\n      init_args:\n"
        "        precision: 16-true\n",
        "FP32BatchNormPrecision(precision='16-true') is refused",
    ),
    (
        "trainer:\n  strategy:\n    class_path: lit_compute.TunedDDPStrategy\n    init_args:\n"
        "      benchmark_max_mb: 0\n",
        "TunedDDPStrategy(benchmark_max_mb=0.0) must be a finite number > 0",
    ),
    (
        "trainer:\n  strategy:\n    class_path: lit_compute.TunedDDPStrategy\n    init_args:\n      nccl:\n"
        "        socket_nthreads: 17\n",
        "NCCL_SOCKET_NTHREADS=17 is out of range; accepted: 1..16",
    ),
    (
        "model:\n  class_path: lit_compute.models.ImageClassifier\n  init_args:\n    label_smoothing: -1\n",
        "ImageClassifier(label_smoothing=-1.0) must be a finite number >= 0 and < 1",
    ),
    (
        "data:\n  class_path: lit_compute.data.TorchvisionImageDataModule\n  init_args:\n"
        "    synthetic_num_classes: 0\n",
        "TorchvisionImageDataModule(synthetic_num_classes=0) must be an integer >= 2",
    ),
    (
        "data:\n  class_path: lit_compute.data.TokenDataModule\n  init_args:\n    seq_len: 4\n",
        "TokenDataModule(seq_len=4) must be an integer >= 16",
    ),
    (
        "trainer:\n  logger:\n    - class_path: lit_compute.PrometheusLogger\n      init_args:\n        port: 70000\n",
        "PrometheusLogger(port=70000) must be an integer >= 0 and <= 65535",
    ),
]


@pytest.mark.parametrize(
    ("yaml_text", "message"), YAML_CASES, ids=[m.split("(")[0] + str(i) for i, (_, m) in enumerate(YAML_CASES)]
)
def test_the_same_errors_through_lit_compute_fit(tmp_path, monkeypatch, capsys, yaml_text, message):
    from lit_compute.cli import main

    monkeypatch.chdir(tmp_path)
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


# -- images: named before training, or skipped on request ----------------------------------------------------------
def _dataset(tmp_path: Path, fault: str) -> Path:
    root = make_synthetic_image_folder(tmp_path / "data", num_classes=3, images_per_class=8, image_size=(24, 24))
    target = root / "train" / "class_001" / "00003.jpg"
    if fault == "truncated":
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])
    elif fault == "text":
        (root / "train" / "class_001" / "notes.jpg").write_text("this is not an image")
    elif fault == "empty_class":
        (root / "train" / "class_003").mkdir()
        (root / "val" / "class_003").mkdir()
    elif fault == "val_missing_class":
        for f in (root / "val" / "class_001").iterdir():
            f.unlink()
        (root / "val" / "class_001").rmdir()
    return root


DATAMODULES = [TorchvisionImageDataModule]
if lit_compute.data.dali_datamodule.dali_available():
    DATAMODULES.append(lit_compute.DALIImageDataModule)


def _dm(cls, root, mode):
    kwargs = {"data_dir": str(root), "batch_size": 4, "image_size": 16, "on_bad_image": mode}
    if cls is TorchvisionImageDataModule:
        kwargs["num_workers"] = 0
    return cls(**kwargs)


@pytest.mark.parametrize("cls", DATAMODULES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("fault", ["truncated", "text"])
def test_a_bad_image_is_named_before_the_first_step_or_skipped(tmp_path, cls, fault):
    root = _dataset(tmp_path, fault)
    bad = "00003.jpg" if fault == "truncated" else "notes.jpg"
    trainer = make_trainer(tmp_path / "err", max_steps=2, limit_val_batches=1)
    model = lit_compute.ImageClassifier(num_classes=3)
    with pytest.raises(ValueError, match=rf"1 image\(s\) cannot be decoded: .*class_001/{bad} .*on_bad_image='skip'"):
        trainer.fit(model, datamodule=_dm(cls, root, "error"))
    assert trainer.global_step == 0  # before the first step
    trainer = make_trainer(tmp_path / "skip", max_steps=2, limit_val_batches=1)
    data = _dm(cls, root, "skip")
    trainer.fit(model, datamodule=data)
    assert trainer.global_step == 2
    bad_path = str(root / "train" / "class_001" / bad)
    assert data.scan.bad_count == 1
    assert all(p != bad_path for p, _ in data.scan.samples["train"])
    assert scalar_values(read_events(trainer.logger.log_dir), "data/skipped_images") == [(0, 1.0)]


@pytest.mark.parametrize("cls", DATAMODULES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("mode", ["error", "skip"])
@pytest.mark.parametrize(
    ("fault", "match"),
    [
        ("empty_class", r"the class folder '.*train/class_003' has no images"),
        (
            "val_missing_class",
            r"'val/' must have exactly the classes of 'train/' \(3\); it has missing \['class_001'\]",
        ),
    ],
)
def test_layout_faults_are_errors_in_both_modes(tmp_path, cls, mode, fault, match):
    root = _dataset(tmp_path, fault)
    trainer = make_trainer(tmp_path, max_steps=1)
    with pytest.raises(ValueError, match=match):
        trainer.fit(lit_compute.ImageClassifier(num_classes=3), datamodule=_dm(cls, root, mode))


def test_a_decode_failure_during_training_names_the_file(tmp_path):
    root = _dataset(tmp_path, "none")
    data = _dm(TorchvisionImageDataModule, root, "error")
    data.setup()
    path, _ = data.train_set.samples[0]
    with Image.open(path) as img:
        img.load()
    Path(path).write_bytes(b"\xff\xd8\xff" + b"\x00" * 64 + b"\xff\xd9")  # passes the header check, cannot decode
    with pytest.raises(OSError, match=rf"could not decode the image {path}"):
        data.train_set[0]


def test_the_check_is_paid_once_per_dataset(tmp_path):
    root = _dataset(tmp_path, "none")
    first = _dm(TorchvisionImageDataModule, root, "error").check_data()
    again = _dm(TorchvisionImageDataModule, root, "error").check_data()
    assert first.checked == 3 * 8 + 3 * 4
    assert again.checked == 0
    touched = Path(first.samples["train"][0][0])
    touched.write_bytes(touched.read_bytes())  # a new mtime: checked again
    assert _dm(TorchvisionImageDataModule, root, "error").check_data().checked == 1


# -- Prometheus ----------------------------------------------------------------------------------------------------
def test_reserved_and_colliding_names_get_distinct_deterministic_series():
    prom = PrometheusLogger(port=0)
    with pytest.warns(UserWarning, match="already is") as caught:
        names = [prom.series_name(k) for k in ("train/loss", "train-loss", "step", "μ", "σ", "train/loss")]
    assert names[0] == "lit_compute_train_loss"
    assert names[5] == names[0]
    assert len(set(names[:5])) == 5
    assert names[1].startswith("lit_compute_train_loss_")
    assert names[2].startswith("lit_compute_step_")
    assert PrometheusLogger(port=0).series_name("train-loss") == "lit_compute_train_loss"  # alone: no suffix
    again = PrometheusLogger(port=0)
    again.series_name("train/loss")
    with pytest.warns(UserWarning, match="'train/loss' already is"):
        assert again.series_name("train-loss") == names[1]  # the same suffix in every run
    assert any("'train/loss' already is" in str(w.message) for w in caught)


def test_prometheus_logs_a_step_key_without_crashing(tmp_path):
    prom = PrometheusLogger(port=0)
    try:
        with pytest.warns(UserWarning, match="metric 'step' would be series"):
            prom.log_metrics({"step": 3.0, "train/loss": 1.0, "train-loss": 2.0}, step=3)
        body = urllib.request.urlopen(f"http://127.0.0.1:{prom.port_in_use}/metrics", timeout=5).read().decode()
        assert "lit_compute_step{" in body
        assert "lit_compute_train_loss{" in body
    finally:
        prom.close()


@pytest.mark.parametrize(
    ("errno_name", "expected"),
    [
        ("EADDRINUSE", "the port is already in use"),
        ("EADDRNOTAVAIL", "Use an address of this machine"),
        ("EACCES", "a port above 1023"),
    ],
)
def test_bind_errors_name_host_port_and_the_fix(errno_name, expected):
    import errno

    prom = PrometheusLogger(host="127.0.0.1", port=9999)
    message = prom._bind_error(9999, OSError(getattr(errno, errno_name), "boom"))
    assert message.startswith("PrometheusLogger(host='127.0.0.1', port=9999): cannot serve on 127.0.0.1:9999")
    assert expected in message
    lookup = prom._bind_error(9999, socket.gaierror(-2, "Name or service not known"))
    assert "is not a known address" in lookup
    assert "'127.0.0.1'" in lookup


def test_the_endpoint_stops_when_the_run_ends_unless_kept_and_writes_file_sd(tmp_path):
    sd = tmp_path / "targets"
    prom = PrometheusLogger(port=0, run_name="exp1", file_sd_dir=str(sd))
    kept = PrometheusLogger(port=0, run_name="exp2", keep_serving=True)
    seen = {}

    class Look(pl.Callback):
        def on_train_end(self, trainer, pl_module):
            seen["targets"] = json.loads((sd / "exp1_rank0.json").read_text())
            seen["port"] = prom.port_in_use

    tb = pl.loggers.TensorBoardLogger(str(tmp_path), name="tb")
    trainer = make_trainer(tmp_path, max_steps=2, logger=[tb, prom, kept], callbacks=[StepTimeMonitor(), Look()])
    try:
        trainer.fit(TimedNet(), train_dataloaders=DataLoader(TimedImages(DrivenClock()), batch_size=4))
        assert seen["targets"] == [{"targets": [f"127.0.0.1:{seen['port']}"], "labels": {"run": "exp1", "rank": "0"}}]
        assert prom.port_in_use is None
        assert not (sd / "exp1_rank0.json").exists()
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://127.0.0.1:{seen['port']}/metrics", timeout=2)
        assert (
            b"lit_compute_train_loss"
            in urllib.request.urlopen(f"http://127.0.0.1:{kept.port_in_use}/metrics", timeout=5).read()
        )
    finally:
        kept.close()


def test_run_label_and_version_follow_tensorboard(tmp_path):
    prom = PrometheusLogger(port=0)
    tb = pl.loggers.TensorBoardLogger(str(tmp_path), name="lightning_logs")
    trainer = make_trainer(tmp_path, max_steps=1, logger=[tb, prom], callbacks=[StepTimeMonitor()])
    trainer.fit(TimedNet(), train_dataloaders=DataLoader(TimedImages(DrivenClock()), batch_size=4))
    assert prom.run_name == "lightning_logs/version_0"
    assert prom.version == 0
    from lightning.pytorch.loggers.utilities import _version

    assert _version(trainer.loggers) == "0"  # the progress bar's v_num is the TensorBoard version


def test_a_taken_port_does_not_end_the_demo(tmp_path, monkeypatch):
    from lit_compute.cli import LitComputeCLI

    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        with contextlib.suppress(OSError):  # already taken by someone else: the same situation
            taken.bind(("127.0.0.1", 9464))
        taken.listen(1)
        root = Path(__file__).resolve().parents[1]
        with pytest.warns(UserWarning, match="port 9464 on 127.0.0.1 is in use; serving on port"):
            cli = LitComputeCLI(
                args=[
                    "fit",
                    "--config",
                    str(root / "configs" / "quickstart.yaml"),
                    "--trainer.max_steps=2",
                    "--trainer.limit_val_batches=1",
                    "--data.init_args.num_workers=0",
                    "--data.init_args.synthetic_images_per_class=8",
                ]
            )
    assert cli.trainer.global_step == 2


# -- measuring components never kill the run -------------------------------------------------------------------
def test_a_failing_profiler_stop_at_teardown_does_not_raise(tmp_path, monkeypatch):
    window = ProfilerWindow(start_step=1, warmup=0, active=50)

    def broken_stop(self):
        raise RuntimeError("profiler stop exploded")

    trainer = make_trainer(tmp_path, max_steps=3, limit_train_batches=3, callbacks=[window], limit_val_batches=0)
    monkeypatch.setattr(torch.profiler.profile, "stop", broken_stop)
    with pytest.warns(UserWarning, match="profiler stop exploded"):
        trainer.fit(TimedNet(), train_dataloaders=DataLoader(TimedImages(DrivenClock()), batch_size=4))
    assert trainer.global_step == 3


def test_a_broken_logger_is_one_warning_for_all_callbacks(tmp_path):
    class Broken(pl.loggers.CSVLogger):
        def log_metrics(self, metrics, step=None):  # a one-point failure: only lit_compute's writes hit it
            if any(k.startswith(("time/", "compute/", "amp/")) for k in metrics):
                raise OSError("disk full")
            super().log_metrics(metrics, step)

    callbacks = [
        FlopsLogger(peak="none", log_every_n_steps=1),
        StepTimeMonitor(log_every_n_steps=1),
        LossScaleMonitor(log_every_n_steps=1),
    ]
    tb = pl.loggers.TensorBoardLogger(str(tmp_path), name="tb")
    trainer = make_trainer(tmp_path, max_steps=4, callbacks=callbacks, logger=[Broken(str(tmp_path)), tb])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(TimedNet(), train_dataloaders=DataLoader(TimedImages(DrivenClock()), batch_size=4))
    assert trainer.global_step == 4
    ours = [w for w in caught if "disk full" in str(w.message)]
    assert len(ours) == 1
    assert "no longer sent to that logger" in str(ours[0].message)
    assert not any(cb._disabled for cb in callbacks)


def _profile_one_window_on_a_full_disk(tmp_path: Path) -> list[Path]:
    """Train 3 steps with a profiler window at step 1 whose export meets a full disk; the files left behind."""
    window = ProfilerWindow(start_step=1, warmup=0, active=1)
    trainer = make_trainer(tmp_path, max_steps=3, limit_train_batches=3, callbacks=[window], limit_val_batches=0)
    with pytest.warns(UserWarning, match="No space left on device"):
        trainer.fit(TimedNet(), train_dataloaders=DataLoader(TimedImages(DrivenClock()), batch_size=4))
    assert trainer.global_step == 3
    return list((Path(trainer.log_dir) / "profiler").glob("*"))


def test_a_failed_export_leaves_no_partial_trace(tmp_path, monkeypatch):
    def full_disk(self, path):
        Path(path + ".tmp").write_text("{partial")
        Path(path).write_text("{partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", full_disk)
    left = _profile_one_window_on_a_full_disk(tmp_path)
    assert left == [], left


def test_an_export_that_fails_without_raising_leaves_no_empty_or_tmp_trace(tmp_path, monkeypatch):
    """Kineto on a full disk: a 0-byte ``.tmp`` beside the trace, an error logged, nothing raised; the window's
    trace was then missing and the 0-byte ``*.pt.trace.json.tmp`` stayed beside the traces."""

    def silent_full_disk(self, path):
        Path(path + ".tmp").write_text("")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", silent_full_disk)
    window = ProfilerWindow(start_step=1, warmup=0, active=1)
    trainer = make_trainer(tmp_path, max_steps=3, limit_train_batches=3, callbacks=[window], limit_val_batches=0)
    with pytest.warns(UserWarning, match="nothing was written to window1_steps1-1.pt.trace.json"):
        trainer.fit(TimedNet(), train_dataloaders=DataLoader(TimedImages(DrivenClock()), batch_size=4))
    assert trainer.global_step == 3
    assert list((Path(trainer.log_dir) / "profiler").glob("*")) == []


def test_an_op_table_that_cannot_be_written_leaves_no_empty_file(tmp_path, monkeypatch):
    real = Path.write_text

    def full_disk(self, text, *args, **kwargs):
        if "key_averages" in self.name:
            real(self, "")  # the file is created, then the disk is full
            raise OSError(28, "No space left on device")
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    left = _profile_one_window_on_a_full_disk(tmp_path)
    assert [p.name for p in left] == ["window1_steps1-1.pt.trace.json"]  # the whole trace; no partial op table
    assert json.loads(left[0].read_text())["traceEvents"]


# -- nothing is lost across resume ---------------------------------------------------------------------------------
class _InfAt(TimedNet):
    def __init__(self, inf_at=()):
        super().__init__()
        self.inf_at = set(inf_at)

    def on_after_backward(self):
        if self.global_step in self.inf_at:
            self.net[-1].weight.grad.fill_(float("inf"))


def _fit_fp16(tmp_path, steps, callbacks, ckpt=None, every=None):
    extra = [ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=every, save_top_k=-1)] if every else []
    trainer = make_trainer(
        tmp_path,
        max_steps=steps,
        limit_train_batches=steps,
        callbacks=callbacks + extra,
        plugins=[FP32BatchNormPrecision("16-mixed", init_scale=1024.0, growth_interval=1000)],
        enable_checkpointing=bool(every),
        limit_val_batches=0,
    )
    trainer.fit(
        _InfAt(inf_at=(1, 3, 4, 6, 7)),
        train_dataloaders=DataLoader(TimedImages(DrivenClock(), n=64), batch_size=4),
        ckpt_path=ckpt,
    )
    return trainer


def test_loss_scale_monitor_counts_every_skipped_step_across_resume(tmp_path):
    whole = LossScaleMonitor(log_every_n_steps=4)
    _fit_fp16(tmp_path / "whole", 10, [whole])
    first = LossScaleMonitor(log_every_n_steps=4)
    _fit_fp16(tmp_path / "a", 6, [first], every=6)  # checkpoint at step 6: steps 5-6 not yet counted there
    resumed = LossScaleMonitor(log_every_n_steps=4)
    ckpt = sorted((tmp_path / "a" / "ckpt").glob("*.ckpt"))[-1]
    _fit_fp16(tmp_path / "b", 10, [resumed], ckpt=str(ckpt))
    resumed._count_pending()
    whole._count_pending()
    assert whole.skipped_steps == 5
    assert resumed.skipped_steps == whole.skipped_steps
    assert resumed.optimizer_steps == whole.optimizer_steps


def _windows_fit(
    root: Path, steps: int, ckpt: Path | None = None, every: int | None = None, window: ProfilerWindow | None = None
) -> pl.Trainer:
    window = window or ProfilerWindow(start_step=4, warmup=1, active=4, every_n_steps=10, max_windows=2)
    extra = [ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=every, save_top_k=-1)] if every else []
    trainer = make_trainer(
        root,
        max_steps=steps,
        limit_train_batches=30,
        callbacks=[window, *extra],
        enable_checkpointing=bool(every),
        limit_val_batches=0,
    )
    trainer.fit(
        TimedNet(),
        train_dataloaders=DataLoader(TimedImages(DrivenClock(), n=120), batch_size=4),
        ckpt_path=str(ckpt) if ckpt else None,
    )
    return trainer


def _traces(trainer: pl.Trainer) -> list[str]:
    return sorted(p.name for p in (Path(trainer.log_dir) / "profiler").glob("*.pt.trace.json"))


def test_a_window_straddling_the_resume_step_is_captured(tmp_path):
    first = _windows_fit(tmp_path / "a", 6, every=6)  # the run stops inside the first window (steps 4-7)
    assert _traces(first) == ["window1_steps4-5.pt.trace.json"]
    ckpt = sorted((tmp_path / "a" / "ckpt").glob("*.ckpt"))[-1]
    resumed = _windows_fit(tmp_path / "b", 20, ckpt=ckpt)
    # the rest of the cut window, then the next one (numbered on from the first run's)
    assert _traces(resumed) == ["window2_steps6-7.pt.trace.json", "window3_steps14-17.pt.trace.json"]


def test_a_window_wholly_before_the_resume_step_is_reported(tmp_path):
    plain = _windows_fit(tmp_path / "a", 9, every=9, window=ProfilerWindow(start_step=1000))
    ckpt = sorted((tmp_path / "a" / "ckpt").glob("*.ckpt"))[-1]
    assert plain.global_step == 9
    with pytest.warns(UserWarning, match=r"window of steps 4-7 was not captured: this run starts at step 9"):
        resumed = _windows_fit(tmp_path / "b", 16, ckpt=ckpt)
    assert _traces(resumed) == ["window1_steps14-15.pt.trace.json"]  # the missed one is reported, not numbered


def test_a_resumed_run_writes_the_flops_figures_again(tmp_path):
    first = make_trainer(
        tmp_path / "a",
        max_steps=3,
        callbacks=[
            FlopsLogger(peak="none", log_every_n_steps=1),
            ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3),
        ],
        enable_checkpointing=True,
        limit_val_batches=0,
    )
    loader = DataLoader(TimedImages(DrivenClock()), batch_size=4)
    first.fit(TimedNet(), train_dataloaders=loader)
    ckpt = sorted((tmp_path / "ckpt").glob("*.ckpt"))[-1]
    flops = FlopsLogger(peak="none", log_every_n_steps=1)
    second = make_trainer(tmp_path / "b", max_steps=5, callbacks=[flops], limit_val_batches=0)
    second.fit(TimedNet(), train_dataloaders=loader, ckpt_path=str(ckpt))
    assert flops.counted_batches == 0  # the counts came back with the checkpoint
    acc = read_events(second.logger.log_dir)
    assert scalar_values(acc, "compute/forward_gflops_per_sample")
    assert "compute/flops_by_module/text_summary" in acc.Tags()["tensors"]
    assert [s for s, _ in scalar_values(acc, "compute/flops_per_step")] == [3, 4]


def test_a_flops_logger_whose_counts_keep_failing_stops_counting(tmp_path, monkeypatch):
    from torch.utils.flop_counter import flop_registry

    def broken(*args, **kwargs):
        raise RuntimeError("formula exploded")

    for op in (torch.ops.aten.convolution, torch.ops.aten.addmm):
        monkeypatch.setitem(flop_registry, op, broken)

    class Shapes(torch.utils.data.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            side = 8 + (i // 4)  # a new shape every batch
            return torch.randn(3, side, side), i % 4

    flops = FlopsLogger(peak="none", log_every_n_steps=1, predict_shapes=False)
    trainer = clocked_trainer(
        tmp_path, DrivenClock(), max_steps=8, limit_train_batches=8, callbacks=[flops], limit_val_batches=0
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(TimedNet(), train_dataloaders=DataLoader(Shapes(), batch_size=4))
    assert trainer.global_step == 8
    assert flops.counted_batches == 3  # then it stops trying
    messages = [str(w.message) for w in caught if "FlopsLogger" in str(w.message)]
    assert len(messages) == 2
    assert "formula exploded" in messages[0]
    assert "counting is now off" in messages[1]
