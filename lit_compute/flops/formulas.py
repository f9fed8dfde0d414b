"""FLOP formulas that ``torch.utils.flop_counter`` lacks, registered through its ``custom_mapping``.

Convention (the same as torch's counter, torchvision's published figures and MFU): one multiply-add is two
FLOPs; matmul, convolution, attention and recurrent-layer matrix products are counted; elementwise ops,
normalisation, softmax and the gate non-linearities of RNN cells are not. Causal attention is counted as the
full (dense) score matrix, as torch's own formulas and PaLM's MFU do.

Missing from torch's registry (so plain ``FlopCounterMode`` counts zero for them):

- ``aten._scaled_dot_product_flash_attention_for_cpu`` (+ backward): the CPU kernel that
  ``scaled_dot_product_attention`` takes on CPU, in train and eval mode.
- ``aten._scaled_dot_product_fused_attention_overrideable`` (+ backward): the out-of-tree backends' kernel.
- ``aten._scaled_dot_product_attention_math_for_mps``: the MPS math kernel.
- ``aten._native_multi_head_attention`` / ``aten._triton_multi_head_attention``: ``nn.MultiheadAttention``'s
  inference fast path (eval mode under ``no_grad``/``inference_mode``), projections included.
- ``aten._transformer_encoder_layer_fwd``: the fused ``nn.TransformerEncoderLayer`` inference path, attention,
  projections and feed-forward included; with a padding mask its input is a nested tensor and each sequence
  is counted at its own length (padding costs nothing there).
- ``aten._grouped_mm`` / ``aten._scaled_grouped_mm``: mixture-of-experts expert matmuls (transformers'
  default experts path): every row meets one expert's matrix.
- ``aten.mkldnn_rnn_layer`` (+ backward), ``aten._cudnn_rnn`` (+ backward), ``aten.miopen_rnn`` (+ backward):
  ``nn.LSTM``/``nn.GRU``/``nn.RNN`` on CPU (oneDNN), CUDA (cuDNN) and ROCm: every weight matrix is applied to
  every time step (``2 x steps x batch x weight elements``); a backward is twice its forward.
- ``aten._trilinear``: ``nn.Bilinear``: one multiply-add per term of the broadcast product.
- ``aten._int_mm``, ``aten._addmm_activation``, ``aten._weight_int8pack_mm``: matmuls under other names.

Corrected: torch's ``aten.convolution_backward`` formula ignores ``groups`` for the weight gradient, which
overcounts depthwise convolutions by their channel count (MobileNet and EfficientNet backward came out 35-40x
their forward). Each gradient of a convolution uses exactly the multiply-adds of the forward, so the
backward is ``forward x (number of gradients asked for)``.

Attention backward: the fused kernels (flash, memory-efficient, cuDNN, the CPU flash kernel) recompute the
score matrix ``Q K^T`` in their backward; torch's formulas count that recomputation (backward = 2.5 x forward
for equal head dims). :func:`attention_recompute_flops` isolates it, so that *model* FLOPs count every
attention backward as exactly 2 x its forward (the math path's four matmuls) and *hardware* FLOPs keep what
the kernel executed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch.utils.flop_counter import conv_flop_count, mm_flop, sdpa_backward_flop_count, sdpa_flop_count

from lit_compute import _compat

# what torch.utils.flop_counter hands a formula for each tensor argument: its shape (a torch.Size, or a list)
Shape = Sequence[int]

aten = torch.ops.aten


def _raw(fn: Callable[..., int]) -> Callable[..., int]:
    """Mark a formula as taking the op's raw arguments (tensors, not shapes): nested tensors have no ``.shape``."""
    fn._get_raw = True  # type: ignore[attr-defined]
    return fn


def _sdpa_forward(query_shape: Shape, key_shape: Shape, value_shape: Shape, *args: Any, **kwargs: Any) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_backward(
    grad_out_shape: Shape, query_shape: Shape, key_shape: Shape, value_shape: Shape, *args: Any, **kwargs: Any
) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _mha_core(batch: int, lq: int, lk: int, embed: int) -> int:
    """Projections (q, k, v, out) and the two attention matmuls of one multi-head attention."""
    proj = 2 * batch * lq * embed * embed * 2 + 2 * batch * lk * embed * embed * 2  # q + out, k + v
    attn = 2 * batch * lq * lk * embed * 2  # q @ k^T and p @ v, summed over heads
    return proj + attn


