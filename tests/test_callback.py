"""MeasuringCallback as a user extends it: the README's gradient-norm monitor (examples/grad_norm_monitor.py)
joins the one logging event and the one all-reduce, in one process and on two gloo ranks."""

from __future__ import annotations

import math
import runpy
from pathlib import Path

import pytest

from lit_compute import MeasuringCallback

from .conftest import read_events, scalar_values

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "grad_norm_monitor.py"


def test_grad_norm_example_logs_with_the_event_at_lit_computes_steps(tmp_path, capsys):
    example = runpy.run_path(str(EXAMPLE))
    monitor = example["main"](str(tmp_path), max_steps=20)
    out = capsys.readouterr().out
    acc = read_events(next(tmp_path.rglob("events.out.tfevents.*")).parent)
    norms = dict(scalar_values(acc, "train/grad_norm"))
    assert sorted(norms) == [4, 9, 14, 19] == [s for s, _ in scalar_values(acc, "time/step_ms")]
    assert norms == {s: pytest.approx(v, rel=1e-6) for s, v in monitor.local.items()}  # float32 events
    assert all(math.isfinite(v) and v > 0 for v in norms.values())
    assert "step 19: train/grad_norm" in out


def test_a_failing_user_callback_turns_itself_off_and_training_goes_on(tmp_path):
    example = runpy.run_path(str(EXAMPLE))

    class Fails(example["GradNormMonitor"]):
        def _log(self, trainer, pl_module, event):
            raise RuntimeError("bug in my callback")

    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel

    from lit_compute import StepTimeMonitor

    monitor = Fails(log_every_n_steps=2)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=6,
        log_every_n_steps=2,
        default_root_dir=str(tmp_path),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[monitor, StepTimeMonitor()],
    )
    with pytest.warns(UserWarning, match="Fails: log_event failed with RuntimeError: bug in my callback.*disabled"):
        trainer.fit(BoringModel())
    assert trainer.global_step == 6
    assert monitor._disabled
    acc = read_events(next(tmp_path.rglob("events.out.tfevents.*")).parent)
    assert [s for s, _ in scalar_values(acc, "time/step_ms")] == [1, 3, 5]  # the others logged to the end


def test_measuring_callback_is_public():
    import lit_compute

    assert "MeasuringCallback" in lit_compute.__all__
    assert MeasuringCallback.__module__ == "lit_compute.callback"
