"""FlopsLogger(peak="measure") uses one measured peak per machine, cached with its conditions (#29 item 7): MFU of
two runs on the same machine is against the same peak; peak="remeasure" measures again. A peak measured on a busy
machine is never cached, a cached peak a run beats is measured again, and MFU over 1 is never logged (#34 item 4)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch

from lit_compute import FlopsLogger
from lit_compute.flops.peaks import PeakPolicy
from lit_compute.hardware import measure
from lit_compute.hardware.measure import PeakMeasurement, measure_peak
from lit_compute.hardware.this_machine import cached_peak_flops, peak_key

from ..conftest import make_trainer, read_events, scalar_values, tiny_data, tiny_model


def _measurements(monkeypatch, *values):
    """measure_peak returns these (flops, quiet) in turn."""
    it = iter(values)
    monkeypatch.setattr(measure, "measure_peak", lambda device, dtype, **_: PeakMeasurement(*next(it), cpu_share=0.9))


def test_the_peak_is_measured_once_cached_with_its_conditions_and_remeasured_on_request(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_COMPUTE_CACHE", str(tmp_path))
    _measurements(monkeypatch, (2.0e11, True), (3.0e11, True), (4.0e11, True))
    first = cached_peak_flops("cpu", torch.float32)
    again = cached_peak_flops("cpu", torch.float32)
    assert (first.flops, first.cached) == (2.0e11, False)
    assert (again.flops, again.cached) == (2.0e11, True)  # a second run, a loaded machine: the same peak
    assert again.describe().startswith(f"cached from {first.measured_at} on ")
    assert f"{torch.get_num_threads()} threads" in again.describe()
    assert f"torch {torch.__version__}" in again.describe()
    bf16 = cached_peak_flops("cpu", torch.bfloat16)  # another dtype is another entry
    assert (bf16.flops, bf16.cached) == (3.0e11, False)
    redone = cached_peak_flops("cpu", torch.float32, remeasure=True)
    assert (redone.flops, redone.cached) == (4.0e11, False)
    entries = json.loads((tmp_path / "this_machine.json").read_text())["peaks"]
    assert sorted(e["flops"] for e in entries.values()) == [3.0e11, 4.0e11]
    assert all(
        {"measured_at", "load_average", "threads", "torch_version", "device"} <= set(e) for e in entries.values()
    )


def test_a_cpu_with_another_instruction_set_under_the_same_name_is_measured_again(tmp_path, monkeypatch):
    """One model name ("AMD EPYC") covers CPUs with AVX-512 and bf16 and AVX2-only ones (bf16 many times slower), and
    a cache folder can move between them: a peak cached on one is not the other's."""
    monkeypatch.setenv("LIT_COMPUTE_CACHE", str(tmp_path))
    _measurements(monkeypatch, (2.0e11, True), (7.0e10, True))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert cached_peak_flops("cpu", torch.float32).flops == 2.0e11
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    other = cached_peak_flops("cpu", torch.float32)
    assert (other.flops, other.cached) == (7.0e10, False)
    assert peak_key(torch.device("cpu"), torch.float32).startswith("cpu|")
    assert "|AVX2|" in peak_key(torch.device("cpu"), torch.float32)


