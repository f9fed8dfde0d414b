"""The shared timeline: one clock, one step, labelled intervals, one logging event, as a user sees them."""

from __future__ import annotations

import json
import re
import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
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
    TwoOptimizerGAN,
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
    assert timeline.totals == pytest.approx(
        {"validation": 8.0, "validation:validate": 8.0, "instrument": 2.0, "instrument:profiler_export": 2.0}
    )
    timeline.begin("instrument", "open")
    clock.advance(3.0)
    assert timeline.now() - start == pytest.approx(1.5)  # an open interval is already left out
    assert timeline.end("instrument") == pytest.approx(3.0)
    assert timeline.end("checkpoint") == 0.0  # nothing open: nothing happens


# -- the unit layer: the timeline without a Trainer ----------------------------------------------------------
class StubTrainer:
    """What the timeline reads of a trainer, and nothing more: the step counters, accumulation, the strategy's
    device and reduce (recorded: the layout of every all-reduce)."""

    def __init__(self, world_size: int = 1, accumulate: int = 1, reduce_with=None) -> None:
        from types import SimpleNamespace

        self.global_step = 0
        self.world_size = world_size
        self.is_global_zero = True
        self.datamodule = None
        self.lightning_module = SimpleNamespace(automatic_optimization=True)
        self.reduced: list[list[float]] = []
        self._batches = 0
        self._accumulate = accumulate
        self._reduce_with = reduce_with  # other ranks' values, added to ours (None: just ours)
        loop = SimpleNamespace(_batches_that_stepped=0, _should_accumulate=lambda: self._batches % accumulate != 0)
        self.fit_loop = SimpleNamespace(epoch_loop=loop)
        self.strategy = SimpleNamespace(root_device=torch.device("cpu"), reduce=self._reduce)

    def _reduce(self, tensor, reduce_op):
        assert reduce_op == "sum"
        self.reduced.append(tensor.tolist())
        other = torch.tensor(self._reduce_with(tensor.tolist()), dtype=tensor.dtype) if self._reduce_with else 0
        return tensor + other

    def finish_batch(self) -> None:
        """What Lightning does after a training batch: step the optimizer at the accumulation boundary."""
        self._batches += 1
        if self._batches % self._accumulate == 0:
            self.global_step += 1
            self.fit_loop.epoch_loop._batches_that_stepped += 1


class Participant:
    def __init__(self, keys=("x",), every: int = 1, fails: bool = False) -> None:
        self.reduce_keys = {"train": tuple(keys)}
        self.every, self.fails, self.disabled = every, fails, None

    def logs_at(self, trainer, stage, step):
        return stage == "train" and (step + 1) % self.every == 0

    def disable(self, reason):
        self.disabled = reason


def _run_step(timeline, trainer, clock, wait=0.0, compute=0.0, batch=None):
    clock.advance(wait)
    timeline.batch_start(trainer, batch if batch is not None else torch.zeros(4, 3))
    clock.advance(compute)
    trainer.finish_batch()
    return timeline.batch_end(trainer)


def test_unit_marks_give_exact_wait_and_compute_and_the_first_step_is_tainted():
    clock, trainer = DrivenClock(), StubTrainer()
    timeline = Timeline(clock)
    timeline.train_start(trainer)
    timeline.epoch_start()
    first = _run_step(timeline, trainer, clock, wait=0.5, compute=0.25)
    second = _run_step(timeline, trainer, clock, wait=0.125, compute=0.25)
    assert (first.index, second.index) == (0, 1)
    assert first.taints == {"start"}
    assert not first.clean
    assert second.clean
    assert second.samples == 4
    assert second.batches == 1
    assert (second.wait_s, second.compute_s) == (pytest.approx(0.125), pytest.approx(0.25))
    # a later caller in the same batch gets the same record; the first caller took the mark
    assert timeline.batch_end(trainer) is second


