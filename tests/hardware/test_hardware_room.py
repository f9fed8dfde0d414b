"""The hardware room (#46): one row per chip with a source per figure, one lookup for table keys and device names
(``estimate --device`` and ``whatif --hardware`` alike), "this machine" saying which device it describes, and one
answer to "is bf16 fast here?"."""

from __future__ import annotations

import math

import pytest
import torch

from lit_compute.hardware import chips as chips_module
from lit_compute.hardware import this_machine as this_module
from lit_compute.hardware.chips import CHIPS, MEMORY_TABLE, PEAK_TABLE, HardwareError, ThisMachine, find_chip
from lit_compute.planning.capacity import CapacityError, capacity_of


def test_every_chip_has_peaks_capacity_and_bandwidth_each_with_its_source():
    for name, chip in CHIPS.items():
        assert chip.name == name
        assert chip.peaks, name
        assert all(v > 0 for v in chip.peaks.values()), name
        assert math.isfinite(chip.memory), name
        assert chip.memory > 0, name
        assert chip.bandwidth > 0, name
        assert chip.link in chips_module.LINKS, name
        assert set(chip.sources) - {"sm"} == {"peaks", "memory", "bandwidth"}, name
        assert all(chip.sources.values()), name
        # SMs x clock: cited where given, and the tensor peak over it is a whole tensor rate per SM and clock (512,
        # 1,024, 2,048 or 4,096 dense FP16 FLOP: the whitepapers' figures), so the count and the clock agree with it
        assert ("sm" in chip.sources) == (chip.sm_clock is not None), name
        if chip.sm_clock:
            per_sm_clock = (chip.peak("bfloat16") or chip.peak("float16")) / (chip.sm_clock * 1e9)
            assert min(abs(per_sm_clock / rate - 1) for rate in (512, 1024, 2048, 4096)) < 0.01, (name, per_sm_clock)
    # the 0.3.0 tables are views of the one table: no chip without a memory row (v100s-pcie had none)
    assert "v100s-pcie" in MEMORY_TABLE
    assert PEAK_TABLE["h200-sxm"] == CHIPS["h200-sxm"].peaks
    assert set(PEAK_TABLE) <= set(CHIPS)
    assert set(MEMORY_TABLE) <= set(CHIPS)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("h200-sxm", "h200-sxm"),
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA L40S", "l40s"),
        ("Tesla V100S-PCIE-32GB", "v100s-pcie"),
        (" A10G ", "a10g"),
    ],
)
def test_estimate_and_whatif_accept_the_same_names(name, key):
    assert find_chip(name).name == key
    capacity, source = capacity_of(name, None)
    assert capacity == int(CHIPS[key].memory)
    assert source.startswith(f"{key}: ")


def test_an_unknown_device_is_named_with_the_option_that_gave_it():
    with pytest.raises(HardwareError, match=r"--hardware 'h900' is not in the table; known: .*h200-sxm"):
        find_chip("h900")
    with pytest.raises(CapacityError, match=r"--device 'h900' is not in the table; known: .*\(or give --memory 80GB\)"):
        capacity_of("h900", None)


