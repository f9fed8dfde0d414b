"""The shared timeline: one clock, one step, labelled intervals, one logging event, as a user sees them."""

from __future__ import annotations

import json
import re
import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader

from lit_compute import (
    DeviceMonitor,
    FlopsLogger,
    FP32BatchNormPrecision,
    LossScaleMonitor,
    ProfilerWindow,
    StepTimeMonitor,
)
from lit_compute.timeline import Timeline, timeline_for

from .conftest import (
    DrivenClock,
    TimedImages,
    TimedNet,
    clocked_trainer,
    read_events,
    run_script,
    scalar_values,
    text_values,
)


def _steps(acc, tag) -> list[int]:
    return [s for s, _ in scalar_values(acc, tag)]


def _values(acc, tag) -> dict[int, float]:
    return dict(scalar_values(acc, tag))


# -- the clock --------------------------------------------------------------------------------------------
def test_labelled_intervals_pause_the_clock_once_even_when_nested():
    clock = DrivenClock()
    timeline = Timeline(clock)
    start = timeline.now()
    clock.advance(1.0)
    with timeline.interval("validation", "validate"):
        clock.advance(5.0)
        with timeline.instrument("profiler_export"):
            clock.advance(2.0)
        clock.advance(1.0)
    clock.advance(0.5)
    assert timeline.now() - start == pytest.approx(1.5)
    assert timeline.totals == pytest.approx({"validation": 8.0, "validation:validate": 8.0, "instrument": 2.0,
                                             "instrument:profiler_export": 2.0})
    timeline.begin("instrument", "open")
    clock.advance(3.0)
    assert timeline.now() - start == pytest.approx(1.5)  # an open interval is already left out
    assert timeline.end("instrument") == pytest.approx(3.0)
    assert timeline.end("checkpoint") == 0.0  # nothing open: nothing happens


# -- instrument time is not the user's time ---------------------------------------------------------------
def test_profiler_export_never_lands_in_data_wait_or_tflops(tmp_path, monkeypatch):
    clock = DrivenClock()
    original = torch.profiler.profile.export_chrome_trace

    def slow_export(self, path):
        clock.advance(2.5)  # a 2.5 s trace export, as on a real run with a big window
        return original(self, path)

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", slow_export)
    callbacks = [ProfilerWindow(start_step=4, warmup=1, active=2), StepTimeMonitor(log_every_n_steps=1, window=4),
                 FlopsLogger(peak_flops=1e12, log_every_n_steps=1)]
    trainer = clocked_trainer(tmp_path, clock, max_steps=10, limit_train_batches=10, callbacks=callbacks,
                              limit_val_batches=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(TimedNet(clock, compute_s=0.05), train_dataloaders=DataLoader(TimedImages(clock, 0.0005),
                                                                                     batch_size=4))
    assert not [w for w in caught if "input-bound" in str(w.message)]
    acc = read_events(trainer.logger.log_dir)
    assert "time/advice" not in {t.removesuffix("/text_summary") for t in acc.Tags()["tensors"]}
    wait = _values(acc, "time/data_wait_ms")
    # step 0 holds the FLOP count and the epoch start; 3-5 are the profiled window: left out, not wrong
    assert sorted(wait) == [1, 2, 6, 7, 8, 9]
    assert all(v == pytest.approx(2.0) for v in wait.values())  # 4 items x 0.5 ms, the export is not in step 6
    assert all(v == pytest.approx(50.0) for v in _values(acc, "time/compute_ms").values())
    tflops = _values(acc, "compute/tflops_per_sec")
    assert sorted(tflops) == [1, 2, 6, 7, 8, 9]
    assert len({round(v, 12) for v in tflops.values()}) == 1  # the step after the window is like every other
    assert _values(acc, "profiler/export_ms") == {5: pytest.approx(2500.0, rel=1e-6)}
    assert _values(acc, "time/instrument_ms")[5] == pytest.approx(2500.0, rel=1e-6)


def test_checkpoint_saving_is_left_out_of_data_wait(tmp_path, monkeypatch):
    clock = DrivenClock()
    original = pl.Trainer.save_checkpoint

    def slow_save(self, *args, **kwargs):
        clock.advance(3.0)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pl.Trainer, "save_checkpoint", slow_save)
    trainer = clocked_trainer(tmp_path, clock, max_steps=6, limit_train_batches=6, limit_val_batches=0,
                              enable_checkpointing=True,
                              callbacks=[StepTimeMonitor(log_every_n_steps=1),
                                         ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2)])
    trainer.fit(TimedNet(clock, compute_s=0.02), train_dataloaders=DataLoader(TimedImages(clock, 0.001),
                                                                               batch_size=4))
    assert list((tmp_path / "ckpt").glob("*.ckpt"))
    wait = _values(read_events(trainer.logger.log_dir), "time/data_wait_ms")
    assert sorted(wait) == [1, 2, 3, 4, 5]
    assert all(v == pytest.approx(4.0) for v in wait.values())
    assert timeline_for(trainer).totals["checkpoint"] == pytest.approx(9.0)  # saved after steps 1, 3 and 5