def test_unit_intervals_inside_a_step_are_removed_and_taints_mark_the_step():
    clock, trainer = DrivenClock(), StubTrainer()
    timeline = Timeline(clock)
    timeline.train_start(trainer)
    _run_step(timeline, trainer, clock, compute=0.1)
    clock.advance(0.2)  # data wait
    timeline.batch_start(trainer, torch.zeros(2, 3))
    clock.advance(0.3)
    with timeline.instrument("trace_export"):
        clock.advance(7.0)
    timeline.taint("profiler")
    clock.advance(0.1)
    trainer.finish_batch()
    record = timeline.batch_end(trainer)
    assert record.compute_s == pytest.approx(0.4)
    assert record.wait_s == pytest.approx(0.2)
    assert record.taints == {"profiler"}
    assert timeline.totals["instrument:trace_export"] == pytest.approx(7.0)
    # a checkpoint between steps is left out of the next step's data wait
    with timeline.interval("checkpoint", "save_checkpoint"):
        clock.advance(3.0)
    clock.advance(0.05)
    assert _run_step(timeline, trainer, clock, compute=0.1).wait_s == pytest.approx(0.05)


def test_unit_accumulated_micro_batches_are_one_step():
    clock, trainer = DrivenClock(), StubTrainer(accumulate=3)
    timeline = Timeline(clock)
    timeline.train_start(trainer)
    records = [_run_step(timeline, trainer, clock, wait=0.01, compute=0.1) for _ in range(6)]
    assert records[0] is None
    assert records[1] is None
    assert records[3] is None
    assert records[4] is None
    assert (records[2].index, records[5].index) == (0, 1)
    assert records[5].batches == 3
    assert records[5].samples == 12
    assert records[5].compute_s == pytest.approx(0.3)
    assert records[5].wait_s == pytest.approx(0.03)


class _Event:
    """A CUDA event as the timeline reads it: recorded at a device time."""

    def __init__(self, t: float) -> None:
        self.t = t

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, later: _Event) -> float:
        return (later.t - self.t) * 1e3


class _Stream:
    """A CUDA stream as the timeline's events see it: a device time that runs with the host clock, plus the stalls
    of the collectives it was made to wait for (which the host never sees under NCCL)."""

    def __init__(self, clock: DrivenClock) -> None:
        self.clock, self.stalled = clock, 0.0

    def event(self) -> _Event:
        return _Event(self.clock.t + self.stalled)


def test_unit_under_nccl_collectives_are_timed_on_the_stream_not_the_host(tmp_path, monkeypatch):
    """#50 item 5: on NCCL a collective's wait returns on the host at once; the stream stalls until the collective
    (and the other ranks) are done. The timeline records a CUDA event on the stream at each end of every wait, so the
    step's time in collectives, the part inside its forward (what the straggler's cause subtracts) and the part
    between batches (left out of the data wait) are the stream's. Real gloo collectives, their waits made to stall a
    simulated stream instead of the host."""
    import torch.distributed as dist

    clock, trainer = DrivenClock(), StubTrainer(world_size=2)
    stream = _Stream(clock)
    trainer.strategy.root_device = torch.device("cuda")
    monkeypatch.setattr(Timeline, "_cuda_event", lambda self: stream.event())
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    real_wait = dist.distributed_c10d.Work.wait
    stalls: list[float] = []

    def nccl_like_wait(work, *args, **kwargs):  # returns at once on the host; the stream waits for the collective
        stream.stalled += stalls.pop(0)
        return real_wait(work, *args, **kwargs)

    monkeypatch.setattr(dist.distributed_c10d.Work, "wait", nccl_like_wait)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    timeline = Timeline(clock)
    try:
        timeline.train_start(trainer)
        records = []
        for _ in range(2):
            clock.advance(0.1)  # data wait
            timeline.batch_start(trainer, torch.zeros(4, 3))
            clock.advance(0.2)
            stalls.append(0.3)
            dist.all_reduce(torch.ones(2))  # inside the forward: FSDP2's all-gather, a row-parallel all-reduce
            timeline.before_backward()
            clock.advance(0.1)
            stalls.append(0.05)
            dist.all_reduce(torch.ones(2))  # in the backward
            trainer.finish_batch()
            records.append(timeline.batch_end(trainer))
            stalls.append(0.02)
            dist.all_reduce(torch.ones(2))  # between batches: a logging all-reduce
    finally:
        timeline.stop_watching()
        dist.destroy_process_group()
    second = records[1]
    assert second.comm_s == 0.0
    assert second.forward_comm_s == 0.0
    comm, forward_comm, between = second.device_comm_times()
    assert (comm, forward_comm, between) == (pytest.approx(0.37), pytest.approx(0.3), pytest.approx(0.02))
    # on the stream the forward lasted 0.5 s, 0.3 s of it in the collective: 0.2 s of its own work
    assert second.device_forward_time() == pytest.approx(0.5)
    # the data wait on the stream holds the logging all-reduce's stall, which is not a wait for data
    wait, compute = second.device_times()
    assert (wait, compute) == (pytest.approx(0.1), pytest.approx(0.65))
    assert records[0].device_comm_times() == (pytest.approx(0.35), pytest.approx(0.3), 0.0)