def test_a_broken_cache_file_is_measured_over(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_COMPUTE_CACHE", str(tmp_path))
    (tmp_path / "this_machine.json").write_text("{not json")
    _measurements(monkeypatch, (5.0e11, True))
    peak = cached_peak_flops("cpu", torch.float32)
    assert (peak.flops, peak.cached) == (5.0e11, False)
    assert cached_peak_flops("cpu", torch.float32).cached


def test_a_busy_measurement_serves_its_run_only_and_a_run_that_beats_the_cache_replaces_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_COMPUTE_CACHE", str(tmp_path))
    _measurements(monkeypatch, (4.6e10, False), (1.6e11, True), (9.0e10, False), (1.7e11, False))
    busy = cached_peak_flops("cpu", torch.float32)
    assert (busy.flops, busy.quiet) == (4.6e10, False)
    assert "busy" in busy.describe()
    assert not (tmp_path / "this_machine.json").exists()  # nothing cached
    quiet = cached_peak_flops("cpu", torch.float32)
    assert quiet.quiet
    assert cached_peak_flops("cpu", torch.float32).flops == 1.6e11
    # the cached value is above what the run achieved: served from the cache, nothing measured
    assert cached_peak_flops("cpu", torch.float32, at_least=1.0e11).cached
    # a run beat it: measured again; a busy measurement below the cache changes nothing
    assert cached_peak_flops("cpu", torch.float32, at_least=1.65e11).flops == 9.0e10
    assert cached_peak_flops("cpu", torch.float32).flops == 1.6e11
    # a busy measurement above it proves the cached value wrong: removed
    assert cached_peak_flops("cpu", torch.float32, at_least=1.65e11).flops == 1.7e11
    assert json.loads((tmp_path / "this_machine.json").read_text())["peaks"] == {}


@pytest.mark.timeout(120)
def test_a_peak_measured_beside_cpu_burners_is_not_cached(tmp_path, monkeypatch):
    """The reproduction: a peak measured while other processes load every core is a lower bound (46 against 165
    GFLOP/s here) and was cached, serving every later run: a quiet run logged MFU 1.157."""
    monkeypatch.setenv("LIT_COMPUTE_CACHE", str(tmp_path))
    # two burners a core, whatever torch's thread count (the suite runs one thread a process)
    cores = max(os.cpu_count() or 1, torch.get_num_threads())
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * cores)]
    try:
        measured = measure_peak("cpu", torch.float32, size=512, seconds=0.6)
        peak = cached_peak_flops("cpu", torch.float32)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert not measured.quiet
    assert measured.cpu_share < measure.QUIET_CPU_SHARE
    assert not peak.quiet
    assert "the machine was busy" in peak.describe()
    assert not (tmp_path / "this_machine.json").exists()


