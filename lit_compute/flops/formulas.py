"""FLOP formulas that ``torch.utils.flop_counter`` lacks, registered through its ``custom_mapping``.

Convention (the same as torch's counter, torchvision's published figures and MFU): one multiply-add is two
FLOPs; matmul, convolution and attention are counted; elementwise ops, normalisation and softmax are not.

Missing from torch's registry (so plain ``FlopCounterMode`` counts zero for them):

- ``aten._scaled_dot_product_flash_attention_for_cpu`` (+ backward): the CPU kernel that
  ``scaled_dot_product_attention`` takes on CPU, in train and eval mode.
- ``aten._scaled_dot_product_fused_attention_overrideable`` (+ backward): the out-of-tree backends' kernel.
- ``aten._scaled_dot_product_attention_math_for_mps``: the MPS math kernel.
- ``aten._native_multi_head_attention`` / ``aten._triton_multi_head_attention``: ``nn.MultiheadAttention``'s
  inference fast path (eval mode under ``no_grad``/``inference_mode``), projections included.
- ``aten._transformer_encoder_layer_fwd``: the fused ``nn.TransformerEncoderLayer`` inference path,
  attention, projections and feed-forward included.

Corrected: torch's ``aten.convolution_backward`` formula ignores ``groups`` for the weight gradient, which
overcounts depthwise convolutions by their channel count (MobileNet and EfficientNet backward came out 35-40x
their forward). Each gradient of a convolution uses exactly the multiply-adds of the forward, so the
backward is ``forward x (number of gradients asked for)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.flop_counter import conv_flop_count, sdpa_backward_flop_count, sdpa_flop_count

aten = torch.ops.aten


def _sdpa_forward(query_shape, key_shape, value_shape, *args: Any, **kwargs: Any) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_backward(grad_out_shape, query_shape, key_shape, value_shape, *args: Any, **kwargs: Any) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _mha_core(batch: int, lq: int, lk: int, embed: int) -> int:
    """Projections (q, k, v, out) and the two attention matmuls of one multi-head attention."""
    proj = 2 * batch * lq * embed * embed * 2 + 2 * batch * lk * embed * embed * 2  # q + out, k + v
    attn = 2 * batch * lq * lk * embed * 2  # q @ k^T and p @ v, summed over heads
    return proj + attn


def _bld(shape) -> tuple[int, int, int]:
    if len(shape) == 3:
        return int(shape[0]), int(shape[1]), int(shape[2])
    if len(shape) == 2:  # unbatched (L, E)
        return 1, int(shape[0]), int(shape[1])
    raise ValueError(f"unsupported attention input shape {tuple(shape)}")


def _native_mha(query_shape, key_shape, value_shape, embed_dim, num_head, *args: Any, **kwargs: Any) -> int:
    b, lq, _ = _bld(query_shape)
    _, lk, _ = _bld(key_shape)
    return _mha_core(b, lq, lk, int(embed_dim))


def _encoder_layer(src_shape, embed_dim, num_heads, qkv_weight_shape, qkv_bias_shape, proj_weight_shape,
                   proj_bias_shape, use_gelu, norm_first, eps, nw1, nb1, nw2, nb2, ffn_weight_1_shape,
                   *args: Any, **kwargs: Any) -> int:
    b, length, e = _bld(src_shape)
    ffn = int(ffn_weight_1_shape[0])
    return _mha_core(b, length, length, int(embed_dim)) + 2 * b * length * e * ffn * 2


def _conv_backward(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                   _output_padding, _groups, output_mask, *args: Any, **kwargs: Any) -> int:
    forward = conv_flop_count(x_shape, w_shape, grad_out_shape, transposed=transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _optional(name: str) -> Any:
    return getattr(aten, name, None)


def extra_formulas() -> dict[Any, Callable[..., int]]:
    """The formulas above, keyed by the op overload packets this torch build has."""
    table = {
        "_scaled_dot_product_flash_attention_for_cpu": _sdpa_forward,
        "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_backward,
        "_scaled_dot_product_fused_attention_overrideable": _sdpa_forward,
        "_scaled_dot_product_fused_attention_overrideable_backward": _sdpa_backward,
        "_scaled_dot_product_attention_math_for_mps": _sdpa_forward,
        "_native_multi_head_attention": _native_mha,
        "_triton_multi_head_attention": _native_mha,
        "_transformer_encoder_layer_fwd": _encoder_layer,
        "convolution_backward": _conv_backward,
    }
    out: dict[Any, Callable[..., int]] = {}
    for name, fn in table.items():
        op = _optional(name)
        if op is not None:
            out[op] = fn
    return out