def test_unit_flush_has_one_layout_whatever_a_rank_contributed():
    """Two participants, one logging every other step; the all-reduce's layout depends on configuration and step
    only: a rank with no event (or no contribution) sends NaN in the same slots."""
    clock, trainer = DrivenClock(), StubTrainer(world_size=2, reduce_with=lambda mine: [1.0] * len(mine))
    timeline = Timeline(clock)
    timeline.train_start(trainer)
    every_step, every_other = Participant(("a", "b")), Participant(("c",), every=2)
    participants = [every_step, every_other]
    layouts, logged = [], []
    for step in range(4):
        _run_step(timeline, trainer, clock, compute=0.1)
        event = timeline.event
        if step == 1:  # only the first participant contributes at step 1
            event.contribute(every_step, {"a": 2.0}, lambda sums: {"sum/a": sums["a"], "sum/b": sums["b"]})
        event.log({"local/step": step})
        flushed = timeline.flush(trainer, participants, "train")
        layouts.append(len(trainer.reduced[-1]))
        logged.append(flushed.metrics)
    assert layouts == [2, 3, 2, 3]  # a, b every step; c at steps 1 and 3
    assert trainer.reduced[1][:2] == [2.0, pytest.approx(float("nan"), nan_ok=True)]
    assert logged[1] == {"local/step": 1.0, "sum/a": 3.0, "sum/b": pytest.approx(float("nan"), nan_ok=True)}
    assert timeline.event is None
    # a rank without an event still joins the collective with the same layout, and returns nothing to write
    assert timeline.flush(trainer, participants, "train") is None
    assert len(trainer.reduced[-1]) == 2
    assert all(v != v for v in trainer.reduced[-1])


def test_unit_a_finish_that_raises_disables_its_owner_only():
    clock, trainer = DrivenClock(), StubTrainer()
    timeline = Timeline(clock)
    timeline.train_start(trainer)
    good, bad = Participant(("g",)), Participant(("b",))
    _run_step(timeline, trainer, clock, compute=0.1)
    timeline.event.contribute(bad, {"b": 1.0}, lambda sums: 1 / 0)
    timeline.event.contribute(good, {"g": 5.0}, lambda sums: {"good": sums["g"]})
    event = timeline.flush(trainer, [good, bad], "train")
    assert event.metrics == {"good": 5.0}
    assert "ZeroDivisionError" in bad.disabled
    assert good.disabled is None


# -- instrument time is not the user's time ---------------------------------------------------------------
def test_profiler_export_never_lands_in_data_wait_or_tflops(tmp_path, monkeypatch):
    clock = DrivenClock()
    original = torch.profiler.profile.export_chrome_trace

    def slow_export(self, path):
        clock.advance(2.5)  # a 2.5 s trace export, as on a real run with a big window
        return original(self, path)

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", slow_export)
    callbacks = [
        ProfilerWindow(start_step=4, warmup=1, active=2),
        StepTimeMonitor(log_every_n_steps=1, window=4),
        FlopsLogger(peak_flops=1e12, log_every_n_steps=1),
    ]
    trainer = clocked_trainer(
        tmp_path, clock, max_steps=10, limit_train_batches=10, callbacks=callbacks, limit_val_batches=0
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(
            TimedNet(clock, compute_s=0.05), train_dataloaders=DataLoader(TimedImages(clock, 0.0005), batch_size=4)
        )
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
    trainer = clocked_trainer(
        tmp_path,
        clock,
        max_steps=6,
        limit_train_batches=6,
        limit_val_batches=0,
        enable_checkpointing=True,
        callbacks=[
            StepTimeMonitor(log_every_n_steps=1),
            ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2),
        ],
    )
    trainer.fit(TimedNet(clock, compute_s=0.02), train_dataloaders=DataLoader(TimedImages(clock, 0.001), batch_size=4))
    assert list((tmp_path / "ckpt").glob("*.ckpt"))
    wait = _values(read_events(trainer.logger.log_dir), "time/data_wait_ms")
    assert sorted(wait) == [1, 2, 3, 4, 5]
    assert all(v == pytest.approx(4.0) for v in wait.values())
    assert timeline_for(trainer).totals["checkpoint"] == pytest.approx(9.0)  # saved after steps 1, 3 and 5