def test_mfu_over_one_is_never_logged_and_a_measured_peak_is_measured_again(tmp_path, monkeypatch):
    """A cached peak measured under load (1 MFLOP/s: any run, on any machine however busy, beats it): the first
    logging step finds the run beating it, measures again (a quiet 1 PFLOP/s here), replaces the cache, and logs MFU
    against the new peak only."""
    monkeypatch.setenv("LIT_COMPUTE_CACHE", str(tmp_path))
    key = peak_key(torch.device("cpu"), torch.float32)
    (tmp_path / "this_machine.json").write_text(
        json.dumps(
            {
                "peaks": {
                    key: {
                        "flops": 1e6,
                        "device": "cpu",
                        "dtype": "float32",
                        "threads": torch.get_num_threads(),
                        "torch_version": torch.__version__,
                        "measured_at": "2026-12-01 10:00",
                        "load_average": 4.0,
                    }
                }
            }
        )
    )
    _measurements(monkeypatch, (1e15, True))
    trainer = make_trainer(
        tmp_path, max_steps=4, limit_train_batches=4, callbacks=[FlopsLogger(peak="measure", log_every_n_steps=1)]
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(tiny_model(), datamodule=tiny_data())
    said = [str(w.message) for w in caught if "that peak was wrong" in str(w.message)]
    assert len(said) == 1
    assert "the peak of 1 MFLOP/s (cached from 2026-12-01 10:00" in said[0]
    assert "Measured again: 1,000 TFLOP/s (measured " in said[0]
    acc = read_events(trainer.logger.log_dir)
    mfu = scalar_values(acc, "compute/mfu")
    assert mfu
    assert all(0 < v <= 1 for _, v in mfu)
    assert {v for _, v in scalar_values(acc, "compute/peak_tflops")} == {1000.0}
    assert json.loads((tmp_path / "this_machine.json").read_text())["peaks"][key]["flops"] == 1e15


def test_a_given_peak_below_what_the_device_achieves_logs_no_mfu_and_says_so(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=3, callbacks=[FlopsLogger(peak_flops=1e6, log_every_n_steps=1)])
    with pytest.warns(UserWarning, match=r"MFU would be over 100%.*peak_flops=\.\.\.\) to the device's real peak"):
        trainer.fit(tiny_model(), datamodule=tiny_data())
    tags = read_events(trainer.logger.log_dir).Tags()["scalars"]
    assert "compute/tflops_per_sec" in tags
    assert "compute/mfu" not in tags
    assert "compute/hfu" not in tags


def test_the_policy_computes_mfu_and_hfu_in_one_place():
    policy = PeakPolicy(peak_flops=2e12)
    policy.resolve(torch.device("cpu"), torch.float32)
    metrics, warning = policy.utilisation(tflops=1.0, hw_tflops=1.5, devices=2)
    assert warning is None
    assert metrics == {"compute/peak_tflops": 2.0, "compute/mfu": 0.25, "compute/hfu": 0.375}
    assert policy.utilisation(tflops=math.nan, hw_tflops=1.0, devices=2) == ({}, None)
    metrics, warning = policy.utilisation(tflops=3.0, hw_tflops=5.0, devices=2)  # HFU 1.25: nothing logged
    assert metrics == {}
    assert "1.250x the peak of 2 TFLOP/s (given as FlopsLogger(peak_flops=...))" in warning


def test_a_dtype_the_cpu_runs_slowly_is_timed_on_a_smaller_product(monkeypatch):
    """bfloat16 on a CPU without AVX512-BF16/AMX runs a 2048-wide product in minutes: the side shrinks so that one
    product takes about a round (the clock is driven: each reading one tick later)."""
    peaks_module = measure

    def clock(tick: float):
        now = iter(i * tick for i in range(10**6))
        return lambda: next(now)

    monkeypatch.setattr(peaks_module.time, "perf_counter", clock(1e-5))  # a fast 256-wide product: keep 2048
    assert peaks_module._affordable_side(2048, torch.float32, per_round=0.3) == 2048
    monkeypatch.setattr(peaks_module.time, "perf_counter", clock(0.05))  # 0.05 s for 256: 2048 would take 26 s
    side = peaks_module._affordable_side(2048, torch.float32, per_round=0.3)
    assert 256 <= side < 2048
    assert side % 64 == 0
    assert 0.05 * (side / 256) ** 3 <= 0.3 * 1.5  # about one round


def test_a_product_whose_time_grows_faster_than_the_cube_is_not_extrapolated(monkeypatch):
    """bfloat16 under AVX2: 11 ms for 256, 0.1 s for 512, 2.3 s for 1024 (the cube would say 0.8 s): each side is
    timed itself, so rounds of 0.3 s and of 1 s keep 512 (1024 took longer than a round), never a 2048 product."""
    seconds = {256: 0.011, 512: 0.106, 1024: 2.25, 2048: 47.0}
    now = [0.0]

    def mm(a, b):
        now[0] += seconds[a.shape[0]]
        return a

    monkeypatch.setattr(measure.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(measure.torch, "mm", mm)
    assert measure._affordable_side(2048, torch.bfloat16, per_round=0.3) == 512
    assert measure._affordable_side(2048, torch.bfloat16, per_round=1.0) == 512
    assert measure._affordable_side(2048, torch.bfloat16, per_round=20.0) == 1024
    assert measure._affordable_side(2048, torch.bfloat16, per_round=60.0) == 2048


def test_float32_peaks_are_weighed_by_each_tf32_switch_and_asked_once_per_setting(monkeypatch):
    """cuDNN's TF32 switch (convolutions) and the matmuls' are separate: the float32 peak makes the time add up,
    each op class at its switch's peak, and a setting both share is measured once."""
    from lit_compute.flops import peaks as peaks_module

    asked = []

    def peak_of(tf32: bool) -> float:
        asked.append(tf32)
        return 400.0 if tf32 else 50.0

    by_op = {"aten.convolution": 300, "aten.mm": 100}
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:  # torch's switches are not plain attributes: set and restored by hand
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False
        assert peaks_module.weigh_tf32_switches(by_op, peak_of) == pytest.approx(400 / (300 / 400 + 100 / 50))
        assert sorted(asked) == [False, True]
        asked.clear()
        torch.backends.cudnn.allow_tf32 = False
        assert peaks_module.weigh_tf32_switches(by_op, peak_of) == pytest.approx(50.0)
        assert asked == [False]
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
