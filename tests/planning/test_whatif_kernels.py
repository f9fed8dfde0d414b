"""Per-kernel pricing on a GPU's SMs: the GEMM shapes a counted step keeps (matmuls, convolutions as implicit GEMMs,
each with the dimension that grows with the micro-batch), their tiles and waves, and a prediction that sees them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from lit_compute.flops.counting import SafeFlopCounterMode
from lit_compute.flops.kernel_shapes import GemmShape, KernelShape
from lit_compute.hardware.chips import Chip
from lit_compute.planning.whatif import RunFacts, Scenario, default_calibration, predict
from lit_compute.planning.whatif.parts.kernels import quantized, scaled_kernels

T = 1e12


def _count(net: torch.nn.Module, x: torch.Tensor):
    counter = SafeFlopCounterMode(display=False, depth=99, module_paths=net, hookless=True)
    with counter:
        net(x).sum().backward()
    return counter.result()


def _shapes(count, kind):
    return {(k.m, k.n, k.k, k.b, k.scale) for k in count.kernels if k.kind == kind}


def test_a_linear_layer_keeps_its_three_gemms_and_which_dimension_is_the_batch():
    net = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 16))
    count = _count(net, torch.randn(8, 32, requires_grad=True))
    shapes = _shapes(count, "matmul")
    assert (8, 48, 32, 1, "m") in shapes  # forward: rows are the batch
    assert (8, 32, 48, 1, "m") in shapes  # the input's gradient
    assert (48, 32, 8, 1, "k") in shapes  # the weight's gradient reduces over the batch
    assert sum(k.flops for k in count.kernels) == pytest.approx(count.by_class["matmul"][0])


def test_a_convolution_is_kept_as_cudnns_implicit_gemms():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, 32, 3, stride=2, padding=1))
    count = _count(net, torch.randn(2, 3, 8, 8))
    shapes = _shapes(count, "conv")
    assert (2 * 8 * 8, 16, 3 * 9, 1, "m") in shapes  # forward: output pixels x channels, over input channels x window
    assert (2 * 4 * 4, 32, 16 * 9, 1, "m") in shapes
    assert (2 * 8 * 8, 16, 32 * 9, 1, "m") in shapes  # the second convolution's input gradient
    assert (32, 16 * 9, 2 * 4 * 4, 1, "k") in shapes  # its weight gradient, over the batch's output pixels
    grouped = _count(torch.nn.Conv2d(8, 8, 3, groups=2), torch.randn(1, 8, 5, 5))
    assert (9, 4, 4 * 9, 2, "m") in _shapes(grouped, "conv_grouped")  # one GEMM per group
    assert sum(k.flops for k in count.kernels) == pytest.approx(count.by_class["conv"][0])


def test_one_tile_past_a_full_wave_costs_a_second_wave_unless_a_smaller_tile_or_a_split_saves_it():
    full = quantized(128 * 108, 128, 4096, 1, 108, "tensor")
    assert full == 128 * 108 * 128 * 4096  # 108 tiles of 128 x 128 on 108 SMs: one wave, no waste
    over = quantized(128 * 109, 128, 4096, 1, 108, "tensor")
    ideal = 128 * 109 * 128 * 4096
    assert ideal < over < 2 * full  # smaller tiles (run below the peak) beat a second wave of 128 x 128
    # a weight gradient of 64 x 64 outputs reduced over a long batch: one tile, the rest of the SMs fed by split-K
    # (16 parts, one wave: each SM a 64 x 64 tile at half its peak, 16 times shorter than unsplit)
    assert quantized(64, 64, 1 << 20, 1, 108, "tensor") == 108 * 64 * 64 * (1 << 16) * 2
    assert quantized(64, 64, 1 << 20, 1, 1, "tensor") == pytest.approx(64 * 64 * (1 << 20) * 2)  # tile at half rate


def test_the_batch_dimension_of_each_shape_scales_with_the_micro_batch():
    kernels = (
        KernelShape("matmul", 8, 48, 32, 1, "m", 1, 2 * 8 * 48 * 32, 0.0),
        KernelShape("matmul", 48, 32, 8, 1, "k", 1, 2 * 48 * 32 * 8, 0.0),
        KernelShape("attention", 128, 64, 256, 24, "b", 1, 2 * 128 * 64 * 256 * 24, 0.0),
    )
    works = scaled_kernels(kernels, "matmul", 4.0, 2.0, None, "tensor")
    assert [w.flops for w in works] == [4 * kernels[0].flops, 4 * kernels[1].flops]
    assert works[0].bytes == 2.0 * (32 * 32 + 32 * 48 + 32 * 48)  # m: 8 -> 32; operands and result in 16 bits
    assert works[1].bytes == 2.0 * (48 * 32 + 32 * 32 + 48 * 32)  # k: 8 -> 32
    attention = scaled_kernels(kernels, "attention", 0.5, 2.0, None, "tensor")[0]
    assert attention.bytes == 2.0 * 12 * (128 * 256 + 256 * 64 + 128 * 64)  # heads: 24 -> 12


def _facts(kernels: tuple[KernelShape, ...]) -> RunFacts:
    flops = sum(k.flops for k in kernels)
    return RunFacts(
        path=Path("run"),
        by_class={"matmul": (flops, 1e6, len(kernels))},
        samples=64,
        model_flops=flops,
        precision="bf16-mixed",
        device="traced",
        kernels=kernels,
    )


def test_a_gpu_with_an_sm_count_prices_each_gemms_waves_and_one_without_prices_the_class_whole():
    # 109 tiles of 128 x 128 (one past a wave on 108 SMs) against 108, a reduction too short to split, bandwidth to
    # spare: per FLOP the first is dearer on 108 SMs
    def gemm(rows: int) -> KernelShape:
        return KernelShape("matmul", rows, 128, 256, 1, "m", 1, 2.0 * rows * 128 * 256, 0.0)

    peaks = {"float32": 19.5 * T, "bfloat16": 312 * T}
    with_sms = Chip("made-up", peaks, 1e16, 8e10, "pcie4", "test", sm_clock=108 * 1.41, sms=108)
    whole = dataclasses.replace(with_sms, sms=None)
    cal = default_calibration()

    def seconds_per_flop(chip: Chip, rows: int) -> float:
        facts = _facts((gemm(rows),))
        return predict(facts, Scenario(chip, "bf16-mixed", 64), cal).compute_s / facts.model_flops

    assert seconds_per_flop(with_sms, 128 * 109) > 1.05 * seconds_per_flop(with_sms, 128 * 108)
    assert seconds_per_flop(whole, 128 * 109) == pytest.approx(seconds_per_flop(whole, 128 * 108), rel=1e-3)
    # a run counted before its kernels were kept is priced as a whole on any chip
    old = dataclasses.replace(_facts((gemm(128 * 109),)), kernels=())
    assert predict(old, Scenario(with_sms, "bf16-mixed", 64), cal).compute_s == pytest.approx(
        predict(_facts((gemm(128 * 109),)), Scenario(whole, "bf16-mixed", 64), cal).compute_s
    )


def test_a_shape_in_a_run_record_reads_back():
    shape = KernelShape("conv", 1, 2, 3, 4, "k", 5, 6.0, 7.0)
    assert KernelShape.of(list(shape)) == shape
    assert GemmShape(1, 2, 3, 4, "m").scale == "m"
