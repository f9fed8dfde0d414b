"""LossScaleMonitor on CPU (GradScaler works on CPU): skipped steps, resume, runs without a scaler."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest

from lit_compute import FP32BatchNormPrecision, LossScaleMonitor

from ..conftest import make_trainer, read_events, scalar_values
from .conftest import _ConvNet, _loader


def test_injected_inf_gradients_drop_the_scale_and_count_skipped_steps(tmp_path):
    model = _ConvNet(inf_at=(2, 5))
    plugin = FP32BatchNormPrecision("16-mixed", init_scale=1024.0, growth_interval=1000)
    trainer = make_trainer(
        tmp_path,
        max_steps=8,
        limit_train_batches=8,
        plugins=[plugin],
        callbacks=[LossScaleMonitor(log_every_n_steps=1)],
    )
    trainer.fit(model, train_dataloaders=_loader())
    acc = read_events(trainer.logger.log_dir)
    scales = [v for _, v in scalar_values(acc, "amp/loss_scale")]
    skipped = [v for _, v in scalar_values(acc, "amp/skipped_steps")]
    assert scales[0] == 1024.0
    assert scales[-1] == 256.0
    assert skipped[0] == 0
    assert skipped[-1] == 2
    assert scalar_values(acc, "amp/skipped_step_fraction")[-1][1] == pytest.approx(2 / 8)


def test_checkpoint_resume_keeps_the_scale(tmp_path):
    plugin = FP32BatchNormPrecision("16-mixed", init_scale=1024.0)
    trainer = make_trainer(tmp_path, max_steps=4, plugins=[plugin])
    trainer.fit(_ConvNet(inf_at=(1,)), train_dataloaders=_loader())
    assert plugin.scaler.get_scale() == 512.0
    ckpt = tmp_path / "scale.ckpt"
    trainer.save_checkpoint(ckpt)

    seen = {}

    class Probe(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            seen["scale"] = trainer.precision_plugin.scaler.get_scale()

    resumed = FP32BatchNormPrecision("16-mixed", init_scale=1024.0)
    trainer2 = make_trainer(tmp_path / "resume", max_steps=6, plugins=[resumed], callbacks=[Probe()])
    trainer2.fit(_ConvNet(), train_dataloaders=_loader(), ckpt_path=str(ckpt))
    assert seen["scale"] == 512.0


def test_loss_scale_monitor_without_scaler_is_quiet_and_logs_nothing(tmp_path):
    trainer = make_trainer(
        tmp_path,
        max_steps=2,
        plugins=[FP32BatchNormPrecision("bf16-mixed")],
        callbacks=[LossScaleMonitor(log_every_n_steps=1)],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(_ConvNet(), train_dataloaders=_loader())
    assert not [w for w in caught if "LossScaleMonitor" in str(w.message)]  # bf16 has no scaler: nothing to say
    assert not [t for t in read_events(trainer.logger.log_dir).Tags()["scalars"] if t.startswith("amp/")]


def test_a_collapsed_scale_keeps_counting_skipped_steps_and_warns(tmp_path):
    """inf gradients at every step: the scale halves each step until it is 0 (float32 underflow) and stays there;
    every step is still counted as skipped, and one warning says the run can no longer learn."""
    model = _ConvNet(inf_at=tuple(range(40)))
    plugin = FP32BatchNormPrecision("16-mixed", init_scale=2.0**-140, growth_interval=1000)
    trainer = make_trainer(
        tmp_path,
        max_steps=24,
        limit_train_batches=8,
        plugins=[plugin],
        callbacks=[LossScaleMonitor(log_every_n_steps=4)],
    )
    with pytest.warns(UserWarning, match=r"loss scale collapsed to .*can no longer learn"):
        trainer.fit(model, train_dataloaders=_loader())
    acc = read_events(trainer.logger.log_dir)
    assert scalar_values(acc, "amp/loss_scale")[-1][1] == 0.0
    assert scalar_values(acc, "amp/skipped_steps")[-1] == (23, 24.0)  # every step, to the end
    assert scalar_values(acc, "amp/skipped_step_fraction")[-1][1] == 1.0
