"""The what-if package's parts, each priced on its own on made-up run facts (pure, no run folder), and the shape of
the package: records instead of positional triples, a short composition, small modules."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from lit_compute.hardware.chips import LINKS, Chip
from lit_compute.planning.whatif import ChannelsFirst, OpCost, RunFacts, Scenario, predict
from lit_compute.planning.whatif.calibration import Calibration
from lit_compute.planning.whatif.parts import comm, compute, host, memory
from lit_compute.planning.whatif.parts.part import Part

G = 1e9
UNIT = Calibration(1.0, 1.0, 1.0, 0.0, 1.0, "test")
CPU = Chip("made-up-cpu", {"float32": 100 * G}, 10 * G, 32 * G, "loopback", "test", kind="cpu")
GPU = Chip("made-up-gpu", {"float32": 100 * G, "bfloat16": 400 * G}, 10 * G, 32 * G, "pcie4", "test")
PACKAGE = Path(__file__).resolve().parents[2] / "lit_compute" / "planning" / "whatif"


def _run(**kwargs) -> RunFacts:
    facts = {
        "path": Path("run"),
        "by_class": {"matmul": (100 * G, 1 * G, 40), "elementwise": (0, 5 * G, 60), "optimizer": (0, 2 * G, 10)},
        "samples": 16,
        "model_flops": 100 * G,
        "trainable": 10_000_000,
        "step_s": 3.0,
        "wait_s": 0.0,
        "loader_workers": 2,
    }
    facts.update(kwargs)
    return RunFacts(**facts)


def test_run_facts_hold_records_whatever_sequences_they_were_given():
    run = _run(channels_first=[1.0, 2.0, 3.0], recounted={"bf16-mixed": {"matmul": [1, 2, 3]}})
    assert run.by_class["matmul"] == OpCost(100 * G, 1 * G, 40.0)
    assert run.by_class["matmul"].kernels == 40.0
    assert run.channels_first == ChannelsFirst(1.0, 2.0, 3.0)
    assert run.recounted["bf16-mixed"]["matmul"].bytes == 2.0
    assert OpCost.of([5, 6]) == OpCost(5.0, 6.0, 0.0)  # a record from before kernels were kept


def test_compute_is_the_roofline_of_every_class_with_a_launch_cost_per_kernel():
    cal = Calibration(1.0, 1.0, 1.0, 1e-3, 1.0, "test")
    part = compute.price(_run(), Scenario(CPU, "32-true", 16), cal)
    # matmul max(1 s, 0.1 s), elementwise 0.5 s, optimizer 0.2 s, and 110 kernels at 1 ms
    assert part.seconds == pytest.approx(1.0 + 0.5 + 0.2 + 0.110)
    assert part.bound_by == "compute"  # 1.04 s compute-bound against 0.77 s bandwidth-bound
    assert part.kernels == 110
    assert isinstance(part, Part)


def test_compute_notes_the_transposes_a_gpu_adds_at_16_bits_and_a_cpu_s_micro_batch_caveat():
    first = _run(channels_first=(4 * G, 0.4 * G, 30), by_class={"conv": (100 * G, 1 * G, 10)})
    on_gpu = compute.price(first, Scenario(GPU, "bf16-mixed", 16), UNIT)
    assert any("transposes channels-first" in note for note in on_gpu.notes)
    assert on_gpu.caveat is None
    assert not compute.price(first, Scenario(GPU, "32-true", 16), UNIT).notes  # float32: no transposes
    on_cpu = compute.price(first, Scenario(CPU, "32-true", 32), UNIT)
    assert on_cpu.caveat is not None
    assert "leans slow (an upper bound)" in on_cpu.caveat


def test_host_work_overlaps_an_accelerator_s_step_and_dispatch_is_priced_per_kernel():
    run = _run(loader_workers=0, wait_s=0.3, step_s=3.0)  # a loader in the process: 0.3 s a batch
    gpu = host.price(run, Scenario(GPU, "32-true", 16, host_dispatch_s=1e-3), UNIT)
    assert gpu.overlaps
    assert gpu.seconds == pytest.approx(0.3)
    assert gpu.kernels == 110
    assert gpu.dispatch_s == pytest.approx(0.110)
    assert gpu.bound_by == "input"  # 0.3 s of loading against 0.11 s of dispatch
    cpu = host.price(run, Scenario(CPU, "32-true", 16, host_dispatch_s=1e-3), UNIT)
    assert not cpu.overlaps
    assert cpu.dispatch_s == 0.0  # a CPU's dispatch is inside its measured compute


def test_host_part_says_the_host_is_the_bottleneck_with_its_figures():
    note = host.HostPart(0.002, "host dispatch", (), 0.010, 5000, True).bottleneck_note(0.004, 2e-6)
    assert note.startswith("the host is the bottleneck: 10 ms dispatching 5,000 eager kernels (2 us each)")
    assert "against 4 ms on the device" in note
    assert "fewer, larger kernels" in note


def test_comm_prices_ddp_s_all_reduce_over_the_slowest_link_less_the_overlap_the_run_measured():
    run = _run(comm_overlap=0.5)
    one = comm.price(run, Scenario(GPU, "32-true", 16), UNIT)
    assert one.seconds == 0.0  # one device: nothing to reduce
    two = comm.price(run, Scenario(GPU, "32-true", 16, devices_per_node=2), UNIT)
    assert two.link == LINKS["pcie4"].name
    assert two.total_s > 0
    assert two.seconds == pytest.approx(two.total_s / 2)
    assert not two.notes
    unmeasured = comm.price(_run(), Scenario(GPU, "32-true", 16, devices_per_node=2), UNIT)
    assert unmeasured.seconds == unmeasured.total_s
    assert unmeasured.notes[0].startswith("no overlap of collectives with compute assumed")


def test_memory_scales_the_run_s_parts_and_compares_them_with_the_chip_s_capacity():
    parts = {"parameters": 1 * G, "gradients": 1 * G, "optimizer": 2 * G, "activations": 10 * G, "other": 0.0}
    run = _run(memory=parts)
    same = memory.price(run, Scenario(GPU, "32-true", 16), UNIT)
    assert same.peak_bytes == 14 * G
    assert same.fits
    double = memory.price(run, Scenario(GPU, "32-true", 64), UNIT)
    assert double.peak_bytes == 44 * G  # four times the activations
    assert double.fits is False  # 32 GB
    assert memory.price(_run(), Scenario(GPU, "32-true", 16), UNIT).fits is None  # no parts measured


def test_predict_composes_the_parts_in_series_on_the_device_and_beside_the_host():
    run = _run(loader_workers=0, wait_s=5.0, step_s=8.0, comm_overlap=0.0)
    scenario = Scenario(GPU, "32-true", 16, devices_per_node=2)
    p = predict(run, scenario, UNIT)
    device = compute.price(run, scenario, UNIT).seconds + comm.price(run, scenario, UNIT).seconds
    assert p.step_time_s == max(device, 5.0)  # an accelerator hides the host's work behind the device's
    assert p.bottleneck == "input"
    assert p.notes[-1].startswith("the host is the bottleneck")


def test_predict_is_a_short_composition_and_no_module_of_the_package_is_long():
    assert len(inspect.getsource(predict).splitlines()) < 40
    for path in PACKAGE.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 450, path


def test_no_positional_cost_triple_is_annotated_in_the_package():
    """Costs travel as :class:`OpCost` (and a roofline as its named record), never as ``tuple[float, float, float]``."""
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and ast.unparse(node) == "tuple[float, float, float]":
                raise AssertionError(f"{path.name}:{node.lineno} annotates a positional triple")


def test_float32_on_an_ampere_or_newer_gpu_runs_as_the_runs_torch_switches_put_it():
    """#68 item 2: torch convolves float32 on TF32 tensor cores by default (cudnn.allow_tf32) and keeps matmuls in
    float32 (float32 matmul precision "highest"): a 32-true run priced on an A100 pays TF32 for its convolutions and
    float32 for its matmuls, as the run's own switches say, or as --tf32 asks; a chip without TF32 cores (a V100)
    prices float32 whatever the switches; a note says which and how to ask the other way."""
    from lit_compute.hardware.chips import find_chip
    from lit_compute.hardware.dtypes import Float32Math

    a100, v100 = find_chip("a100"), find_chip("v100-sxm")
    conv = _run(by_class={"conv": (1000 * G, 1 * G, 10)})
    matmul = _run(by_class={"matmul": (1000 * G, 1 * G, 10)})

    def seconds(run, chip, precision, math=None):
        return compute.price(run, Scenario(chip, precision, 16, float32_math=math), UNIT).seconds

    assert seconds(conv, a100, "32-true") == pytest.approx(seconds(conv, a100, "tf32"))  # torch's default
    assert seconds(conv, a100, "32-true") < seconds(conv, a100, "32-true", Float32Math(False, False)) / 4
    assert seconds(matmul, a100, "32-true") == pytest.approx(seconds(matmul, a100, "32-true", Float32Math(False)))
    assert seconds(matmul, a100, "32-true", Float32Math(True, True)) == pytest.approx(seconds(matmul, a100, "tf32"))
    # the run's own switches when --tf32 says nothing: FP32 matmul precision "high" in the run
    high = _run(by_class={"matmul": (1000 * G, 1 * G, 10)}, float32_math=Float32Math(True, True))
    assert seconds(high, a100, "32-true") == pytest.approx(seconds(matmul, a100, "tf32"))
    assert seconds(conv, v100, "32-true") == pytest.approx(seconds(conv, v100, "32-true", Float32Math(False, False)))
    assert seconds(conv, find_chip("a100"), "bf16-mixed") == pytest.approx(
        seconds(conv, a100, "bf16-mixed", Float32Math(False, False))
    )
    (note,) = compute.price(conv, Scenario(a100, "32-true", 16), UNIT).notes
    assert note == (
        "float32 on a100 (TF32 tensor cores): convolutions on TF32, matmuls in float32 (torch's defaults: the run "
        "did not record its switches); --tf32 on|off prices them the other way"
    )
    assert (
        "as --tf32 asks"
        in compute.price(conv, Scenario(a100, "32-true", 16, float32_math=Float32Math()), UNIT).notes[0]
    )
    assert not compute.price(conv, Scenario(v100, "32-true", 16), UNIT).notes
    # calibrating a float32 run on its own A100 uses the same switches: the factor is of the same roofline
    own = _run(by_class={"conv": (1000 * G, 1 * G, 10)}, device="NVIDIA A100-SXM4-80GB", chip="a100", step_s=1.0)
    cal = compute.calibrate(own, a100)
    assert compute.price(own, Scenario(a100, "32-true", 16), cal).seconds == pytest.approx(1.0)


def test_a_float32_runs_mfu_on_tf32_cores_is_against_the_tf32_peak():
    """The MFU of a float32 run whose convolutions run on TF32 tensor cores is against the TF32 peak (as FlopsLogger's
    MFU of such a run is): against the float32 peak an A100 ResNet-50 read over 100%."""
    from lit_compute.hardware.chips import find_chip
    from lit_compute.hardware.dtypes import Float32Math

    a100 = find_chip("a100")
    conv = _run(by_class={"conv": (1000 * G, 1 * G, 10)})
    on = predict(conv, Scenario(a100, "32-true", 16), UNIT)
    off = predict(conv, Scenario(a100, "32-true", 16, float32_math=Float32Math(False, False)), UNIT)
    flops_per_s = conv.model_flops / on.step_time_s
    assert on.mfu == pytest.approx(flops_per_s / a100.peak("tf32"))
    assert off.mfu == pytest.approx(conv.model_flops / off.step_time_s / a100.peak("float32"))