# -- one definition of a step -------------------------------------------------------------------------------
def test_gradient_accumulation_logs_one_point_per_optimizer_step(tmp_path):
    clock = DrivenClock()
    callbacks = [StepTimeMonitor(log_every_n_steps=1), DeviceMonitor(log_every_n_steps=1, gpu=False),
                 FlopsLogger(peak_flops=1e12, log_every_n_steps=1)]
    trainer = clocked_trainer(tmp_path, clock, max_steps=4, limit_train_batches=16, accumulate_grad_batches=4,
                              callbacks=callbacks, limit_val_batches=0)
    model = TimedNet(clock, compute_s=0.01)
    trainer.fit(model, train_dataloaders=DataLoader(TimedImages(clock, 0.001), batch_size=4))
    acc = read_events(trainer.logger.log_dir)
    assert _steps(acc, "train/loss") == [0, 1, 2, 3]  # Lightning's own numbering of the same events
    for tag in ("device/cpu_percent", "device/rss_gb", "compute/flops_per_step", "time/instrument_ms"):
        assert _steps(acc, tag) == [0, 1, 2, 3], tag
    for tag in ("time/step_ms", "time/data_wait_ms", "time/compute_ms", "time/samples_per_sec"):
        assert _steps(acc, tag) == [1, 2, 3], tag  # step 0 holds the FLOP count: left out
    # one step = four micro-batches of 4 items: 4 x (4 ms load + 10 ms compute)
    assert all(v == pytest.approx(56.0) for v in _values(acc, "time/step_ms").values())
    assert all(v == pytest.approx(16 / 0.056) for v in _values(acc, "time/samples_per_sec").values())
    per_batch = trainer.callbacks[2].counts
    (count,) = [c for sig, c in per_batch.items() if sig[0] == "train"]
    assert all(v == 4 * count.total for v in _values(acc, "compute/flops_per_step").values())


