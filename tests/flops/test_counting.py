"""The counting engine against torchvision's published figures and analytic attention formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from torchvision.models import get_model_weights

from lit_compute.flops import count_flops

REFERENCE = ["resnet50", "vit_b_16", "swin_t", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny"]


def _published(name: str) -> tuple[nn.Module, int, float]:
    weights = get_model_weights(name).DEFAULT
    crop = weights.transforms().crop_size[0]
    kwargs = {"image_size": crop} if name.startswith("vit") else {}
    with torch.device("meta"):
        model = torchvision.models.get_model(name, weights=None, **kwargs)
    return model, crop, 2e9 * weights.meta["_ops"]


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", REFERENCE)
def test_forward_matches_torchvision_published_ops(name, mode):
    model, crop, published = _published(name)
    getattr(model, mode)()
    count = count_flops(model, torch.zeros(1, 3, crop, crop, device="meta"), backward=mode == "train")
    # within 1%, or within the rounding of the published three-decimal GMACs figure
    assert abs(count.forward - published) <= max(0.01 * published, 2 * 0.0005e9), (count.forward, published)
    assert count.complete


def test_headline_figures_and_backward_ratio():
    model = torchvision.models.resnet50().train()
    count = count_flops(model, torch.zeros(2, 3, 224, 224), count_on="meta")
    assert round(count.forward / 2 / 1e9, 2) == 8.18
    assert 2.9 < count.total / count.forward < 3.0  # the first conv has no input gradient
    vit = count_flops(torchvision.models.vit_b_16().eval(), torch.zeros(1, 3, 224, 224), backward=False)
    assert round(vit.forward / 1e9, 2) == 35.13


def test_depthwise_convolution_backward_is_not_overcounted():
    convs = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 8, 3, padding=1, groups=8))
    count = count_flops(convs, torch.randn(2, 8, 10, 10))
    one = 2 * 2 * 10 * 10 * 8 * 1 * 9
    assert count.forward == 2 * one
    # each gradient costs the forward's multiply-adds: the second conv has an input and a weight gradient,
    # the first only a weight gradient (its input needs none). torch alone counts 8x (the groups) more.
    assert count.backward == 3 * one


B, L, E, H = 2, 16, 32, 4
MHA_FLOPS = 2 * B * L * E * E * 4 + 2 * B * L * L * E * 2  # q, k, v, out projections + two attention matmuls


def test_sdpa_cpu_kernel_forward_and_backward():
    q = torch.randn(B, H, L, E // H, requires_grad=True)
    attn = 2 * (2 * B * H * L * L * (E // H))

    class Attn(nn.Module):
        def forward(self, x):
            return F.scaled_dot_product_attention(x, x, x)

    with FlopCounterMode(display=False) as plain:  # what torch alone sees on the CPU kernel
        F.scaled_dot_product_attention(q, q, q).sum().backward()
    assert plain.get_total_flops() == 0
    count = count_flops(Attn(), q, count_on="real")
    assert count.forward == attn
    # model FLOPs: 4 gradient matmuls (2 x forward); hardware FLOPs: the kernel also recomputes the scores
    assert count.backward == 2 * attn
    assert count.hardware == count.forward + 2.5 * attn
    assert count.recompute == 0.5 * attn
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in count.by_op
    meta = count_flops(Attn(), q, count_on="meta")  # the math path on meta: the same model FLOPs
    assert (meta.forward, meta.backward) == (count.forward, count.backward)
    assert meta.recompute == 0


class _SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(E, H, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


GRAD_MODES = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_multihead_attention_every_path(mode, grad_mode):
    model = getattr(_SelfAttention(), mode)()
    with GRAD_MODES[grad_mode]():
        count = count_flops(model, torch.randn(B, L, E), backward=False, count_on="real")
    assert count.forward == MHA_FLOPS
    if mode == "eval" and grad_mode != "grad":  # the inference fast path really ran
        assert list(count.by_op) == ["aten._native_multi_head_attention"]


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_transformer_encoder_layer_every_path(mode, grad_mode):
    layer = getattr(nn.TransformerEncoderLayer(E, H, dim_feedforward=64, batch_first=True), mode)()
    with GRAD_MODES[grad_mode]():
        count = count_flops(layer, torch.randn(B, L, E), backward=False, count_on="real")
    assert count.forward == MHA_FLOPS + 2 * B * L * E * 64 * 2
    if mode == "eval" and grad_mode != "grad":
        assert list(count.by_op) == ["aten._transformer_encoder_layer_fwd"]


def test_transformer_encoder_backward_counted():
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=64, batch_first=True, dropout=0.0)
    x = torch.randn(B, L, E, requires_grad=True)
    count = count_flops(layer, x, count_on="real")
    attn = 2 * 2 * B * L * L * E
    linear = count.forward - attn
    # every projection has an input and a weight gradient and the input x needs a gradient too; attention
    # backward is 2x its forward in model FLOPs, the CPU flash kernel's score recomputation is hardware FLOPs
    assert count.backward == 2 * linear + 2 * attn
    assert count.hardware == count.forward + 2 * linear + 2.5 * attn


def test_counting_changes_nothing():
    model = torchvision.models.resnet18().train()
    x = torch.randn(2, 3, 32, 32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    for count_on in ("meta", "real"):
        count_flops(model, x, count_on=count_on)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_by_module_paths_and_compiled_module_unwrapped():
    model = torchvision.models.resnet18()
    count = count_flops(torch.compile(model), torch.zeros(1, 3, 64, 64), backward=False)
    assert {"conv1", "layer1", "layer4.1.conv2", "fc"} <= set(count.by_module)
    assert sum(v for k, v in count.by_module.items() if "." not in k) == count.forward
    assert count.table(depth=1)[0][0] == "conv1"


def test_bytes_are_counted_per_op_class_and_views_move_nothing():
    from lit_compute.flops.counting import op_class

    lin = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64)
    count = count_flops(lin, x, backward=False, count_on="real")
    flops, moved, ops = count.by_class["matmul"]
    assert ops == 1
    assert flops == 2 * 8 * 64 * 32
    # addmm reads the bias, the input and the weight, writes the output (the transpose of the weight is a view)
    assert moved == 4 * (32 + 8 * 64 + 64 * 32 + 8 * 32)
    assert count.bytes == moved
    assert count.bytes_by_module == {}
    with_view = count_flops(
        torch.nn.Sequential(torch.nn.Flatten(0), torch.nn.ReLU()), x, backward=False, count_on="real"
    )
    assert with_view.by_class == {"elementwise": (0, 2 * 4 * 8 * 64, 1)}  # the flatten moved nothing; relu one kernel
    assert [
        op_class(n)
        for n in (
            "aten.addmm",
            "aten.convolution_backward",
            "aten._scaled_dot_product_flash_attention_for_cpu",
            "aten.native_layer_norm",
            "aten.add",
            "aten._foreach_mul_",
            "aten.convert_element_type",
        )
    ] == ["matmul", "conv", "attention", "norm", "elementwise", "optimizer", "elementwise"]
    assert op_class("aten.mul", optimizer=True) == "optimizer"


def test_convolutions_are_classed_by_their_groups_forward_and_backward():
    """#50 item 2: a grouped (ResNeXt) and a depthwise (MobileNet, EfficientNet) convolution are kept apart from dense
    ones, forward and backward, with their own FLOPs and bytes, so whatif can price each at its own efficiency."""
    net = torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 3), torch.nn.Conv2d(16, 16, 3, groups=16), torch.nn.Conv2d(16, 32, 3, groups=4)
    )
    count = count_flops(net, torch.randn(2, 8, 16, 16), backward=True, count_on="real")
    assert {k: v[2] for k, v in count.by_class.items() if k.startswith("conv")} == {
        "conv": 2,
        "conv_grouped": 2,
        "conv_depthwise": 2,
    }  # one forward and one backward kernel each
    # the depthwise one: 2 x outputs x 9 (one input channel per output), forward; backward twice that (input and
    # weight gradients), the first layer's input gradient not needed (the count keeps hardware FLOPs: it is run)
    outputs = 2 * 16 * 12 * 12
    assert count.by_class["conv_depthwise"][0] == 3 * 2 * outputs * 9
    assert count.by_class["conv_grouped"][0] == 3 * 2 * (2 * 32 * 10 * 10) * 4 * 9


def test_channels_first_convolutions_count_the_tensors_a_gpu_transposes_for_its_tensor_cores():
    """#50 item 2: cuDNN convolves 16-bit tensors channels-last, so a channels-first convolution's operands are
    transposed in and its results back. The count keeps their bytes (activations apart from weights, which do not
    grow with the batch) and how many there are; a channels-last net has none, nor has a depthwise convolution."""

    def net(channels_last: bool) -> torch.nn.Module:
        layers = torch.nn.Sequential(
            torch.nn.Conv2d(4, 8, 3), torch.nn.Conv2d(8, 8, 3, groups=8), torch.nn.Conv2d(8, 16, 1)
        )
        return layers.to(memory_format=torch.channels_last) if channels_last else layers

    x = torch.randn(2, 4, 10, 10)
    count = count_flops(net(False), x, backward=True, count_on="real")
    a, b, c = 2 * 4 * 10 * 10 * 4, 2 * 8 * 8 * 8 * 4, 2 * 16 * 6 * 6 * 4  # conv1 in, conv1 out, conv3 out (bytes)
    mid = 2 * 8 * 6 * 6 * 4  # the depthwise conv's output, conv3's input
    w1, w3 = 8 * 4 * 9 * 4, 16 * 8 * 4  # conv3's 1x1 weight is contiguous and channels-last alike: channels-first
    # forward: in + out (+ weight); conv1's backward only its weight's gradient (its input needs none): in, grad out
    # (+ weight grad); conv3's backward both: grad out and grad in for the data, in and grad out for the weight
    assert count.channels_first == ((a + b) + (a + b) + (mid + c) + (c + mid + mid + c), 2 * w1 + 3 * w3, 3 + 3 + 3 + 6)
    last = count_flops(net(True), x.to(memory_format=torch.channels_last), backward=True, count_on="real")
    assert last.channels_first == (0, 0, 0)
    # every convolution's weight once a forward, whatever its memory format or groups: what a CPU sets up each call
    w2 = 8 * 1 * 9 * 4
    assert count.conv_weights == last.conv_weights == w1 + w2 + w3
    # a squeeze-excitation's 1x1 convolution on a pooled 1x1 map: its input and weight are contiguous and
    # channels-last alike, and PyTorch reads how they were made from their strides (SE-ResNeXt channels-last: none)
    squeeze = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Conv2d(8, 4, 1))
    assert count_flops(
        squeeze.to(memory_format=torch.channels_last),
        x.to(memory_format=torch.channels_last),
        backward=True,
        count_on="real",
    ).channels_first == (0, 0, 0)
    first = count_flops(squeeze.to(memory_format=torch.contiguous_format), x, backward=True, count_on="real")
    assert first.channels_first[2] == (3 + 3) + (3 + 6)  # both channels-first: conv1 3 + 3, the 1x1 3 + 6