# -- one definition of a step -------------------------------------------------------------------------------
def test_gradient_accumulation_logs_one_point_per_optimizer_step(tmp_path):
    clock = DrivenClock()
    callbacks = [
        StepTimeMonitor(log_every_n_steps=1),
        DeviceMonitor(log_every_n_steps=1, gpu=False),
        FlopsLogger(peak_flops=1e12, log_every_n_steps=1),
    ]
    trainer = clocked_trainer(
        tmp_path,
        clock,
        max_steps=4,
        limit_train_batches=16,
        accumulate_grad_batches=4,
        callbacks=callbacks,
        limit_val_batches=0,
    )
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


def _profiler_steps(path) -> list[int]:
    events = json.loads(path.read_text())["traceEvents"]
    return sorted(
        int(m.group(1))
        for e in events
        if e.get("ph") == "X"
        and not str(e.get("cat", "")).startswith("gpu_")
        and (m := re.match(r"^ProfilerStep#(\d+)$", str(e.get("name", ""))))
    )


def test_manual_optimization_with_two_optimizers_is_one_step_per_batch(tmp_path):
    gan = TwoOptimizerGAN()
    window = ProfilerWindow(start_step=2, warmup=1, active=2)
    flops = FlopsLogger(peak="none", log_every_n_steps=2)
    trainer = clocked_trainer(
        tmp_path,
        DrivenClock(),
        max_epochs=1,
        max_steps=-1,
        limit_train_batches=8,
        limit_val_batches=0,
        log_every_n_steps=2,
        callbacks=[window, flops, StepTimeMonitor(log_every_n_steps=2)],
    )
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
    trainer = clocked_trainer(
        tmp_path, DrivenClock(), max_steps=5, limit_train_batches=10, limit_val_batches=0, callbacks=[window]
    )
    trainer.fit(TimedNet(), train_dataloaders=DataLoader(TimedImages(DrivenClock()), batch_size=4))
    traces = sorted((tmp_path / "logs" / "version_0" / "profiler").glob("*.pt.trace.json"))
    assert [t.name for t in traces] == ["window1_steps2-4.pt.trace.json"]
    assert _profiler_steps(traces[0]) == [2, 3, 4]


def test_slow_step_triggers_a_window_on_a_driven_clock(tmp_path):
    clock = DrivenClock()
    window = ProfilerWindow(start_step=1000, warmup=1, active=2, on_slow_step=20.0)
    trainer = clocked_trainer(
        tmp_path, clock, max_steps=16, limit_train_batches=16, callbacks=[window], limit_val_batches=0
    )
    trainer.fit(
        TimedNet(clock, compute_s=0.01, slow={9: 0.5}),
        train_dataloaders=DataLoader(TimedImages(clock, 0.0), batch_size=4),
    )
    traces = sorted((tmp_path / "logs" / "version_0" / "profiler").glob("*.pt.trace.json"))
    assert [t.name for t in traces] == ["window1_steps11-12.pt.trace.json"]  # 9 is slow, 10 warms up
    assert _profiler_steps(traces[0]) == [11, 12]


