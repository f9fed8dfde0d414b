"""``lit-compute whatif``: the pricing of a run's step on other hardware (pure, on made-up run facts), and the
command on a real run folder (bad input in one line)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from lit_compute.hardware.chips import (
    CHIPS,
    LINKS,
    Chip,
    HardwareError,
    ThisMachine,
    find_chip,
    find_link,
    load_hardware_file,
)
from lit_compute.planning.whatif import (
    Calibration,
    RunFacts,
    Scenario,
    WhatifError,
    calibrate,
    default_calibration,
    predict,
    read_run,
    with_loader_cost,
)
from lit_compute.planning.whatif_cli import main

from ..conftest import make_trainer, tiny_data, tiny_model

G = 1e9
UNIT = Calibration(1.0, 1.0, 1.0, 0.0, 1.0, "test")
CHIP = Chip("made-up", {"float32": 100 * G, "bfloat16": 400 * G}, 10 * G, 32 * G, "pcie4", "test")


def _run(**kwargs) -> RunFacts:
    facts = {
        "path": Path("run"),
        "by_class": {"matmul": (100 * G, 1 * G, 0), "elementwise": (0, 5 * G, 0), "optimizer": (0, 2 * G, 0)},
        "samples": 16,
        "model_flops": 100 * G,
        "trainable": 10_000_000,
        "precision": "32-true",
        "step_s": 3.0,
        "wait_s": 0.0,
        "loader_workers": 2,
    }
    facts.update(kwargs)
    return RunFacts(**facts)


def test_a_step_is_priced_class_by_class_on_the_roofline():
    # matmul: max(100 GFLOP / 100 GFLOP/s, 1 GB / 10 GB/s) = 1 s; elementwise 0.5 s; optimizer 0.2 s
    p = predict(_run(), Scenario(CHIP, "32-true", 16), UNIT)
    assert p.compute_s == pytest.approx(1.7)
    assert p.step_time_s == pytest.approx(1.7)
    assert p.samples_per_s == pytest.approx(16 / 1.7)
    assert p.bottleneck == "compute"
    assert p.mfu == pytest.approx(100 / 1.7 / 100)
    # twice the micro-batch: everything doubles but the optimizer's step and the matmul's weight traffic
    two = predict(_run(), Scenario(CHIP, "32-true", 32), UNIT)
    weights = 3 * 10_000_000 * 4
    assert two.compute_s == pytest.approx(2.0 + 1.0 + 0.2)
    assert two.compute_s > 0
    assert (weights + (1 * G - weights) * 2) / (10 * G) < 2.0  # the matmul stays compute-bound
    # bf16-mixed on a GPU: the matmuls at the bf16 peak, activations 2 bytes a value plus autocast's casts of every
    # weight (12 bytes a parameter over forward and backward); the optimizer still float32
    mixed = predict(_run(), Scenario(CHIP, "bf16-mixed", 16), UNIT)
    assert mixed.compute_s == pytest.approx(0.25 + (2.5e9 + 12 * 10_000_000) / 10e9 + 0.2)
    # on a CPU autocast keeps the norms in float32: the elementwise ops around them stay float32
    cpu = Chip("made-up-cpu", CHIP.peaks, CHIP.bandwidth, CHIP.memory, "pcie4", "test", kind="cpu")
    assert predict(_run(), Scenario(cpu, "bf16-mixed", 16), UNIT).compute_s == pytest.approx(
        0.25 + (5e9 + 12 * 10_000_000) / 10e9 + 0.2
    )
    assert mixed.bottleneck == "memory bandwidth"


def test_a_cpu_convolution_net_at_another_micro_batch_says_which_way_it_leans():
    """On a CPU a ResNet's forward and backward at twice the micro-batch take about 1.7 times as long while the FLOPs
    double (docs/figures/whatif_cpu_scaling.md): where this CPU's convolution set-up was not measured (a chip
    without ``conv_setup``), the prediction says which way it leans, for convolutions on a CPU at another micro-batch
    only."""
    cpu = Chip("made-up-cpu", CHIP.peaks, CHIP.bandwidth, CHIP.memory, "pcie4", "test", kind="cpu")
    convs = _run(by_class={"conv": (100 * G, 1 * G, 10), "optimizer": (0, 2 * G, 0)})

    def note(run, chip, micro):
        return [n for n in predict(run, Scenario(chip, "32-true", micro), UNIT).notes if "convolution's time" in n]

    assert "micro-batch 32 against the run's 16 leans slow (an upper bound)" in note(convs, cpu, 32)[0]
    assert "leans fast (a lower bound)" in note(convs, cpu, 8)[0]
    assert note(convs, cpu, 16) == []
    assert note(convs, CHIP, 32) == []
    assert note(_run(), cpu, 32) == []


def test_a_cpu_sets_up_its_convolutions_whatever_the_micro_batch():
    """On a CPU oneDNN reorders every convolution's weight each call: a cost per weight byte that does not grow with
    the batch, measured on this CPU per dtype. It is taken out of the run's measured step before calibrating (the run
    comes back as measured) and added at any micro-batch; bf16 moves half the bytes at its own rate; an accelerator,
    a chip without the measurement and a net without convolutions pay none; the note gives the figures."""
    rates = {"float32": 1e-9, "bfloat16": 3e-9}
    cpu = ThisMachine(
        "this",
        CHIP.peaks,
        CHIP.bandwidth,
        CHIP.memory,
        "loopback",
        "test",
        kind="cpu",
        conv_setup=rates,
    )
    convs = _run(by_class={"conv": (100 * G, 0, 0), "optimizer": (0, 2 * G, 0)}, conv_weights=0.2 * G, step_s=2.2)
    cal = calibrate(convs, cpu)
    assert cal.tensor == pytest.approx(1.2 / (2.2 - 0.2))  # 1 s of convolutions + 0.2 s of optimizer in 2.0 s
    assert predict(convs, Scenario(cpu, "32-true", 16), cal).step_time_s == pytest.approx(2.2)
    double = predict(convs, Scenario(cpu, "32-true", 32), cal)
    assert double.step_time_s == pytest.approx(0.2 + (2.0 + 0.2) / cal.tensor)  # only the convolutions' FLOPs double
    assert any(
        "200 ms of the step sets up the convolutions whatever the micro-batch" in n
        and "200 MB of weights a batch at 1 ns a byte" in n
        for n in double.notes
    )
    assert not any("leans" in n for n in double.notes)  # the term, not a warning about its absence
    mixed = predict(convs, Scenario(cpu, "bf16-mixed", 16), UNIT)
    plain = predict(dataclasses.replace(convs, conv_weights=0.0), Scenario(cpu, "bf16-mixed", 16), UNIT)
    assert mixed.compute_s - plain.compute_s == pytest.approx(3e-9 * 0.1 * G)  # 2-byte weights at bf16's rate
    accumulated = predict(dataclasses.replace(convs, accumulate=2), Scenario(cpu, "32-true", 16), UNIT)
    assert accumulated.compute_s == pytest.approx(2 * (1.0 + 0.2) + 0.2)  # once a micro-batch
    for chip in (CHIP, ThisMachine(**{f.name: getattr(cpu, f.name) for f in dataclasses.fields(Chip)})):
        p = predict(convs, Scenario(chip, "32-true", 32), UNIT)
        assert not any("sets up the convolutions" in n for n in p.notes)
    assert predict(
        dataclasses.replace(convs, by_class={"matmul": (100 * G, 0, 0)}, conv_weights=0.0),
        Scenario(cpu, "32-true", 32),
        UNIT,
    ).compute_s == pytest.approx(2.0)


def test_a_set_up_not_less_than_the_runs_compute_stays_in_the_one_factor():
    """Where this CPU's measured set-up is not less than the run's measured compute (a noisy measurement, a tiny
    net), calibration cannot take it out: the one factor holds it, the calibration says so, and predictions do not
    add it a second time (they say which way they lean instead)."""
    cpu = ThisMachine(
        "this",
        CHIP.peaks,
        CHIP.bandwidth,
        CHIP.memory,
        "loopback",
        "test",
        kind="cpu",
        conv_setup={"float32": 1.2e-8},
    )  # 2.4 s of set-up, a 2.2 s step
    convs = _run(by_class={"conv": (100 * G, 0, 0), "optimizer": (0, 2 * G, 0)}, conv_weights=0.2 * G, step_s=2.2)
    cal = calibrate(convs, cpu)
    assert not cal.conv_setup
    assert cal.tensor == pytest.approx(1.2 / 2.2)
    assert (
        "the convolutions' set-up measured on this CPU, 2,400 ms, is not less than the run's measured compute, 2,200 ms"
        in cal.source
    )
    same = predict(convs, Scenario(cpu, "32-true", 16), cal)
    assert same.step_time_s == pytest.approx(2.2)  # the run comes back as measured, the set-up not added twice
    double = predict(convs, Scenario(cpu, "32-true", 32), cal)
    assert not any("sets up the convolutions" in n for n in double.notes)
    assert any("leans slow (an upper bound)" in n for n in double.notes)


def test_a_record_without_the_convolutions_weights_reads_a_third_of_the_channels_first_ones():
    from lit_compute.planning.whatif.facts import _conv_weights

    assert _conv_weights({"conv_weights": 120}) == 120.0
    assert _conv_weights({"channels_first_conv": [10, 300, 6]}) == 100.0  # forward, data and weight gradients
    assert _conv_weights({}) == 0.0


def test_the_convolutions_set_up_is_the_intercept_at_two_batches_on_a_driven_clock(monkeypatch):
    """Each shape costs 2 ns a weight byte plus 1 ms a sample on a driven clock: the measurement finds the 2 ns and
    none of the per-sample time."""
    import time

    import torch

    from lit_compute.hardware import measure

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def forward(self, x):
        clock[0] += 2e-9 * self.weight.numel() * self.weight.element_size() + 1e-3 * x.shape[0]
        return torch.nn.functional.conv2d(x, self.weight, self.bias, padding=self.padding)

    monkeypatch.setattr(torch.nn.Conv2d, "forward", forward)
    monkeypatch.setattr(measure, "CONV_SETUP_SHAPES", ((8, 16, 3), (16, 8, 1)))
    found = measure.measure_conv_setup(repeats=3, rounds=2)
    assert found.seconds_per_byte == pytest.approx(2e-9)


@pytest.mark.slow  # over five seconds in the fast tier (CONTRIBUTING: a test of more than a few seconds)
def test_the_convolutions_set_up_is_measured_in_a_fresh_process_and_cached(tmp_path, monkeypatch):
    import torch

    from lit_compute.hardware import measure, this_machine

    monkeypatch.setattr(this_machine, "cache_path", lambda: tmp_path / "this_machine.json")
    fresh = this_machine.conv_setup_in_fresh_process(torch.float32)  # a real child process, this CPU measured
    assert fresh.seconds_per_byte > 0
    assert isinstance(fresh.quiet, bool)
    monkeypatch.setattr(
        this_machine,
        "conv_setup_in_fresh_process",
        lambda dtype, prelude="": measure.ConvSetup(4e-10 if dtype == torch.float32 else 9e-10, True),
    )
    chip = this_machine.with_conv_setup(
        ThisMachine(
            "this",
            CHIP.peaks,
            1.0,
            1.0,
            "loopback",
            "t",
            kind="cpu",
        )
    )
    assert chip.conv_setup == {"float32": 4e-10, "bfloat16": 9e-10}
    monkeypatch.setattr(
        this_machine, "conv_setup_in_fresh_process", lambda dtype, prelude="": pytest.fail("measured again")
    )
    assert this_machine.conv_setup_seconds(torch.bfloat16) == 9e-10
    assert this_machine.with_conv_setup(CHIP) is CHIP  # not this machine's CPU: as it is


def test_channels_first_convolutions_pay_their_transposes_on_a_gpu_at_16_bits_only():
    """A channels-first convolution on a GPU at 16 bits is transposed in and out by cuDNN (tensor cores convolve
    channels-last): each counted tensor is read and written once more, activations at the target's micro-batch,
    weights once, 2 bytes a value. Not on a CPU, not in float32; the note names ChannelsLast; the run's own chip
    calibrates with them, so its own step comes back."""
    cpu = Chip("made-up-cpu", CHIP.peaks, CHIP.bandwidth, CHIP.memory, "pcie4", "test", kind="cpu")
    plain = _run(by_class={"conv": (100 * G, 1 * G, 10), "optimizer": (0, 2 * G, 0)})
    first = dataclasses.replace(plain, channels_first=(4 * G, 0.4 * G, 30))
    base = predict(plain, Scenario(CHIP, "bf16-mixed", 32), UNIT)
    moved = 2 * (4 * G * 2 + 0.4 * G) / 2  # twice the micro-batch; 4-byte values counted, 2-byte ones priced
    priced = predict(first, Scenario(CHIP, "bf16-mixed", 32), UNIT)
    assert priced.compute_s == pytest.approx(base.compute_s + moved / (10 * G))
    assert "lit_compute.speedup.ChannelsLast" in priced.notes[0]
    assert f"{moved / 10 / G * 1e3:.3g} ms" in priced.notes[0]
    for scenario in (Scenario(CHIP, "32-true", 32), Scenario(cpu, "bf16-mixed", 32)):
        assert predict(first, scenario, UNIT).compute_s == pytest.approx(predict(plain, scenario, UNIT).compute_s)
    own = dataclasses.replace(first, precision="bf16-mixed", step_s=5.0)
    assert predict(own, Scenario(CHIP, "bf16-mixed", 16), calibrate(own, CHIP)).step_time_s == pytest.approx(5.0)


def test_a_note_of_some_rows_names_them_and_json_rows_carry_their_own():
    """With several targets the rows' notes differ (the host is the bottleneck against 3.6 ms here, 16.9 ms there):
    a note of some rows is printed after the rows it is about, one of every row once; ``--json`` rows carry theirs."""
    from lit_compute.planning.whatif_cli import row_notes

    link = find_link("25gbps")
    one = predict(_run(), Scenario(CHIP, "32-true", 16), UNIT)  # one device: no collectives
    four = predict(_run(), Scenario(CHIP, "32-true", 16, 4, 8, link), UNIT)
    shared = "a note of both rows"
    one.notes.append(shared)
    four.notes.append(shared)
    assert four.label == "made-up 4 x 8 over 25gbps"
    assert one.label == "made-up 1 x 1"
    overlap = next(n for n in four.notes if n.startswith("no overlap of collectives"))
    assert one.notes == [shared]
    assert four.notes == [overlap, shared]
    assert row_notes([one, four]) == [shared, f"made-up 4 x 8 over 25gbps: {overlap}"]
    assert four.as_json()["notes"] == four.notes


def _checked_file(tmp_path: Path, **changes) -> Path:
    from lit_compute.planning.whatif import DEFAULT_EFFICIENCY

    data = {
        "command": "lit-compute bench whatif --only gpu --errors x.json",
        "commit": "abc1234",
        "efficiencies": dict(DEFAULT_EFFICIENCY),
        "fitted_on": [["a100", "16-mixed"], ["a100", "tf32"]],
        "rows": [
            {"chip": "a100", "precision": "16-mixed", "model": "bert", "predicted": 110.0, "published": 100.0},
            {"chip": "a100", "precision": "tf32", "model": "resnet50", "predicted": 90.0, "published": 100.0},
            *[
                {"chip": "h100-sxm", "precision": p, "model": f"m{i}", "predicted": 100.0 + 10 * i, "published": 100.0}
                for i, p in enumerate(["16-mixed", "bf16-mixed"] * 3)
            ],
        ],
    }
    data.update(changes)
    path = tmp_path / "errors.json"
    path.write_text(json.dumps(data))
    return path


def test_a_prediction_at_the_default_efficiencies_quotes_their_errors_on_that_chip(tmp_path):
    """A target priced at the defaults quotes what they missed published results by on that chip at that precision
    (16 bits, TF32 or float32; fp16 and bf16 alike), from the file the bench wrote: each result when there are a few,
    the median and the ends when there are more; that they were fitted there when they were; that nothing checks them
    when nothing does. A file written at other efficiencies, or none, quotes nothing."""
    from lit_compute.planning.whatif import checked_on

    path = _checked_file(tmp_path)
    note = checked_on("a100", "bf16-mixed", path)
    assert note == (
        "at 16 bits, whatif's default efficiencies were fitted on this chip's published results; they "
        "missed 1 other(s) they were not fitted on by: bert +10.0% (+: predicted faster than published; "
        "lit-compute bench whatif at abc1234, docs/whatif.md)"
    )
    assert "resnet50 -10.0%" in checked_on("a100", "tf32", path)
    many = checked_on("h100-sxm", "16-mixed", path)
    assert many.startswith(
        "at 16 bits, whatif's default efficiencies missed 6 published result(s) of this chip they "
        "were not fitted on by: "
    )
    assert "median +25.0%, from +0.0% (m0) to +50.0% (m5)" in many
    assert checked_on("h100-sxm", "tf32", path).startswith(
        "at TF32, no published result checks whatif's default efficiencies on this chip"
    )
    assert "no published result" in checked_on("b200", "bf16-mixed", path)
    assert checked_on("a100", "32-true", path).startswith("at float32, no published result")
    stale = _checked_file(tmp_path, efficiencies={"tensor": 0.5})
    assert checked_on("a100", "bf16-mixed", stale) is None
    assert checked_on("a100", "bf16-mixed", tmp_path / "missing.json") is None


def test_whatif_rows_at_the_defaults_carry_the_note_and_the_runs_own_chip_does_not(monkeypatch, tmp_path):
    """The command's rows: a GPU priced at the defaults carries its checked errors; the run's own chip (calibrated on
    its measured step) and a CPU target do not."""
    from lit_compute.planning import whatif, whatif_cli

    path = _checked_file(tmp_path)
    monkeypatch.setattr(whatif_cli, "checked_on", lambda chip, precision: whatif.checked_on(chip, precision, path))
    run = _run(device="NVIDIA H100 80GB HBM3", chip="h100-sxm", step_s=0.5)
    cpu = Chip("made-up-cpu", CHIP.peaks, CHIP.bandwidth, CHIP.memory, "pcie4", "test", kind="cpu")
    rows = whatif_cli.sweep(run, [CHIPS["h100-sxm"], CHIPS["a100"], cpu], "bf16-mixed", 16, [1], 1, [], {})
    own, a100, on_cpu = ([n for n in r.notes if "published result" in n] for r in rows)
    assert not own
    assert not on_cpu
    assert any("calibrated on its measured step" in n for n in rows[0].notes)
    assert a100 == [whatif.checked_on("a100", "bf16-mixed", path)]
    # a row of the user's own under a table key (--hardware-file) is not what the published results checked
    mine = dataclasses.replace(CHIPS["a100"], peaks={"bfloat16": 900 * G, "float32": 90 * G})
    (row,) = whatif_cli.sweep(run, [mine], "bf16-mixed", 16, [1], 1, [], {})
    assert not [n for n in row.notes if "published result" in n]


def test_a_tensor_core_ops_sm_work_is_priced_at_the_chips_sms_and_clock(tmp_path):
    """A tensor-core op's FLOPs also pass through the SMs (addresses, loads, the epilogue), in series, at the
    calibration's ``sm`` times SMs x clock x 1,024: of two chips with one 16-bit peak, the one with fewer SMs (more
    tensor FLOP per SM and clock) is slower. Not in float32 (no tensor cores), not when ``sm`` is None (a run's own
    chip: its measured factor holds it), and a chip without SM figures runs them at half its 16-bit peak. A hardware
    file gives SMs and the clock together, or neither."""
    from lit_compute.planning.whatif import sm_rate

    run = _run(by_class={"matmul": (100 * G, 0.0, 0)}, trainable=0)  # no weights: no autocast casts to price
    few = dataclasses.replace(CHIP, sm_clock=100.0)  # 100 SM-GHz: 102.4 GFLOP/s at 1,024 a clock
    many = dataclasses.replace(CHIP, sm_clock=200.0)
    cal = dataclasses.replace(UNIT, sm=2.0)
    compute = {
        c.name + str(c.sm_clock): predict(run, Scenario(c, "bf16-mixed", 16), cal).compute_s for c in (few, many)
    }
    assert compute["made-up100.0"] == pytest.approx(100 * G / (400 * G) + 100 * G / (2.0 * 100 * 1e9 * 1024))
    assert compute["made-up200.0"] == pytest.approx(100 * G / (400 * G) + 100 * G / (2.0 * 200 * 1e9 * 1024))
    assert predict(run, Scenario(few, "32-true", 16), cal).compute_s == pytest.approx(1.0)  # 100 G at 100 G/s
    assert predict(run, Scenario(few, "bf16-mixed", 16), UNIT).compute_s == pytest.approx(0.25)
    assert sm_rate(CHIP) == 200 * G
    assert sm_rate(CHIPS["h100-sxm"]) == pytest.approx(132 * 1.83e9 * 1024)
    assert "132 SMs at 1.83 GHz" in CHIPS["h100-sxm"].sources["sm"]
    path = tmp_path / "hw.yaml"
    path.write_text(
        "chips:\n  mine:\n    peaks: {bfloat16: 4.0e14}\n    bandwidth: 1.0e12\n    memory: 8.0e10\n"
        "    sms: 100\n    boost_ghz: 1.5\n"
    )
    assert load_hardware_file(path)[0]["mine"].sm_clock == pytest.approx(150.0)
    path.write_text(
        "chips:\n  mine:\n    peaks: {bfloat16: 4.0e14}\n    bandwidth: 1.0e12\n    memory: 8.0e10\n    sms: 100\n"
    )
    with pytest.raises(HardwareError, match="mine: boost_ghz is None"):
        load_hardware_file(path)


def test_the_efficiency_on_the_runs_own_hardware_is_measured():
    run = _run(step_s=3.4, wait_s=0.0)  # the roofline says 1.7 s: the chip reaches half its peaks here
    cal = calibrate(run, CHIP)
    assert cal.tensor == pytest.approx(0.5)
    assert "50% of the peaks" in cal.source
    assert predict(run, Scenario(CHIP, "32-true", 16), cal).step_time_s == pytest.approx(3.4)
    with pytest.raises(WhatifError, match="StepTimeMonitor"):
        calibrate(_run(step_s=None), CHIP)


def test_an_input_bound_run_stays_input_bound_on_a_faster_chip():
    """A loader with workers that the run waited for: its rate is a ceiling no chip lifts."""
    run = _run(step_s=2.0, wait_s=1.5, loader_workers=1)  # 16 samples per 2 s: the loader feeds 8 samples/s
    p = predict(run, Scenario(find_chip("h100-sxm"), "bf16-mixed", 16), default_calibration())
    assert p.bottleneck == "input"
    assert p.samples_per_s == pytest.approx(8.0)
    serial = predict(
        _run(step_s=2.0, wait_s=1.5, loader_workers=0),
        Scenario(find_chip("h100-sxm"), "bf16-mixed", 32),
        default_calibration(),
    )
    # in the process, its loader not timed apart: the 1.5 s wait is priced per batch, and the GPU computes meanwhile
    assert serial.host_s == pytest.approx(1.5)
    assert serial.bottleneck == "input"
    assert serial.step_time_s == pytest.approx(1.5)
    assert serial.input_s == pytest.approx(1.5 - serial.compute_s)
    assert any("cost per sample is not known" in n for n in serial.notes)


@pytest.mark.parametrize("kind", ["per batch", "per sample"])
def test_an_in_process_loader_is_priced_per_batch_and_per_sample_as_timed(kind):
    """#50 item 1: a run at micro-batch 8 waited 30 ms per step: 10 ms of Lightning's fetch and 20 ms of its loader,
    which costs 20 ms a batch whatever its size (a file opened per batch) or 2.5 ms a sample (a decode). At micro-batch
    64 the first stays 30 ms, the second is 10 + 160 ms; on a GPU the host's work overlaps the device's, on a CPU
    they add."""
    from lit_compute.planning.loader_cost import LoaderCost

    loader = (
        LoaderCost(0.020, 0.0, (4, 8), (0.020, 0.020))
        if kind == "per batch"
        else LoaderCost(0.0, 0.0025, (4, 8), (0.010, 0.020))
    )
    run = _run(step_s=1.0, wait_s=0.030, samples=8, loader_workers=0, loader=loader)
    gpu = predict(run, Scenario(find_chip("h100-sxm"), "bf16-mixed", 64), default_calibration())
    expected = 0.030 if kind == "per batch" else 0.010 + 64 * 0.0025
    assert gpu.host_s == pytest.approx(expected)
    assert gpu.step_time_s == pytest.approx(max(gpu.compute_s, expected))  # overlapped
    cpu = predict(run, Scenario(dataclasses.replace(CHIP, kind="cpu"), "32-true", 64), UNIT)
    assert cpu.step_time_s == pytest.approx(cpu.compute_s + expected)
    assert cpu.input_s == pytest.approx(expected)
    assert not any("not known" in n for n in gpu.notes + cpu.notes)


def test_the_hosts_eager_dispatch_bounds_a_small_model_on_a_fast_gpu():
    """#50 item 2: every eager kernel costs the host its dispatch before the device runs it. 2,000 kernels at 20 us
    are 40 ms of host work a step: a small step on an H100 waits for it (bottleneck "host dispatch", the note says
    what would help); a large one hides it; a CPU target and the run's own chip never add it (its measured step
    holds it already)."""
    small = _run(
        by_class={"matmul": (1 * G, 0.01 * G, 1500), "elementwise": (0, 0.01 * G, 500)}, step_s=0.5, accumulate=2
    )
    h100 = find_chip("h100-sxm")
    free = predict(small, Scenario(h100, "32-true", 16), default_calibration())
    bound = predict(small, Scenario(h100, "32-true", 16, host_dispatch_s=20e-6), default_calibration())
    assert free.dispatch_s == 0
    assert free.bottleneck != "host dispatch"
    assert bound.dispatch_s == pytest.approx(2 * 2000 * 20e-6)  # every kernel of both accumulated batches
    assert bound.step_time_s == pytest.approx(bound.dispatch_s)
    assert bound.bottleneck == "host dispatch"
    assert any("4,000 eager kernels (20 us each)" in n and "torch.compile" in n for n in bound.notes)
    big = _run(by_class={"matmul": (100_000 * G, 1 * G, 2000)})
    hidden = predict(big, Scenario(h100, "32-true", 16, host_dispatch_s=20e-6), default_calibration())
    assert hidden.step_time_s == pytest.approx(hidden.compute_s)
    assert hidden.bottleneck == "compute"
    cpu = dataclasses.replace(CHIP, kind="cpu")
    assert predict(small, Scenario(cpu, "32-true", 16, host_dispatch_s=20e-6), UNIT).dispatch_s == 0
    own = dataclasses.replace(small, device="NVIDIA H100 80GB HBM3", chip="h100-sxm")
    assert predict(own, Scenario(h100, "32-true", 16, host_dispatch_s=20e-6), calibrate(own, h100)).dispatch_s == 0


def test_the_hosts_dispatch_cost_is_measured_on_this_cpu_and_cached(tmp_path, monkeypatch):
    """The probe counts the kernels of its step as FlopsLogger does and times the step; the value is cached with this
    CPU's measurements and read back without measuring again."""
    from lit_compute.hardware import measure, this_machine

    monkeypatch.setattr(this_machine, "cache_path", lambda: tmp_path / "this_machine.json")
    measured = measure.measure_dispatch(steps=3, rounds=1)
    assert measured.ops > 10
    assert measured.seconds > 0
    monkeypatch.setattr(measure, "measure_dispatch", lambda: dataclasses.replace(measured, seconds=7e-6, quiet=True))
    assert this_machine.host_dispatch_seconds() == 7e-6
    monkeypatch.setattr(measure, "measure_dispatch", lambda: pytest.fail("measured again"))
    assert this_machine.host_dispatch_seconds() == 7e-6