class _GAN(pl.LightningModule):
    """Two optimizers, manual optimization: one step per batch, whatever global_step does."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.g = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        self.d = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        opt_g, opt_d = self.optimizers()
        fake = self.g(torch.randn_like(x))
        d_loss = nn.functional.softplus(-self.d(x)).mean() + nn.functional.softplus(self.d(fake.detach())).mean()
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        g_loss = nn.functional.softplus(-self.d(fake)).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.log("train/d_loss", d_loss)

    def configure_optimizers(self):
        return torch.optim.Adam(self.g.parameters()), torch.optim.Adam(self.d.parameters())


def _profiler_steps(path) -> list[int]:
    events = json.loads(path.read_text())["traceEvents"]
    return sorted(int(m.group(1)) for e in events if e.get("ph") == "X"
                  and not str(e.get("cat", "")).startswith("gpu_")
                  and (m := re.match(r"^ProfilerStep#(\d+)$", str(e.get("name", "")))))


def test_manual_optimization_with_two_optimizers_is_one_step_per_batch(tmp_path):
    gan = _GAN()
    window = ProfilerWindow(start_step=2, warmup=1, active=2)
    flops = FlopsLogger(peak="none", log_every_n_steps=2)
    trainer = clocked_trainer(tmp_path, DrivenClock(), max_epochs=1, max_steps=-1, limit_train_batches=8, limit_val_batches=0,
                              log_every_n_steps=2, callbacks=[window, flops, StepTimeMonitor(log_every_n_steps=2)])
    data = torch.utils.data.TensorDataset(torch.randn(32, 8))
    trainer.fit(gan, train_dataloaders=DataLoader(data, batch_size=4))
    assert trainer.global_step == 16  # two optimizer steps per batch
    traces = sorted((tmp_path / "logs" / "version_0" / "profiler").glob("*.pt.trace.json"))
    assert [t.name for t in traces] == ["window1_steps2-3.pt.trace.json"]
    assert _profiler_steps(traces[0]) == [2, 3]
    acc = read_events(trainer.logger.log_dir)
    assert _steps(acc, "train/d_loss") == [1, 3, 5, 7]
    assert _steps(acc, "compute/flops_per_step") == [1, 3, 5, 7]
    # the whole batch is counted: both optimizers' forward and backward, not only up to the first step().
    # Batch 4; layers g1 8->16, g2 16->8, d1 8->16, d2 16->1: forward 2*4*in*out each (1024, 1024, 1024, 128).
    g, d1, d2 = 1024 + 1024, 1024, 128
    forward = g + 3 * (d1 + d2)  # G once, D on real, on fake.detach() and on fake
    d_backward = 2 * (2 * d2 + d1)  # the two D passes: d2 both gradients, d1 weights only (inputs need none)
    g_backward = (2 * d2 + 2 * d1) + 2 * 1024 + 1024  # D with its input gradient, g2 both, g1 weights only
    assert set(_values(acc, "compute/flops_per_step").values()) == {forward + d_backward + g_backward} == {13440}


def test_a_window_cut_short_is_named_after_the_steps_it_holds(tmp_path):
    window = ProfilerWindow(start_step=2, warmup=1, active=100)
    trainer = clocked_trainer(tmp_path, DrivenClock(), max_steps=5, limit_train_batches=10, limit_val_batches=0,
                              callbacks=[window])
    trainer.fit(TimedNet(), train_dataloaders=DataLoader(TimedImages(DrivenClock()), batch_size=4))
    traces = sorted((tmp_path / "logs" / "version_0" / "profiler").glob("*.pt.trace.json"))
    assert [t.name for t in traces] == ["window1_steps2-4.pt.trace.json"]
    assert _profiler_steps(traces[0]) == [2, 3, 4]


def test_slow_step_triggers_a_window_on_a_driven_clock(tmp_path):
    clock = DrivenClock()
    window = ProfilerWindow(start_step=1000, warmup=1, active=2, on_slow_step=20.0)
    trainer = clocked_trainer(tmp_path, clock, max_steps=16, limit_train_batches=16, callbacks=[window],
                              limit_val_batches=0)
    trainer.fit(TimedNet(clock, compute_s=0.01, slow={9: 0.5}),
                train_dataloaders=DataLoader(TimedImages(clock, 0.0), batch_size=4))
    traces = sorted((tmp_path / "logs" / "version_0" / "profiler").glob("*.pt.trace.json"))
    assert [t.name for t in traces] == ["window1_steps11-12.pt.trace.json"]  # 9 is slow, 10 warms up
    assert _profiler_steps(traces[0]) == [11, 12]


def test_input_bound_and_compute_bound_runs_on_a_driven_clock(tmp_path):
    def fit(name, load_s):
        clock = DrivenClock()
        monitor = StepTimeMonitor(log_every_n_steps=2, window=6, stall_fraction=0.3)
        trainer = clocked_trainer(tmp_path / name, clock, max_steps=12, limit_train_batches=12, limit_val_batches=0,
                                  callbacks=[monitor])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(TimedNet(clock, compute_s=0.01), train_dataloaders=DataLoader(TimedImages(clock, load_s),
                                                                                       batch_size=4))
        stalls = [str(w.message) for w in caught if "input-bound" in str(w.message)]
        return read_events(trainer.logger.log_dir), stalls

    acc, stalls = fit("slow", 0.03)  # 120 ms of loading per batch against 10 ms of compute
    assert all(v == pytest.approx(120 / 130) for v in _values(acc, "time/data_wait_fraction").values())
    assert len(stalls) == 1 and "num_workers=0" in stalls[0]
    assert "num_workers=0" in text_values(acc, "time/advice")[0]
    acc, stalls = fit("fast", 0.0005)
    assert all(v == pytest.approx(2 / 12) for v in _values(acc, "time/data_wait_fraction").values())
    assert stalls == []
    step, compute, wait = (_values(acc, f"time/{k}") for k in ("step_ms", "compute_ms", "data_wait_ms"))
    assert step and all(step[s] == pytest.approx(compute[s] + wait[s]) for s in step)


def test_every_lit_compute_metric_of_an_event_shares_lightnings_step_number(tmp_path):
    callbacks = [FlopsLogger(peak_flops=1e12), StepTimeMonitor(), DeviceMonitor(gpu=False), LossScaleMonitor(),
                 ProfilerWindow(start_step=4, warmup=0, active=1)]
    clock = DrivenClock()
    trainer = clocked_trainer(tmp_path, clock, max_steps=9, limit_train_batches=9, log_every_n_steps=3,
                              callbacks=callbacks, plugins=[FP32BatchNormPrecision("16-mixed")], limit_val_batches=0)
    trainer.fit(TimedNet(clock), train_dataloaders=DataLoader(TimedImages(clock, 0.001), batch_size=4))
    acc = read_events(trainer.logger.log_dir)
    expected = _steps(acc, "train/loss")
    assert expected == [2, 5, 8]
    for tag in ("compute/flops_per_step", "compute/tflops_per_sec", "time/step_ms", "time/data_wait_ms",
                "device/cpu_percent", "amp/loss_scale", "amp/skipped_steps"):
        assert _steps(acc, tag) == expected, tag
    assert _steps(acc, "profiler/step_time_ms") == [4]  # a window's scalars come at its own last step


def test_validate_alone_logs_val_mfu(tmp_path):
    clock = DrivenClock()
    trainer = clocked_trainer(tmp_path, clock, callbacks=[FlopsLogger(peak_flops=1e11)], limit_val_batches=3)
    trainer.validate(TimedNet(clock), dataloaders=DataLoader(TimedImages(clock, 0.001), batch_size=4))
    acc = read_events(trainer.logger.log_dir)
    tags = set(acc.Tags()["scalars"])
    assert {"compute/val_flops_per_step", "compute/val_tflops_per_sec", "compute/val_mfu"} <= tags
    (tflops,) = [v for _, v in scalar_values(acc, "compute/val_tflops_per_sec")]
    (mfu,) = [v for _, v in scalar_values(acc, "compute/val_mfu")]
    assert mfu == pytest.approx(tflops / 0.1, rel=1e-6)


# -- collectives depend only on shared state ----------------------------------------------------------------
DDP_SCRIPT = r'''
import json, math, sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lit_compute import (CommBenchmark, DeviceMonitor, FlopsLogger, FP32BatchNormPrecision, LossScaleMonitor,
                         PrometheusLogger, ProfilerWindow, StepTimeMonitor, TunedDDPStrategy)

out = Path(sys.argv[1])
FAIL_ON_RANK1 = sys.argv[2] == "fail"


class Tokens(Dataset):
    """Sequence lengths depend on the rank and the index: the ranks' batch shapes change at different steps."""

    def __init__(self, n, offset):
        self.n, self.offset = n, offset

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def val_collate(indices):
    return collate(indices, val=True)


