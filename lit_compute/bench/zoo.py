"""Models nobody here wrote, built from configs with random weights, and their analytic FLOP counts.

Small configurations (two layers) of Hugging Face ``transformers`` models: GPT-2, a Llama-style decoder with
grouped-query attention, BERT, T5 and a Mixtral-style mixture of experts with transformers' default experts.
Each analytic forward count is written from the architecture (one multiply-add = 2 FLOPs; every weight matrix
meets every token once; attention costs ``4 x batch x heads x len_q x len_k x head_dim``, full score matrix;
a mixture of experts sends every token through ``k`` experts); training is 3 x forward for these models
(every matmul has an input and a weight gradient). Used by ``lit-compute bench flops --zoo transformers`` and by
the test suite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

BATCH, LENGTH, VOCAB, DECODER_LENGTH = 2, 16, 128, 8


@dataclass
class ZooModel:
    name: str
    config: Callable[[], Any]
    model_class: Callable[[], Any]
    forward_flops: int
    encoder_decoder: bool = False

    def build(self, attention: str = "sdpa", device: str | None = None) -> torch.nn.Module:
        cfg = self.config()
        cfg._attn_implementation = attention
        torch.manual_seed(0)
        if device is None:
            return self.model_class()(cfg)
        with torch.device(device):
            return self.model_class()(cfg)

    def inputs(self, device: str = "cpu") -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        out = {"input_ids": torch.randint(0, VOCAB, (BATCH, LENGTH), generator=g)}
        if self.encoder_decoder:
            out["decoder_input_ids"] = torch.randint(0, VOCAB, (BATCH, DECODER_LENGTH), generator=g)
        return {k: v.to(device) for k, v in out.items()}


def _t(name: str) -> Any:
    import transformers

    return getattr(transformers, name)


def _gpt2() -> ZooModel:
    d, n, t = 64, 2, BATCH * LENGTH
    forward = n * (2 * t * (3 * d * d + d * d + 2 * 4 * d * d) + 4 * BATCH * LENGTH * LENGTH * d) + 2 * t * d * VOCAB
    return ZooModel(
        "gpt2",
        lambda: _t("GPT2Config")(n_layer=n, n_embd=d, n_head=4, vocab_size=VOCAB, n_positions=64),
        lambda: _t("GPT2LMHeadModel"),
        forward,
    )


def _attention(d: int, h: int, kv: int, t: int) -> int:
    hd = d // h
    return 2 * t * d * (h * hd + 2 * kv * hd) + 2 * t * h * hd * d + 4 * BATCH * h * LENGTH * LENGTH * hd


def _llama() -> ZooModel:
    d, h, kv, inner, n, t = 64, 4, 2, 128, 2, BATCH * LENGTH
    forward = n * (_attention(d, h, kv, t) + 2 * t * 3 * d * inner) + 2 * t * d * VOCAB
    return ZooModel(
        "llama_gqa",
        lambda: _t("LlamaConfig")(
            num_hidden_layers=n,
            hidden_size=d,
            num_attention_heads=h,
            num_key_value_heads=kv,
            intermediate_size=inner,
            vocab_size=VOCAB,
        ),
        lambda: _t("LlamaForCausalLM"),
        forward,
    )


def _bert() -> ZooModel:
    d, inner, n, t = 64, 128, 2, BATCH * LENGTH
    forward = n * (2 * t * 4 * d * d + 2 * t * 2 * d * inner + 4 * BATCH * LENGTH * LENGTH * d) + 2 * BATCH * d * d
    return ZooModel(
        "bert",
        lambda: _t("BertConfig")(
            num_hidden_layers=n, hidden_size=d, num_attention_heads=4, intermediate_size=inner, vocab_size=VOCAB
        ),
        lambda: _t("BertModel"),
        forward,
    )  # + the pooler on the first token


def _t5() -> ZooModel:
    d, inner, ff, h, dkv, n = 64, 64, 128, 4, 16, 2
    le, ld = LENGTH, DECODER_LENGTH
    te, td = BATCH * le, BATCH * ld
    encoder = n * (2 * te * 4 * d * inner + 4 * BATCH * h * le * le * dkv + 2 * te * 2 * d * ff)
    self_attn = 2 * td * 4 * d * inner + 4 * BATCH * h * ld * ld * dkv
    cross = 2 * td * d * inner * 2 + 2 * te * d * inner * 2 + 4 * BATCH * h * ld * le * dkv  # q, o / k, v / scores
    decoder = n * (self_attn + cross + 2 * td * 2 * d * ff)
    return ZooModel(
        "t5",
        lambda: _t("T5Config")(
            num_layers=n,
            num_decoder_layers=n,
            d_model=d,
            d_kv=dkv,
            num_heads=h,
            d_ff=ff,
            vocab_size=VOCAB,
            decoder_start_token_id=0,
        ),
        lambda: _t("T5ForConditionalGeneration"),
        encoder + decoder + 2 * td * d * VOCAB,
        encoder_decoder=True,
    )


def _mixtral() -> ZooModel:
    d, h, kv, inner, n, experts, k, t = 64, 4, 2, 96, 2, 4, 2, BATCH * LENGTH
    moe = 2 * t * d * experts + 2 * t * k * 3 * d * inner  # the router + every token through k experts' 3 matrices
    forward = n * (_attention(d, h, kv, t) + moe) + 2 * t * d * VOCAB
    return ZooModel(
        "mixtral_moe",
        lambda: _t("MixtralConfig")(
            num_hidden_layers=n,
            hidden_size=d,
            num_attention_heads=h,
            num_key_value_heads=kv,
            intermediate_size=inner,
            vocab_size=VOCAB,
            num_local_experts=experts,
            num_experts_per_tok=k,
        ),
        lambda: _t("MixtralForCausalLM"),
        forward,
    )


def transformers_zoo() -> list[ZooModel]:
    """The zoo's transformers models (needs ``transformers``)."""
    return [_gpt2(), _llama(), _bert(), _t5(), _mixtral()]


def output_loss(output: Any) -> torch.Tensor:
    """The sum of every floating output that needs a gradient: the backward :func:`~lit_compute.flops.count_flops`
    counts (the gradient of every output), as one scalar for counters that take a loss."""
    from lit_compute._compat import tree_flatten

    values = list(output.values()) if hasattr(output, "values") else output
    flat, _ = tree_flatten(values)
    total = sum(t.sum() for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad)
    return cast(torch.Tensor, total)  # 0 + tensors: a tensor on the outputs' device (meta included)