def test_input_bound_and_compute_bound_runs_on_a_driven_clock(tmp_path):
    def fit(name, load_s):
        clock = DrivenClock()
        monitor = StepTimeMonitor(log_every_n_steps=2, window=6, stall_fraction=0.3)
        trainer = clocked_trainer(
            tmp_path / name, clock, max_steps=12, limit_train_batches=12, limit_val_batches=0, callbacks=[monitor]
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(
                TimedNet(clock, compute_s=0.01), train_dataloaders=DataLoader(TimedImages(clock, load_s), batch_size=4)
            )
        stalls = [str(w.message) for w in caught if "input-bound" in str(w.message)]
        return read_events(trainer.logger.log_dir), stalls

    acc, stalls = fit("slow", 0.03)  # 120 ms of loading per batch against 10 ms of compute
    assert all(v == pytest.approx(120 / 130) for v in _values(acc, "time/data_wait_fraction").values())
    assert len(stalls) == 1
    assert "num_workers=0" in stalls[0]
    assert "num_workers=0" in text_values(acc, "time/advice")[0]
    acc, stalls = fit("fast", 0.0005)
    assert all(v == pytest.approx(2 / 12) for v in _values(acc, "time/data_wait_fraction").values())
    assert stalls == []
    step, compute, wait = (_values(acc, f"time/{k}") for k in ("step_ms", "compute_ms", "data_wait_ms"))
    assert step
    assert all(step[s] == pytest.approx(compute[s] + wait[s]) for s in step)


def test_every_lit_compute_metric_of_an_event_shares_lightnings_step_number(tmp_path):
    callbacks = [
        FlopsLogger(peak_flops=1e12),
        StepTimeMonitor(),
        DeviceMonitor(gpu=False),
        LossScaleMonitor(),
        ProfilerWindow(start_step=4, warmup=0, active=1),
    ]
    clock = DrivenClock()
    trainer = clocked_trainer(
        tmp_path,
        clock,
        max_steps=9,
        limit_train_batches=9,
        log_every_n_steps=3,
        callbacks=callbacks,
        plugins=[FP32BatchNormPrecision("16-mixed")],
        limit_val_batches=0,
    )
    trainer.fit(TimedNet(clock), train_dataloaders=DataLoader(TimedImages(clock, 0.001), batch_size=4))
    acc = read_events(trainer.logger.log_dir)
    expected = _steps(acc, "train/loss")
    assert expected == [2, 5, 8]
    for tag in (
        "compute/flops_per_step",
        "compute/tflops_per_sec",
        "time/step_ms",
        "time/data_wait_ms",
        "device/cpu_percent",
        "amp/loss_scale",
        "amp/skipped_steps",
    ):
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

    def _log(self, trainer, pl_module, event):
        if FAIL_ON_RANK1 and trainer.global_rank == 1 and event.step == 3:
            raise RuntimeError("injected failure on rank 1 only")
        super()._log(trainer, pl_module, event)
        if event.stage == "train" and self.last_local_tflops is not None:
            self.seen[event.step] = self.last_local_tflops

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
        strategy=TunedDDPStrategy(start_method="fork"),
        plugins=[FP32BatchNormPrecision("bf16-mixed")],
        logger=[pl.loggers.TensorBoardLogger(str(out), name="tb", version=0), PrometheusLogger(port=0)],
        callbacks=[Recording(peak_flops=1e11), StepTimeMonitor(), DeviceMonitor(gpu=False), LossScaleMonitor(),
                   ProfilerWindow(start_step=3, warmup=1, active=2), CommBenchmark(max_mb=0.05, seconds=2)],
    )
    trainer.fit(TinyLM(), **loaders)
    print("FIT DONE")
