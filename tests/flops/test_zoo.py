"""The counting engine on models nobody here wrote (transformers, timm, built from configs with random weights),
against analytic formulas: forward, and forward + backward (model FLOPs), on meta and on the real CPU kernels."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_compute.flops import count_flops

transformers = pytest.importorskip("transformers", reason="the zoo needs transformers (pip install 'lit-compute[dev]')")
timm = pytest.importorskip("timm", reason="the zoo needs timm (pip install 'lit-compute[dev]')")

from lit_compute.bench.zoo import transformers_zoo  # noqa: E402 - only once transformers and timm are known to be installed

TOL = 1e-3  # the bar; the counts below are in fact exact
ZOO = {m.name: m for m in transformers_zoo()}


def _close(got: float, want: float) -> bool:
    return abs(got - want) <= TOL * want


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_transformers_models_match_their_analytic_counts(name, attention):
    entry = ZOO[name]
    model = entry.build(attention)
    real = count_flops(model, **entry.inputs(), count_on="real")
    assert real.complete, (real.uncounted_ops, real.errors)
    assert _close(real.forward, entry.forward_flops), (real.forward, entry.forward_flops)
    assert _close(real.total, 3 * entry.forward_flops)  # every matmul has an input and a weight gradient
    assert real.hardware >= real.total  # fused attention kernels recompute the scores in their backward
    if name != "mixtral_moe":  # the grouped-mm meta kernel refuses float32; count_on="auto" falls back to real
        meta = count_flops(model, **entry.inputs(), count_on="meta")
        assert (meta.forward, meta.backward) == (real.forward, real.backward)
        assert meta.recompute == 0


def test_tied_weights_count_on_the_meta_path():
    entry = ZOO["gpt2"]
    model = entry.build()
    assert model.lm_head.weight is model.transformer.wte.weight
    meta = count_flops(model, **entry.inputs(), count_on="meta")  # raised before, then fell back to real silently
    assert meta.forward == entry.forward_flops


def _module_analytic(model: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(forward, forward + backward) from each layer's own formula: 2 x outputs x (inputs per output) for
    convolutions and linears, 4 x B x heads x N^2 x head_dim for attention; a layer's backward is 2x its
    forward, or 1x (weight gradient only) when its input needs no gradient (the stem)."""
    totals = [0, 0]
    hooks = []

    def add(forward: int, input_grad: bool) -> None:
        totals[0] += forward
        totals[1] += forward * (3 if input_grad else 2)

    def conv(m, inp, out):
        add(2 * out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1], inp[0].requires_grad)

    def linear(m, inp, out):
        add(2 * out.numel() * m.in_features, inp[0].requires_grad)

    def attention(m, inp, out):
        b, n, _ = inp[0].shape
        totals[0] += 4 * b * m.num_heads * n * n * m.head_dim
        totals[1] += 3 * 4 * b * m.num_heads * n * n * m.head_dim

    from timm.models.vision_transformer import Attention

    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            hooks.append(m.register_forward_hook(conv))
        elif isinstance(m, nn.Linear):
            hooks.append(m.register_forward_hook(linear))
        elif isinstance(m, Attention):
            hooks.append(m.register_forward_hook(attention))
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
    return totals[0], totals[1]


@pytest.mark.parametrize(
    "name",
    [
        "resnet18",
        "convnext_atto",
        "efficientnet_b0",
        "mobilenetv3_small_100",
        "vit_tiny_patch16_224",
        "deit_tiny_patch16_224",
    ],
)
def test_timm_models_match_their_per_layer_analytic_counts(name):
    kwargs = {"img_size": 64} if name.startswith(("vit", "deit")) else {}
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **kwargs).train()
    x = torch.zeros(2, 3, 64, 64)
    forward, total = _module_analytic(model, x)
    for on in ("meta", "real"):
        count = count_flops(model, x, count_on=on)
        assert count.complete
        assert _close(count.forward, forward), (on, count.forward, forward)
        # depthwise convolutions (EfficientNet, MobileNet, ConvNeXt) are where torch's backward formula overcounts
        assert _close(count.total, total), (on, count.total, total)