def collate(indices, val=False):
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    length = 8 + 4 * ((indices[0] // 4 + rank * (1 + val)) % 3)
    g = torch.Generator().manual_seed(indices[0])
    return {"input_ids": torch.randint(0, 50, (len(indices), length), generator=g)}


class TinyLM(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.block = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
        self.head = nn.Linear(32, 50)

    def loss(self, batch):
        ids = batch["input_ids"]
        logits = self.head(self.block(self.emb(ids)))
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 50), ids[:, 1:].reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.loss(batch), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Recording(FlopsLogger):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen = {}

    def _step_end(self, trainer, pl_module, record, event):
        if FAIL_ON_RANK1 and trainer.global_rank == 1 and record.index == 3:
            raise RuntimeError("injected failure on rank 1 only")
        super()._step_end(trainer, pl_module, record, event)
        if self.last_local_tflops is not None:
            self.seen[record.index] = self.last_local_tflops

    def on_train_end(self, trainer, pl_module):
        (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.seen))


if __name__ == "__main__":
    loaders = dict(
        train_dataloaders=DataLoader(Tokens(64, 0), batch_size=4, collate_fn=collate),
        val_dataloaders=DataLoader(Tokens(16, 1), batch_size=4, collate_fn=val_collate),
    )
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, max_steps=12, log_every_n_steps=2, val_check_interval=4, limit_val_batches=2,
        num_sanity_val_steps=1, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        strategy=TunedDDPStrategy(start_method="spawn"),
        plugins=[FP32BatchNormPrecision("bf16-mixed")],
        logger=[pl.loggers.TensorBoardLogger(str(out), name="tb", version=0), PrometheusLogger(port=0)],
        callbacks=[Recording(peak_flops=1e11), StepTimeMonitor(), DeviceMonitor(gpu=False), LossScaleMonitor(),
                   ProfilerWindow(start_step=3, warmup=1, active=2), CommBenchmark(max_mb=0.05, seconds=2)],
    )
    trainer.fit(TinyLM(), **loaders)
    print("FIT DONE")