def test_a_loader_is_timed_apart_from_its_run_config_on_a_driven_clock(tmp_path, monkeypatch):
    """``loader_cost`` builds the run's own loader from the config.yaml that ``lit-compute fit`` leaves in the run
    folder and times it at two batch sizes; the dataset and collate advance a clock (2 ms a sample, 15 ms a batch)."""
    import yaml

    from lit_compute.planning import loader_cost as module
    from tests.planning import models

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    config = {
        "trainer": {"accelerator": "cpu", "max_steps": 2},
        "ckpt_path": None,  # fit's own key, left out
        "model": {"class_path": "tests.planning.models.WideAdamMLP", "init_args": {"width": 16}},
        "data": {
            "class_path": "tests.planning.models.ClockedData",
            "init_args": {"batch_size": 8, "per_sample_s": 0.002, "per_batch_s": 0.015},
        },
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cost = module.loader_cost(tmp_path, 8, clock=models.CLOCK.now)
    assert cost.sizes == (4, 8)
    assert cost.per_sample == pytest.approx(0.002)
    assert cost.per_batch == pytest.approx(0.015)
    # an odd batch: 7 batches of 9 (63 samples) against 16 of 4 (64 samples: the last batch holds one more)
    cost = module.loader_cost(tmp_path, 9, clock=models.CLOCK.now)
    assert cost.sizes == (4, 9)
    assert cost.per_sample == pytest.approx(0.002)
    assert cost.per_batch == pytest.approx(0.015)
    with pytest.raises(FileNotFoundError, match="has no config.yaml"):
        module.loader_cost(tmp_path / "elsewhere", 8)


def test_an_accumulated_step_runs_its_micro_batches_and_one_optimizer_step():
    # matmul 1 s and elementwise 0.5 s a micro-batch, four of them; the optimizer's 0.2 s once a step
    p = predict(_run(accumulate=4), Scenario(CHIP, "32-true", 16), UNIT)
    assert p.compute_s == pytest.approx(4 * 1.5 + 0.2)
    assert calibrate(_run(accumulate=4, step_s=6.2 / 0.5), CHIP).tensor == pytest.approx(0.5)


def test_a_loader_timed_once_is_kept_in_the_run_folder_and_read_back(tmp_path, monkeypatch):
    """Every whatif of a run prices the same input: the first times its loader (driven clock) and keeps the figures
    in the run folder, later ones read them; a changed config, another batch size or a damaged file is timed again,
    and a folder that cannot be written keeps nothing and says so."""
    import yaml

    from lit_compute.planning import loader_cost as module
    from tests.planning import models

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    config = {
        "trainer": {"accelerator": "cpu", "max_steps": 2},
        "model": {"class_path": "tests.planning.models.WideAdamMLP", "init_args": {"width": 16}},
        "data": {
            "class_path": "tests.planning.models.ClockedData",
            "init_args": {"batch_size": 8, "per_sample_s": 0.002, "per_batch_s": 0.015},
        },
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    timings, time_it = [], module.loader_cost

    def timer(run_dir, batch_size):
        timings.append(batch_size)
        return time_it(run_dir, batch_size, clock=models.CLOCK.now)

    run = _run(path=tmp_path, step_s=1.0, wait_s=0.05, samples=8, loader_workers=0)
    monkeypatch.setattr(module, "loader_cost", timer)  # what whatif calls, on the driven clock
    first = with_loader_cost(run)
    assert first.loader.per_batch == pytest.approx(0.015)
    assert first.loader.per_sample == pytest.approx(0.002)
    assert any(
        "timed apart on this CPU now: 15 ms a batch + 2 ms a sample" in n and "kept in" in n for n in first.notes
    )
    saved = json.loads((tmp_path / module.KEPT_FILE).read_text())
    assert saved["per_batch_s"] == pytest.approx(0.015)
    assert saved["key"]["batch_size"] == 8

    again, note = module.kept_loader_cost(tmp_path, 8, timer=lambda *a: pytest.fail("timed again"))
    assert again == first.loader
    assert "delete it to time again" in note
    assert timings == [8]

    module.kept_loader_cost(tmp_path, 4, timer=timer)  # another batch size
    config["data"]["init_args"]["per_sample_s"] = 0.004  # the user changed the run's config
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    changed, _ = module.kept_loader_cost(tmp_path, 8, timer=timer)
    assert changed.per_sample == pytest.approx(0.004)
    assert timings == [8, 4, 8]
    (tmp_path / module.KEPT_FILE).write_text("{not json")
    module.kept_loader_cost(tmp_path, 8, timer=timer)
    assert timings == [8, 4, 8, 8]

    (tmp_path / module.KEPT_FILE).unlink()
    import lit_compute.files as files

    monkeypatch.setattr(
        files, "write_whole", lambda *a: (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
    )
    _, note = module.kept_loader_cost(tmp_path, 8, timer=timer)
    assert "not kept" in note
    assert "Permission denied" in note
    assert not (tmp_path / module.KEPT_FILE).exists()


def test_a_run_config_whose_classes_do_not_import_here_is_named_with_the_fix(tmp_path):
    """The loader timing and the recount build the run's config again: a class path that does not import from here
    is one line naming it and where to run from, not the command line's exit code."""
    import yaml

    from lit_compute.planning.loader_cost import loader_cost

    config = {
        "trainer": {"accelerator": "cpu"},
        "model": {"class_path": "not_here_module.Net"},
        "data": {"class_path": "tests.planning.models.ClockedData"},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(
        ValueError,
        match=r"does not build here: .*not_here_module.*No module named 'not_here_module'.*"
        r"run lit-compute from the folder",
    ):
        loader_cost(tmp_path, 8)


def test_the_gradient_exchange_over_a_network_and_the_node_count_it_allows():
    run = _run(step_s=1.7, world_size=1)
    net = find_link("25gbps")
    one = predict(run, Scenario(CHIP, "32-true", 16, nodes=1, devices_per_node=1), UNIT)
    assert one.comm_s == 0.0
    four = predict(run, Scenario(CHIP, "32-true", 16, nodes=4, devices_per_node=1, network=net), UNIT)
    # DDP's ring all-reduce of 40 MB of gradients in buckets of 1 MiB, 25 MiB and the rest; no overlap
    buckets = [2**20, 25 * 2**20, 40e6 - 26 * 2**20]
    ring = sum(2 * 3 / 4 * b / net.bandwidth + 2 * 3 * net.latency for b in buckets)
    assert four.comm_s == pytest.approx(ring)
    assert four.network == "25gbps"
    assert "no overlap of collectives" in four.notes[0]
    overlapped = predict(_run(comm_overlap=0.75), Scenario(CHIP, "32-true", 16, 4, 1, net), UNIT)
    assert overlapped.comm_s == pytest.approx(ring / 4)
    fsdp = predict(
        _run(strategy="ModelParallelStrategy", data_parallel=2), Scenario(CHIP, "32-true", 16, 4, 1, net), UNIT
    )
    # FSDP2 with one unit: its parameters gathered twice, its gradients reduce-scattered once
    assert fsdp.comm_s == pytest.approx(3 / 4 * (2 * 40e6 + 40e6) / net.bandwidth + 9 * net.latency)


def test_memory_fit_follows_precision_sharding_and_micro_batch():
    parts = {"parameters": 4 * G, "gradients": 4 * G, "optimizer": 8 * G, "activations": 10 * G, "other": 2 * G}
    run = _run(memory=parts)
    same = predict(run, Scenario(CHIP, "32-true", 16), UNIT)
    assert same.peak_memory_bytes == pytest.approx(28 * G)
    assert same.fits
    bigger = predict(run, Scenario(CHIP, "32-true", 32), UNIT)
    assert bigger.peak_memory_bytes == pytest.approx(40 * G)
    assert not bigger.fits
    half = predict(run, Scenario(CHIP, "bf16-true", 16), UNIT)
    assert half.peak_memory_bytes == pytest.approx(8 * G + 6 * G)


def test_hardware_tables_cite_their_rows_and_bad_rows_are_named(tmp_path):
    for chip in CHIPS.values():
        assert chip.source, chip.name
        assert chip.bandwidth > 0, chip.name
        assert chip.peaks, chip.name
    assert all(link.source and link.bandwidth > 0 for link in LINKS.values())
    assert find_chip("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    with pytest.raises(HardwareError, match="--hardware 'h900' is not in the table; known: .*h100-sxm"):
        find_chip("h900")
    (tmp_path / "hw.yaml").write_text(
        "chips:\n  my-gpu:\n    peaks: {float32: 60e12}\n    bandwidth: fast\n    memory: 48e9\n"
    )
    with pytest.raises(HardwareError, match=r"hw.yaml: chips.my-gpu: bandwidth is 'fast', not a number"):
        load_hardware_file(tmp_path / "hw.yaml")
    (tmp_path / "hw.yaml").write_text(
        "chips:\n  my-gpu:\n    peaks: {float32: 60e12}\n    bandwidth: 2e12\n    memory: 48e9\n    link: warp\n"
    )
    with pytest.raises(HardwareError, match="chips.my-gpu: link 'warp' is not a known link"):
        load_hardware_file(tmp_path / "hw.yaml")
    (tmp_path / "hw.yaml").write_text(
        "chips:\n  my-gpu:\n    peaks: {float32: 60e12}\n    bandwidth: 2e12\n    memory: 48e9\n"
    )
    chips, _ = load_hardware_file(tmp_path / "hw.yaml")
    assert chips["my-gpu"].peak("float32") == 60e12


def test_the_command_on_a_real_run(tmp_path, capsys, monkeypatch):
    from lit_compute import FlopsLogger, MemoryMonitor, StepTimeMonitor
    from lit_compute.hardware import measure, this_machine

    trainer = make_trainer(
        tmp_path,
        max_steps=6,
        limit_train_batches=6,
        log_every_n_steps=2,
        callbacks=[FlopsLogger(peak="none"), StepTimeMonitor(log_every_n_steps=2), MemoryMonitor()],
    )
    trainer.fit(tiny_model(), datamodule=tiny_data(batch_size=6))  # 32 images: five batches of 6, then one of 2
    run_dir = trainer.logger.log_dir
    facts = read_run(run_dir)
    # the facts are the micro-batch's, not those of the last batch counted (the epoch's partial one)
    assert facts.samples == 6
    assert facts.step_s
    assert facts.loader_workers == 0
    assert facts.memory
    assert set(facts.by_class) >= {"matmul", "norm", "elementwise", "optimizer"}
    # every GEMM's shape kept: the convolutions' (forward, data and weight gradients) and the matmuls' FLOPs in full
    for kind in ("conv", "matmul"):
        ours = [k for k in facts.kernels if k.kind == kind]
        assert sum(k.flops for k in ours) == pytest.approx(facts.by_class[kind].flops)
    assert {k.scale for k in facts.kernels if k.kind == "conv"} == {"m", "k"}
    model = tiny_model()
    assert facts.conv_weights == sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    # on its own CPU at twice the micro-batch: the convolutions' set-up priced apart. This CPU's figures are given
    # here and below, where a run's own hardware is resolved before a bad argument is refused (measuring them is
    # tens of seconds on a CPU without bf16 instructions; the measurements have their own tests)
    here = ThisMachine(
        "this",
        {"float32": 50 * G, "bfloat16": 50 * G},
        10 * G,
        16 * G,
        "loopback",
        "test",
        kind="cpu",
    )
    monkeypatch.setattr(this_machine, "this_machine", lambda device=None: here)
    monkeypatch.setattr(this_machine, "cache_path", lambda: tmp_path / "this_machine.json")
    monkeypatch.setattr(
        this_machine, "conv_setup_in_fresh_process", lambda dtype, prelude="": measure.ConvSetup(1e-9, True)
    )
    assert main([run_dir, "--micro-batch", "12", "--json"]) == 0
    (own,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    weights = facts.conv_weights / 1e6
    assert own["hardware"] == "this"
    assert any(f"{weights:.3g} MB of weights a batch at 1 ns a byte" in n for n in own["notes"])
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices:\n  h100-sxm: 3.0\n")
    assert (
        main(
            [
                run_dir,
                "--hardware",
                "h100-sxm,a100",
                "--nodes",
                "1,4",
                "--devices-per-node",
                "8",
                "--network",
                "25gbps",
                "--prices",
                str(prices),
                "--json",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert [(r["hardware"], r["nodes"]) for r in rows] == [("h100-sxm", 1), ("h100-sxm", 4), ("a100", 1), ("a100", 4)]
    # on an H100 the host's eager dispatch of the tiny model's kernels (measured on this CPU, the note says so) is
    # beside its loading work: the step is at least the two together
    assert rows[0]["dispatch_s"] > 0
    assert rows[0]["step_time_s"] >= rows[0]["dispatch_s"] + rows[0]["host_s"]
    assert "us per eager kernel measured here (--host-dispatch-us for another host)" in captured.err
    assert main([run_dir, "--hardware", "h100-sxm", "--host-dispatch-us", "1000", "--json"]) == 0  # a slow host
    slow = json.loads(capsys.readouterr().out)
    assert slow["bottleneck"] == "host dispatch"
    assert slow["step_time_s"] == pytest.approx(slow["dispatch_s"] + slow["host_s"])
    assert main([run_dir, "--hardware", "h100-sxm", "--host-dispatch-us", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dispatch_s"] == 0
    assert set(rows[0]) >= {
        "hardware",
        "nodes",
        "network",
        "step_time_s",
        "samples_per_s",
        "tokens_per_s",
        "mfu",
        "bottleneck",
        "fits",
        "peak_memory_bytes",
        "cost",
    }
    assert rows[0]["cost"] > 0
    assert rows[2]["cost"] is None
    assert rows[0]["fits"] is True
    # bad input: one line each
    plain = make_trainer(tmp_path / "plain", max_steps=2, callbacks=[StepTimeMonitor(log_every_n_steps=1)])
    plain.fit(tiny_model(), datamodule=tiny_data())
    for args, phrase in (
        ([plain.logger.log_dir], "no counted op-class table (compute/op_classes): train with lit_compute.FlopsLogger"),
        ([run_dir, "--hardware", "h900"], "--hardware 'h900' is not in the table; known:"),
        ([run_dir, "--network", "carrier-pigeon"], "--network 'carrier-pigeon' is not in the table"),
        (
            [run_dir, "--precision", "fp8"],
            "--precision 'fp8' is not one whatif prices; give one of 32-true, 32, tf32, bf16-mixed",
        ),
        ([run_dir, "--precision", "banana"], "--precision 'banana' is not one whatif prices"),
        ([run_dir, "--hardware", ","], "--hardware ',' names no chip"),
        (
            [run_dir, "--hardware", "h100-sxm", "--host-dispatch-us", "-1"],
            "--host-dispatch-us -1.0: give the host's cost",
        ),
        ([run_dir, "--prices", str(tmp_path / "nope.yaml")], "--prices"),
        ([str(tmp_path / "missing")], "does not exist"),
    ):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert phrase in err, err
    prices.write_text("prices:\n  h100-sxm: cheap\n")
    assert main([run_dir, "--hardware", "h100-sxm", "--prices", str(prices)]) == 2
    assert "prices.h100-sxm is 'cheap'" in capsys.readouterr().err


def test_messages_follow_the_strategy_and_a_measured_curve_prices_each_size():
    from lit_compute.planning.whatif.parts.comm import _curve_busbw, messages

    ddp = messages(_run(trainable=20_000_000, ddp_bucket_cap_mb=25.0), Scenario(CHIP, "32-true", 16, 1, 2))
    assert ddp["allreduce"] == [2**20, 25 * 2**20, 25 * 2**20, 25 * 2**20, 80e6 - 76 * 2**20]  # a first bucket of 1 MiB
    fsdp = messages(
        _run(trainable=20_000_000, strategy="ModelParallelStrategy", data_parallel=2, fsdp_units=4),
        Scenario(CHIP, "bf16-mixed", 16, 1, 2),
    )
    assert fsdp == {"allgather": [20e6 / 4 * 2] * 8, "reducescatter": [80e6 / 4] * 4}
    curve = [(1e3, 1e7), (1e6, 1e9)]
    assert _curve_busbw(curve, 1e6) == pytest.approx(1e9)
    assert _curve_busbw(curve, 1e9) == pytest.approx(1e9)
    assert _curve_busbw(curve, 1e3 * 10**1.5) == pytest.approx(1e8)  # halfway in log-log
    assert _curve_busbw(curve, 100) == pytest.approx(1e6)  # below the smallest size the time holds (latency)
    run = _run(trainable=20_000_000, curves={"allreduce": curve})
    measured = predict(run, Scenario(CHIP, "32-true", 16, 1, 2), UNIT, measured_links=True)
    expected = sum(size * 2 * 1 / 2 / _curve_busbw(curve, size) for size in ddp["allreduce"])
    assert measured.comm_total_s == pytest.approx(expected)


def test_convolutions_and_matmuls_each_reach_their_own_fraction_of_the_peak():
    run = _run(by_class={"conv": (100 * G, 1 * G, 0), "matmul": (100 * G, 1 * G, 0)})
    cal = Calibration(0.5, 0.25, 1.0, 0.0, 1.0, "test", conv_tensor=0.2, conv_vector=1.0)
    # float32: matmuls at the vector fraction (100 GFLOP at 25 GFLOP/s), convolutions at their own (at 100)
    assert predict(run, Scenario(CHIP, "32-true", 16), cal).compute_s == pytest.approx(4.0 + 1.0)
    # bf16 on tensor cores: matmuls at half the 400 GFLOP/s peak, convolutions at a fifth; bytes stay below
    assert predict(run, Scenario(CHIP, "bf16-true", 16), cal).compute_s == pytest.approx(0.5 + 1.25)
    # the weights' traffic that does not grow with the batch is booked once, to the convolutions first
    two = predict(_run(by_class={"conv": (0, 1 * G, 0), "matmul": (0, 1 * G, 0)}), Scenario(CHIP, "32-true", 32), UNIT)
    weights = 3 * 10_000_000 * 4
    assert two.compute_s == pytest.approx((weights + (1 * G - weights) * 2 + 2 * G) / (10 * G))
    # without their own fractions (a calibration measured on the run) convolutions take the matmuls'
    assert Calibration(0.5, 0.25, 1.0, 0.0, 1.0, "t").efficiency("conv", True) == 0.5


def test_grouped_and_depthwise_convolutions_and_float32_attention_are_priced_by_their_shape():
    """#50 item 2: a depthwise convolution (no tensor cores, few FLOPs per byte) reaches a fraction of the vector
    peak and of the bandwidth, a grouped one a fraction of what dense convolutions reach; TF32 is its own fraction;
    attention in float32 runs on the vector units (flash attention takes half precision only)."""
    chip = Chip("made-up", {"float32": 100 * G, "tf32": 200 * G, "bfloat16": 400 * G}, 10 * G, 32 * G, "pcie4", "t")
    cal = Calibration(
        0.5,
        1.0,
        1.0,
        0.0,
        1.0,
        "t",
        conv_tensor=0.5,
        conv_vector=1.0,
        tf32=0.25,
        conv_tf32=0.1,
        grouped=0.5,
        depthwise=0.25,
    )

    def seconds(kind: str, flops: float, moved: float, precision: str) -> float:
        return predict(
            _run(by_class={kind: (flops, moved, 0)}, trainable=0), Scenario(chip, precision, 16), cal
        ).compute_s

    assert seconds("conv", 100 * G, 0, "bf16-true") == pytest.approx(0.5)  # 400 x 0.5
    assert seconds("conv_grouped", 100 * G, 0, "bf16-true") == pytest.approx(1.0)  # half of that
    assert seconds("conv_grouped", 100 * G, 0, "tf32") == pytest.approx(10.0)  # 200 x 0.1 x 0.5
    # depthwise: the vector peak (100) at a quarter, whatever the precision; its bytes at a quarter of the bandwidth
    assert seconds("conv_depthwise", 100 * G, 0, "bf16-true") == pytest.approx(4.0)
    assert seconds("conv_depthwise", 0, 1 * G, "32-true") == pytest.approx(0.4)
    assert seconds("matmul", 100 * G, 0, "tf32") == pytest.approx(2.0)  # 200 x 0.25
    assert seconds("attention", 100 * G, 0, "tf32") == pytest.approx(1.0)  # the vector units: 100 x 1.0
    assert seconds("attention", 100 * G, 0, "bf16-true") == pytest.approx(0.5)
    # a calibration measured on the run (one factor) prices every class alike
    unit = Calibration(0.5, 0.5, 1.0, 0.0, 1.0, "t")
    assert unit.efficiency("conv_grouped", True, True) == unit.efficiency("conv_depthwise", False) == 0.5


def test_collectives_on_a_cpu_overlapping_compute_share_its_cores():
    from lit_compute.planning.whatif import host_contention

    curve = [(1e3, 1e9), (1e9, 1e9)]
    run = _run(
        trainable=20_000_000,
        curves={"allreduce": curve},
        comm_overlap=0.5,
        cpu_cores=2,
        torch_threads=1,
        device="cpu",
        world_size=2,
    )
    this = Chip("this", CHIP.peaks, CHIP.bandwidth, CHIP.memory, "loopback", "test", kind="cpu")
    two_ranks = Scenario(this, "32-true", 16, 1, 2)
    # two ranks on two cores: one core each, shared by its compute thread and gloo's: twice as slow when overlapped
    assert host_contention(run, two_ranks) == 2.0
    idle = predict(
        _run(trainable=20_000_000, curves={"allreduce": curve}, comm_overlap=0.5), two_ranks, UNIT, measured_links=True
    )
    p = predict(run, two_ranks, UNIT, measured_links=True)
    assert p.comm_total_s == pytest.approx(idle.comm_total_s * 1.5)  # the overlapped half at twice its idle time
    assert any("share" in n for n in p.notes)
    # cores to spare, a GPU, or another CPU whose cores the run does not know: no contention
    assert host_contention(_run(cpu_cores=8, torch_threads=1, device="cpu"), two_ranks) == 1.0
    assert host_contention(run, Scenario(CHIP, "32-true", 16, 1, 2)) == 1.0


@pytest.mark.slow  # over five seconds in the fast tier (CONTRIBUTING: a test of more than a few seconds)
def test_an_op_class_with_its_own_measured_peak_runs_at_it():
    """This machine's bf16 kernels speed each heavy class up by their own factor (a CPU's bf16 attention backward can
    be slower than float32's): the class runs at its own peak, the others at the chip's."""
    from lit_compute.hardware.measure import measure_mixed_speedup

    chip = Chip(
        "this",
        {"float32": 100 * G, "bfloat16": 200 * G},
        1e6 * G,
        32 * G,
        "loopback",
        "test",
        kind="cpu",
        class_peaks={"attention": {"bfloat16": 50 * G}},
    )
    assert chip.peak_of("attention", "bfloat16") == 50 * G
    assert chip.peak_of("matmul", "bfloat16") == 200 * G
    assert chip.peak_of("attention", "float32") == 100 * G  # a dtype it has no own peak for: the chip's
    run = _run(by_class={"matmul": (100 * G, 0, 0), "attention": (100 * G, 0, 0)})
    assert predict(run, Scenario(chip, "bf16-true", 16), UNIT).compute_s == pytest.approx(0.5 + 2.0)
    speedups = measure_mixed_speedup(repeats=1, trials=1)
    assert set(speedups.ratios) == {"matmul", "conv", "attention"}
    assert all(v > 0 for v in speedups.ratios.values())


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.slow  # over five seconds in the fast tier (CONTRIBUTING: a test of more than a few seconds)
def test_the_mixed_speedup_stops_repeating_where_bf16_is_slow(monkeypatch):
    """On a CPU without bf16 instructions one bf16 block takes seconds: the measurement stops repeating a mode after
    a tenth of its time budget (two timed runs done) and starts no trial past the budget. The clock is driven: each
    reading is one second after the last."""
    import itertools
    import time

    from lit_compute.hardware.measure import measure_mixed_speedup

    ticks = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(ticks)))
    speedups = measure_mixed_speedup(repeats=10, trials=5, seconds=20)
    assert set(speedups.ratios) == {"matmul", "conv", "attention"}
    # one trial of 3 classes x 2 modes x 3 runs: about 50 readings; unbounded, 5 x 3 x 2 x 11 runs: over 660
    assert next(ticks) < 100


@pytest.mark.parametrize("chip", ["xeon-6248", "l4", "made-up-loopback"])
def test_more_nodes_never_scale_superlinearly_the_ring_runs_at_the_slowest_link(chip):
    """#47 item 4: a multi-node step priced the gradient exchange on the network only, though the chips' own link
    inside a node was slower: two nodes of 8 came out 2.7x one node."""
    target = (
        Chip("made-up-loopback", CHIP.peaks, CHIP.bandwidth, CHIP.memory, "loopback", "test", kind="cpu")
        if chip == "made-up-loopback"
        else CHIPS[chip]
    )
    run = _run(trainable=50_000_000, comm_overlap=0.0)
    one = predict(run, Scenario(target, "32-true", 16, 1, 8), default_calibration())
    two = predict(run, Scenario(target, "32-true", 16, 2, 8, find_link("400gbps")), default_calibration())
    assert two.samples_per_s <= 2 * one.samples_per_s * (1 + 1e-9)
    assert two.comm_total_s >= one.comm_total_s
    assert two.network == target.link  # named: the slower of the two


def test_a_config_is_priced_before_any_run_with_the_counts_a_real_run_logs(tmp_path, monkeypatch, capsys):
    """#50 item 6: ``whatif --config C`` counts the step on fake tensors (FlopsLogger's counter) and prices it, no CPU
    run first. Its op classes are what FlopsLogger logs on a real run of the same config; the loader is timed here."""
    import yaml

    from lit_compute._lightning_cli import LitComputeCLI
    from lit_compute.planning.config_facts import config_facts, with_counts_at

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": 4,
            "log_every_n_steps": 2,
            "enable_checkpointing": False,
        },
        "model": {"class_path": "tests.planning.models.WideAdamMLP", "init_args": {"width": 64}},
        "data": {"class_path": "tests.tuning.tune_models.RandomRegressionData", "init_args": {"batch_size": 8}},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    facts = config_facts(path)
    assert facts.samples == 8
    assert facts.device == "traced"
    assert facts.loader is not None
    assert facts.loader_workers == 0
    assert facts.memory
    assert facts.memory["optimizer"] > 0
    LitComputeCLI(
        args=[
            "fit",
            "--config",
            str(path),
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.callbacks+=lit_compute.FlopsLogger",
            "--trainer.callbacks.peak=none",
        ]
    )
    real = read_run(next((tmp_path / "lightning_logs").glob("version_*")))
    assert {k: v[0] for k, v in facts.by_class.items()} == {k: v[0] for k, v in real.by_class.items()}  # FLOPs
    assert facts.model_flops == real.model_flops
    # the run priced at bf16-mixed on a CPU: its own config.yaml counted again under CPU autocast, the casts included
    with_counts_at(real, "bf16-mixed")
    mixed = real.recounted["bf16-mixed"]
    assert mixed["matmul"][0] == pytest.approx(real.by_class["matmul"][0])  # the same matmuls
    assert mixed["elementwise"][2] > real.by_class["elementwise"][2]  # plus autocast's casts, counted
    (real.path / "config.yaml").unlink()
    bare = read_run(real.path)
    with_counts_at(bare, "bf16-mixed")
    assert not bare.recounted
    assert "has no config.yaml" in bare.notes[-1]
    capsys.readouterr()  # the fit's own output
    assert main(["--config", str(path), "--hardware", "h100-sxm,a100", "--micro-batch", "64", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["hardware"] for r in rows] == ["h100-sxm", "a100"]
    assert all(r["samples_per_s"] > 0 for r in rows)
    assert all(r["host_s"] > 0 for r in rows)  # the loader, timed here, at micro-batch 64
    for argv, phrase in (
        (["--config", str(path)], "a config has run nowhere yet: name the target with --hardware"),
        (
            [str(tmp_path), "--config", str(path)],
            "give a run folder (lit-compute whatif RUN) or a config (--config C), one of the two",
        ),
    ):
        assert main(argv) == 2
        assert phrase in capsys.readouterr().err


@pytest.mark.slow  # over five seconds in the fast tier (CONTRIBUTING: a test of more than a few seconds)
def test_a_config_with_channels_last_is_traced_channels_last_as_its_run_counts_it(tmp_path, monkeypatch):
    """``whatif --config`` and ``estimate`` trace the module as the run would train it: ``ChannelsLast`` lays the
    weights out at setup, so the traced step has no channels-first convolution to transpose on a GPU, as
    FlopsLogger's count of the run itself says; without it, the traced tensors are the run's."""
    import yaml

    from lit_compute._lightning_cli import LitComputeCLI
    from lit_compute.planning.config_facts import config_facts

    monkeypatch.chdir(tmp_path)
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": 1,
            "limit_val_batches": 0,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
        },
        "model": {
            "class_path": "lit_compute.models.ImageClassifier",
            "init_args": {"arch": "resnet18", "num_classes": 4},
        },
        "data": {
            "class_path": "lit_compute.data.TorchvisionImageDataModule",
            "init_args": {
                "batch_size": 4,
                "image_size": 32,
                "num_workers": 0,
                "synthetic_num_classes": 4,
                "synthetic_images_per_class": 2,
            },
        },
    }
    counted = {}
    for layout, callbacks in (("first", []), ("last", ["lit_compute.speedup.ChannelsLast"])):
        config["trainer"]["callbacks"] = [{"class_path": c} for c in callbacks]
        path = tmp_path / f"{layout}.yaml"
        path.write_text(yaml.safe_dump(config))
        traced = config_facts(path, time_the_loader=False).channels_first
        LitComputeCLI(
            args=[
                "fit",
                "--config",
                str(path),
                f"--trainer.default_root_dir={tmp_path / layout}",
                "--trainer.callbacks+=lit_compute.FlopsLogger",
                "--trainer.callbacks.peak=none",
            ]
        )
        real = read_run(next((tmp_path / layout / "lightning_logs").glob("version_*")))
        assert traced == real.channels_first
        counted[layout] = traced
    assert counted["first"][2] > 0
    assert counted["last"] == (0.0, 0.0, 0.0)


def test_tf32_asks_the_other_way_and_the_run_says_its_own(capsys):
    """#68 item 2 on the command line: a float32 run priced on an A100 follows the run's switches (a run recorded
    before they were kept: torch's defaults, matmuls in float32, and the note says so); ``--tf32 on`` puts its
    matmuls on TF32 tensor cores, ``--tf32 off`` keeps everything float32; any other word is refused."""
    run = str(Path(__file__).parent / "fixtures" / "run_0_3_0")  # an MLP: matmuls only
    common = ["--hardware", "a100", "--precision", "32-true", "--micro-batch", "1000000", "--host-dispatch-us", "0"]
    common.append("--json")  # at a micro-batch this large the matmuls, not the launches, weigh
    answers = {}
    for flag in (None, "on", "off"):
        assert main([run, *common, *(["--tf32", flag] if flag else [])]) == 0
        answers[flag] = json.loads(capsys.readouterr().out)
    assert answers[None]["compute_s"] == pytest.approx(answers["off"]["compute_s"])
    assert answers["on"]["compute_s"] < answers[None]["compute_s"]  # the matmuls on TF32; the elementwise work not
    assert any("torch's defaults: the run did not record its switches" in n for n in answers[None]["notes"])
    assert any("convolutions on TF32, matmuls on TF32 (as --tf32 asks)" in n for n in answers["on"]["notes"])
    with pytest.raises(SystemExit) as refused:
        main([run, *common, "--tf32", "maybe"])
    assert refused.value.code == 2
    assert "argument --tf32: invalid choice: 'maybe'" in capsys.readouterr().err