def _sequence_lengths(t: torch.Tensor) -> list[int]:
    """Per-sequence lengths of an ``(L, E)``/``(B, L, E)`` tensor or of a nested tensor of ``(L_i, E)`` sequences."""
    if getattr(t, "is_nested", False):
        sizes = _compat.nested_tensor_sizes(t)
        if sizes is not None:
            return [row[0] for row in sizes]
        offsets = t.offsets()  # type: ignore[attr-defined]  # jagged layout: a NestedTensor subclass method
        return [int(b - a) for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    shape = t.shape
    if len(shape) == 3:
        return [int(shape[1])] * int(shape[0])
    if len(shape) == 2:  # unbatched (L, E)
        return [int(shape[0])]
    raise ValueError(f"unsupported attention input shape {tuple(shape)}")


@_raw
def _native_mha(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim: Any,
    num_head: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    q_lengths, k_lengths = _sequence_lengths(query), _sequence_lengths(key)
    return sum(_mha_core(1, lq, lk, int(embed_dim)) for lq, lk in zip(q_lengths, k_lengths))


@_raw
def _encoder_layer(
    src: torch.Tensor,
    embed_dim: Any,
    num_heads: Any,
    qkv_weight: torch.Tensor,
    qkv_bias: Any,
    proj_weight: torch.Tensor,
    proj_bias: Any,
    use_gelu: Any,
    norm_first: Any,
    eps: Any,
    nw1: Any,
    nb1: Any,
    nw2: Any,
    nb2: Any,
    ffn_weight_1: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> int:
    e, ffn = int(embed_dim), int(ffn_weight_1.shape[0])
    return sum(_mha_core(1, length, length, e) + 2 * length * e * ffn * 2 for length in _sequence_lengths(src))


def _conv_backward(
    grad_out_shape: Shape,
    x_shape: Shape,
    w_shape: Shape,
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: Any,
    _output_padding: Any,
    _groups: Any,
    output_mask: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    forward = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed=transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _grouped_mm(a_shape: Shape, b_shape: Shape, *args: Any, **kwargs: Any) -> int:
    """``_grouped_mm(a, b, offs)``: 2D x 3D (rows of ``a`` split over experts), 3D x 3D (batched), 3D x 2D (columns
    of ``b`` split over groups), 2D x 2D (the contraction split over groups): every case is one multiply-add per
    (row, contraction, column) triple that meets."""
    if len(a_shape) == 2 and len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * b_shape[2]
    if len(a_shape) == 3 and len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[2]
    if len(a_shape) == 3 and len(b_shape) == 2:
        return 2 * a_shape[1] * a_shape[2] * b_shape[-1]
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    raise ValueError(f"unsupported _grouped_mm shapes {tuple(a_shape)} x {tuple(b_shape)}")


def _mm_like(a_shape: Shape, b_shape: Shape, *args: Any, **kwargs: Any) -> int:
    return mm_flop(a_shape, b_shape)


def _int8pack_mm(a_shape: Shape, b_shape: Shape, *args: Any, **kwargs: Any) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[0]  # the packed weight is (out, in)


def _addmm_activation(self_shape: Shape, a_shape: Shape, b_shape: Shape, *args: Any, **kwargs: Any) -> int:
    return mm_flop(a_shape, b_shape)


def _rnn_tokens(input_shape: Shape, batch_sizes: Any) -> int:
    if batch_sizes is not None and len(batch_sizes) > 0:  # a PackedSequence: the real time steps of every sequence
        return int(sum(int(b) for b in batch_sizes))
    return int(math.prod(input_shape[:-1]))


def _mkldnn_rnn_layer(
    input_shape: Shape,
    w_ih_shape: Shape,
    w_hh_shape: Shape,
    b_ih: Any,
    b_hh: Any,
    hx: Any,
    cx: Any,
    reverse: Any,
    batch_sizes: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    return 2 * _rnn_tokens(input_shape, batch_sizes) * (math.prod(w_ih_shape) + math.prod(w_hh_shape))


def _mkldnn_rnn_layer_backward(
    input_shape: Shape,
    w_ih_shape: Shape,
    w_hh_shape: Shape,
    b_ih: Any,
    b_hh: Any,
    hx: Any,
    cx: Any,
    output: Any,
    hy: Any,
    cy: Any,
    grad_output: Any,
    grad_hy: Any,
    grad_cy: Any,
    reverse: Any,
    mode: Any,
    hidden_size: Any,
    num_layers: Any,
    has_biases: Any,
    train: Any,
    bidirectional: Any,
    batch_sizes: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    return 2 * _mkldnn_rnn_layer(input_shape, w_ih_shape, w_hh_shape, None, None, None, None, reverse, batch_sizes)


def _packed_rnn(input_shape: Shape, weight_shapes: Sequence[Shape], batch_sizes: Any) -> int:
    matrices = sum(math.prod(s) for s in weight_shapes if len(s) == 2)
    return 2 * _rnn_tokens(input_shape, batch_sizes) * matrices


def _cudnn_rnn(
    input_shape: Shape,
    weight_shapes: Sequence[Shape],
    weight_stride0: Any,
    weight_buf: Any,
    hx: Any,
    cx: Any,
    mode: Any,
    hidden_size: Any,
    proj_size: Any,
    num_layers: Any,
    batch_first: Any,
    dropout: Any,
    train: Any,
    bidirectional: Any,
    batch_sizes: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    return _packed_rnn(input_shape, weight_shapes, batch_sizes)


def _cudnn_rnn_backward(
    input_shape: Shape,
    weight_shapes: Sequence[Shape],
    weight_stride0: Any,
    weight_buf: Any,
    hx: Any,
    cx: Any,
    output: Any,
    grad_output: Any,
    grad_hy: Any,
    grad_cy: Any,
    mode: Any,
    hidden_size: Any,
    proj_size: Any,
    num_layers: Any,
    batch_first: Any,
    dropout: Any,
    train: Any,
    bidirectional: Any,
    batch_sizes: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    return 2 * _packed_rnn(input_shape, weight_shapes, batch_sizes)


def _miopen_rnn(
    input_shape: Shape,
    weight_shapes: Sequence[Shape],
    weight_stride0: Any,
    hx: Any,
    cx: Any,
    mode: Any,
    hidden_size: Any,
    num_layers: Any,
    batch_first: Any,
    dropout: Any,
    train: Any,
    bidirectional: Any,
    batch_sizes: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    return _packed_rnn(input_shape, weight_shapes, batch_sizes)


def _miopen_rnn_backward(
    input_shape: Shape,
    weight_shapes: Sequence[Shape],
    weight_stride0: Any,
    weight_buf: Any,
    hx: Any,
    cx: Any,
    output: Any,
    grad_output: Any,
    grad_hy: Any,
    grad_cy: Any,
    mode: Any,
    hidden_size: Any,
    num_layers: Any,
    batch_first: Any,
    dropout: Any,
    train: Any,
    bidirectional: Any,
    batch_sizes: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    return 2 * _packed_rnn(input_shape, weight_shapes, batch_sizes)


def _trilinear(
    i1_shape: Shape,
    i2_shape: Shape,
    i3_shape: Shape,
    expand1: Any,
    expand2: Any,
    expand3: Any,
    sumdim: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    def expanded(shape: Shape, dims: Sequence[int]) -> list[int]:
        out = list(shape)
        for d in sorted(dims):
            out.insert(d, 1)
        return out

    shapes = [expanded(i1_shape, expand1), expanded(i2_shape, expand2), expanded(i3_shape, expand3)]
    rank = max(len(s) for s in shapes)
    full = [max(s[d] if d < len(s) else 1 for s in shapes) for d in range(rank)]
    return 2 * math.prod(full)


def unneeded_input_grad_flops(func_packet: Any, args: tuple) -> int:
    """FLOPs an RNN backward kernel spends on an input gradient that nothing needs (0 for every other op).

    oneDNN's LSTM/GRU/RNN layer backward always computes the gradients of the layer's input and of its initial
    hidden state; when those need no gradient (the first layer of a model fed with data; a zero initial state)
    autograd would not have computed them, and the meta path (which decomposes the layer into matmuls) does not.
    That work is hardware FLOPs, not model FLOPs, so both paths give the same model FLOPs. Read from the autograd
    node being executed: an input edge is empty when that input needs no gradient."""
    if str(func_packet) != "aten.mkldnn_rnn_layer_backward" or len(args) < 21:
        return 0
    try:
        node = _compat.current_autograd_node()
        if node is None:
            return 0
        edges = node.next_functions  # input, w_ih, w_hh, b_ih, b_hh, hx, cx
        input_, w_ih, w_hh, hx = args[0], args[1], args[2], args[5]
        unneeded = 0
        if edges[0][0] is None:  # d input = grad_gates x W_ih, at every time step
            unneeded += 2 * _rnn_tokens(tuple(input_.shape), args[20]) * math.prod(w_ih.shape)
        if len(edges) > 5 and edges[5][0] is None:  # d h_0 = grad_gates(t=0) x W_hh, once per sequence
            unneeded += 2 * (hx.numel() // w_hh.shape[1]) * math.prod(w_hh.shape)
        return unneeded
    except Exception:  # noqa: BLE001 - another torch version's internals: count it as model FLOPs
        return 0


def attention_recompute_flops(func_packet: Any, args: tuple, hardware_flops: int) -> int:
    """The part of a fused attention backward's FLOPs that recomputes ``Q K^T`` (0 for every other op).

    torch's backward formula counts five matmuls: the recomputed scores (``s_q x d_q x s_k``), two with the
    value head dim ``d_v`` and two with ``d_q``; the recomputed one is ``d_q / (3 d_q + 2 d_v)`` of the total."""
    if func_packet not in _RECOMPUTING_BACKWARD or hardware_flops <= 0 or len(args) < 4:
        return 0
    query, value = args[1], args[3]
    try:
        dq, dv = int(query.shape[-1]), int(value.shape[-1])
    except Exception:  # noqa: BLE001 - nested/jagged layouts without a plain shape
        return hardware_flops // 5
    return hardware_flops * dq // (3 * dq + 2 * dv)


def _optional(name: str) -> Any:
    return getattr(aten, name, None)


_RECOMPUTING_BACKWARD = {
    op
    for op in (
        _optional("_scaled_dot_product_flash_attention_backward"),
        _optional("_scaled_dot_product_efficient_attention_backward"),
        _optional("_scaled_dot_product_cudnn_attention_backward"),
        _optional("_flash_attention_backward"),
        _optional("_efficient_attention_backward"),
        _optional("_scaled_dot_product_flash_attention_for_cpu_backward"),
        _optional("_scaled_dot_product_fused_attention_overrideable_backward"),
    )
    if op is not None
}


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
        "_grouped_mm": _grouped_mm,
        "_scaled_grouped_mm": _grouped_mm,
        "_int_mm": _mm_like,
        "_weight_int8pack_mm": _int8pack_mm,
        "_addmm_activation": _addmm_activation,
        "mkldnn_rnn_layer": _mkldnn_rnn_layer,
        "mkldnn_rnn_layer_backward": _mkldnn_rnn_layer_backward,
        "_cudnn_rnn": _cudnn_rnn,
        "_cudnn_rnn_backward": _cudnn_rnn_backward,
        "miopen_rnn": _miopen_rnn,
        "miopen_rnn_backward": _miopen_rnn_backward,
        "_trilinear": _trilinear,
    }
    out: dict[Any, Callable[..., int]] = {}
    for name, fn in cast("dict[str, Callable[..., int]]", table).items():
        op = _optional(name)
        if op is not None:
            out[op] = fn
    return out