'''


@pytest.mark.parametrize("mode", ["ok", "fail"])
def test_ddp_ranks_with_different_shapes_never_hang_and_sum_their_tflops(tmp_path, mode):
    result = run_script(tmp_path, DDP_SCRIPT, str(tmp_path), mode, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "FIT DONE" in result.stdout
    acc = read_events(tmp_path / "tb" / "version_0")
    summed = _values(acc, "compute/global_tflops_per_sec") if "compute/global_tflops_per_sec" in acc.Tags()[
        "scalars"] else {}
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    if mode == "ok":
        assert sorted(summed) and set(summed) <= {1, 3, 5, 7, 9, 11}
        for step, value in summed.items():
            assert value == pytest.approx(ranks[0][str(step)] + ranks[1][str(step)], rel=1e-6)  # float32 events
        # the first validation (step 3) counts its new shapes; the later ones use the counts
        assert _steps(acc, "compute/val_flops_per_step") == [7, 11]  # rank-dependent validation shapes too
        assert "compute/val_mfu" in acc.Tags()["scalars"]
    else:
        assert "injected failure on rank 1 only" in result.stdout
        # rank 1 keeps contributing NaN after it disabled itself: no hang, and no sum that would be half a sum
        assert all(step < 3 for step in summed)
        assert _steps(acc, "time/step_ms")[-1] == 11  # the other callbacks went on to the end


def test_a_run_that_raised_mid_validation_leaves_no_stale_interval(tmp_path):
    clock = DrivenClock()

    class Fails(TimedNet):
        def validation_step(self, batch, batch_idx):
            if self.fail:
                raise RuntimeError("boom in validation")
            return super().validation_step(batch, batch_idx)

    model = Fails(clock, compute_s=0.01)
    model.fail = True
    trainer = clocked_trainer(tmp_path, clock, max_steps=6, limit_train_batches=6, val_check_interval=2,
                              limit_val_batches=1, callbacks=[StepTimeMonitor(log_every_n_steps=1)])
    loaders = dict(train_dataloaders=DataLoader(TimedImages(clock, 0.001), batch_size=4),
                   val_dataloaders=DataLoader(TimedImages(clock, 0.001), batch_size=4))
    with pytest.raises(RuntimeError, match="boom in validation"):
        trainer.fit(model, **loaders)
    model.fail = False
    again = clocked_trainer(tmp_path / "again", clock, max_steps=4, limit_train_batches=4, limit_val_batches=0,
                            callbacks=[StepTimeMonitor(log_every_n_steps=1)])
    timeline_for(again).clock = clock
    again.fit(model, **loaders)
    wait = _values(read_events(again.logger.log_dir), "time/data_wait_ms")
    assert wait and all(v == pytest.approx(4.0) for v in wait.values())
    # the same trainer object fitted again resets its timeline too
    trainer.fit(model, **loaders)
    assert timeline_for(trainer)._stack == []