'''


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ok", "fail"])
def test_ddp_ranks_with_different_shapes_never_hang_and_sum_their_tflops(tmp_path, mode):
    result = run_script(tmp_path, DDP_SCRIPT, str(tmp_path), mode, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "FIT DONE" in result.stdout
    acc = read_events(tmp_path / "tb" / "version_0")
    summed = (
        _values(acc, "compute/global_tflops_per_sec")
        if "compute/global_tflops_per_sec" in acc.Tags()["scalars"]
        else {}
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    if mode == "ok":
        assert sorted(summed)
        assert set(summed) <= {1, 3, 5, 7, 9, 11}
        for step, value in summed.items():
            assert value == pytest.approx(ranks[0][str(step)] + ranks[1][str(step)], rel=1e-6)  # float32 events
        mfu = _values(acc, "compute/mfu")  # the sum over both devices against both devices' peaks (0.1 TFLOP/s each)
        assert mfu.keys() == summed.keys()
        for step, value in mfu.items():
            assert value == pytest.approx(summed[step] / (2 * 0.1), rel=1e-5)
        # the first validation (step 3) counts its new shapes and still logs its exact FLOPs (no rate: all of its
        # batches were instrument time); the later ones use the counts
        assert _steps(acc, "compute/val_flops_per_step") == [3, 7, 11]  # rank-dependent validation shapes too
        assert 3 not in _steps(acc, "compute/val_tflops_per_sec")
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
    trainer = clocked_trainer(
        tmp_path,
        clock,
        max_steps=6,
        limit_train_batches=6,
        val_check_interval=2,
        limit_val_batches=1,
        callbacks=[StepTimeMonitor(log_every_n_steps=1)],
    )
    loaders = {
        "train_dataloaders": DataLoader(TimedImages(clock, 0.001), batch_size=4),
        "val_dataloaders": DataLoader(TimedImages(clock, 0.001), batch_size=4),
    }
    with pytest.raises(RuntimeError, match="boom in validation"):
        trainer.fit(model, **loaders)
    model.fail = False
    again = clocked_trainer(
        tmp_path / "again",
        clock,
        max_steps=4,
        limit_train_batches=4,
        limit_val_batches=0,
        callbacks=[StepTimeMonitor(log_every_n_steps=1)],
    )
    timeline_for(again).clock = clock
    again.fit(model, **loaders)
    wait = _values(read_events(again.logger.log_dir), "time/data_wait_ms")
    assert wait
    assert all(v == pytest.approx(4.0) for v in wait.values())
    # the same trainer object fitted again resets its timeline too
    trainer.fit(model, **loaders)
    assert timeline_for(trainer)._stack == []


@pytest.mark.parametrize(("slowed", "seconds"), [("logger-write", 0.3), ("metric-computing", 0.2)])
def test_lit_computes_logging_work_is_in_no_step(tmp_path, monkeypatch, slowed, seconds):
    """What a rank does for the logging event after a batch's end mark is instrument time, in no step (driven clock):

    - #47 item 3: rank 0 writes every logger (its metrics, Lightning's, lit_compute's); a logger write of 0.3 s landed
      in its next step's data wait, so on evenly loaded ranks logging every step rank 0 was named a straggler (1.66x);
      the logger's own method is back after the fit.
    - #70 item 2: every rank computes lit_compute's metrics and meets in the logging all-reduce, rank 0 doing more of
      it; 0.2 s of metric computing landed there too, and on evenly loaded tensor-parallel ranks logging every step
      rank 0 was the slowest in most steps."""
    from lightning.pytorch.loggers import TensorBoardLogger

    cls, method = (TensorBoardLogger, "log_metrics") if slowed == "logger-write" else (StepTimeMonitor, "_contribute")
    clock = DrivenClock()
    original = getattr(cls, method)

    def slow(self, *args, **kwargs):
        clock.advance(seconds)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, slow)
    trainer = clocked_trainer(
        tmp_path,
        clock,
        max_steps=6,
        limit_train_batches=6,
        limit_val_batches=0,
        log_every_n_steps=1,
        callbacks=[StepTimeMonitor(log_every_n_steps=1, window=2)],
    )
    trainer.fit(TimedNet(clock, compute_s=0.05), train_dataloaders=DataLoader(TimedImages(clock, 0.0005), batch_size=4))
    acc = read_events(trainer.logger.log_dir)
    wait = _values(acc, "time/data_wait_ms")
    assert len(wait) >= 4
    assert all(v == pytest.approx(2.0) for v in wait.values())
    assert all(v == pytest.approx(52.0) for v in _values(acc, "time/step_ms").values())
    # each step's logging work is counted in the next one's instrument time
    instrument = sorted(_values(acc, "time/instrument_ms").values())
    assert len(instrument) >= 4
    assert all(v >= seconds * 1e3 - 1e-6 for v in instrument[1:])
    assert "log_metrics" not in vars(trainer.logger)