def test_this_machine_on_a_cuda_device_is_its_table_row(monkeypatch):
    """``--hardware this`` on a GPU machine: the CUDA device's own row, so a run made there is priced against it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    chip = this_module.this_machine()
    assert chip.name == "h200-sxm"
    assert chip.peaks == CHIPS["h200-sxm"].peaks
    assert chip.device_name == "NVIDIA H200"
    assert isinstance(chip, ThisMachine)
    assert "this machine's NVIDIA H200: the table row h200-sxm" in chip.source


def test_this_machine_on_a_cpu_is_measured_once_and_cached_in_one_file(tmp_path, monkeypatch):
    """The CPU: its GEMM peak, bandwidth and bf16 speed-up per op class, measured once (quiet) into one cache file
    and read from it after; the tune and whatif get one answer about bf16 from it."""
    from lit_compute.hardware import measure

    monkeypatch.setenv("LIT_COMPUTE_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(
        measure, "measure_peak", lambda *a, **k: calls.append("peak") or measure.PeakMeasurement(1e11, True, 0.99)
    )
    monkeypatch.setattr(measure, "measure_bandwidth", lambda **k: calls.append("bandwidth") or 2e10)
    monkeypatch.setattr(
        measure,
        "measure_mixed_speedup",
        lambda: calls.append("mixed") or measure.MixedSpeedup({"matmul": 1.8, "conv": 2.0, "attention": 0.5}, True),
    )
    chip = this_module.this_machine("cpu")
    assert chip.name == "this"
    assert chip.kind == "cpu"
    assert chip.device_name == this_module.cpu_name()
    assert chip.peaks["float32"] == 1e11
    assert chip.peaks["bfloat16"] == pytest.approx(1e11 * math.sqrt(1.8 * 2.0))
    assert chip.peak_of("attention", "bfloat16") == pytest.approx(0.5e11)
    assert chip.bandwidth == 2e10
    assert sorted(calls) == ["bandwidth", "mixed", "peak"]
    assert [p.name for p in tmp_path.iterdir()] == ["this_machine.json"]
    calls.clear()
    again = this_module.this_machine("cpu")
    assert (again.peaks, again.bandwidth, again.class_peaks) == (chip.peaks, chip.bandwidth, chip.class_peaks)
    assert calls == []
    assert "cached from" in again.source
    fast, why = this_module.bf16_fast("cpu")
    assert fast
    assert "1.90x float32's speed" in why
    monkeypatch.setattr(
        measure,
        "measure_mixed_speedup",
        lambda: measure.MixedSpeedup({"matmul": 0.3, "conv": 0.2, "attention": 0.1}, True),
    )  # an AVX2-only CPU
    (tmp_path / "this_machine.json").unlink()
    assert this_module.bf16_fast("cpu")[0] is False


def test_the_tune_and_the_benches_ask_the_same_bf16_question(monkeypatch):
    import importlib

    from lit_compute.bench import _common

    tune = importlib.import_module("lit_compute.tuning.tune")
    monkeypatch.setattr(this_module, "bf16_fast", lambda device="cpu": (False, "bf16 autocast runs at 0.40x"))
    monkeypatch.setattr(
        this_module,
        "cached_peak_flops",
        lambda device, dtype, **_: this_module.MeasuredPeak(
            1e11, "cpu", str(dtype), 2, torch.__version__, "2026-12-04 10:00", None
        ),
    )
    monkeypatch.setattr(_common, "bf16_fast", this_module.bf16_fast)
    assert _common.low_precision("cpu") == "32-true"
    machine = tune.measure_machine("cpu")
    assert machine.bf16_fast is False
    assert "0.40x" in machine.note


def test_this_cpu_measured_while_busy_is_not_cached_and_gives_no_mfu(tmp_path, monkeypatch):
    """#47 item 6: ``whatif --hardware this`` on a busy CPU put a peak measured under load into MFU (1.021). The busy
    figures serve the one call, are never cached, and the prediction says why it gives no MFU."""
    from pathlib import Path

    from lit_compute.hardware import measure
    from lit_compute.planning.whatif import Calibration, RunFacts, Scenario, predict

    monkeypatch.setenv("LIT_COMPUTE_CACHE", str(tmp_path))
    monkeypatch.setattr(measure, "measure_peak", lambda *a, **k: measure.PeakMeasurement(2e10, False, 0.4))
    monkeypatch.setattr(measure, "measure_bandwidth", lambda **k: 1e10)
    monkeypatch.setattr(
        measure,
        "measure_mixed_speedup",
        lambda: measure.MixedSpeedup({"matmul": 1.1, "conv": 1.2, "attention": 0.4}, False),
    )
    chip = this_module.this_machine("cpu")
    assert "lower bounds" in (chip.busy or "")
    assert not (tmp_path / "this_machine.json").exists()
    run = RunFacts(
        path=Path("r"), by_class={"matmul": (1e10, 1e6, 0)}, samples=8, model_flops=1e10, step_s=0.25, wait_s=0.0
    )
    p = predict(run, Scenario(chip, "32-true", 8), Calibration(1.0, 1.0, 1.0, 0.0, 1.0, "t"))
    assert p.mfu is None
    assert any("MFU is not given" in n for n in p.notes)


def test_the_measurements_run_on_real_tensors_under_a_fake_tensor_mode_a_tracer_and_autocast():
    """A measurement called inside a traced step (fake tensors, a dispatch-mode tracer, autocast, no_grad) times real
    tensors: the tracer sees none of its ops (without that it timed fake ones: a bandwidth many times the real one)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from lit_compute._compat import fake_tensor_mode
    from lit_compute.hardware import measure

    class Seen(TorchDispatchMode):
        ops: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Seen.ops.append(func)
            return func(*args, **(kwargs or {}))

    with fake_tensor_mode(), Seen(), torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        bandwidth = measure.measure_bandwidth(megabytes=4, repeats=1)
        peak = measure.measure_peak("cpu", torch.float32, size=64, seconds=0.05, rounds=1)
    assert Seen.ops == []
    assert bandwidth > 0
    assert math.isfinite(bandwidth)
    assert peak.flops > 0
    assert math.isfinite(peak.flops)
