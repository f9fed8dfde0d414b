"""The models of ``published_gpu.csv`` as their sources trained them (network, loss of a batch, optimizer), and one
training step of each counted on fake tensors."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from lit_compute.speedup.channels_last import ChannelsLast


@functools.cache
def traced_facts(model: str, batch: int, memory_format: str = "contiguous") -> Any:
    """The op-class counts of one training step of ``model`` at ``batch``, counted on fake tensors (shapes only)
    the way FlopsLogger counts a real step: forward, loss, backward, the optimizer's step; the network's weights
    channels-last when ``memory_format`` says so (its convolutions then run channels-last, as the source's did)."""
    import torch

    from lit_compute import _compat
    from lit_compute.flops.counting import SafeFlopCounterMode
    from lit_compute.planning.estimate import fake_tensors
    from lit_compute.planning.whatif import ChannelsFirst, OpCost, RunFacts

    fake_mode = _compat.fake_tensor_mode()
    with torch.device("meta"):
        net, step = zoo_model(model)
        if memory_format == "channels_last":  # as lit_compute.speedup.ChannelsLast lays out a run's module
            net = ChannelsLast().convert_module(net)
    fake_tensors(net, fake_mode, torch.device("cpu"))
    optimizer = zoo_optimizer(model, net)
    counter = SafeFlopCounterMode(display=False, depth=99, module_paths=net, hookless=True)
    with fake_mode, counter:
        step(net, batch).backward()
        counter.in_optimizer_step = True
        optimizer.step()
    count = counter.result()
    trainable = sum(p.numel() for p in net.parameters())
    return RunFacts(
        path=Path(f"{model} traced at batch {batch}"),
        by_class={kind: OpCost.of(cost) for kind, cost in count.by_class.items()},
        samples=batch,
        model_flops=count.total,
        trainable=trainable,
        parameters=trainable,
        precision="32-true",
        device="traced",
        loader_workers=None,
        conv_weights=float(count.conv_weights),
        kernels=count.kernels,
        channels_first=ChannelsFirst(*(float(n) for n in count.channels_first)),
    )


def zoo_optimizer(model: str, net: Any) -> Any:
    """The optimizer each source trains with: SGD with momentum (DLE's ResNets; its SSD300, with weight decay; timm's
    benchmark.py, Nesterov's), RMSprop (DLE's EfficientNets), AdamW (BERT, the GPT)."""
    import torch

    if model.startswith(("resnet", "resnext", "se-resnext")):
        return torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.875, foreach=True)
    if model == "ssd300":
        return torch.optim.SGD(net.parameters(), lr=2.6e-3, momentum=0.9, weight_decay=5e-4, foreach=True)
    if model.startswith("timm/"):  # benchmark.py's create_optimizer_v2(opt="sgd", lr=1e-4)
        return torch.optim.SGD(net.parameters(), lr=1e-4, momentum=0.9, nesterov=True, foreach=True)
    if model.startswith("efficientnet"):
        return torch.optim.RMSprop(net.parameters(), lr=0.01, alpha=0.9, eps=0.01, momentum=0.9, foreach=True)
    return torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=True)


def image_step(size: int) -> Any:
    def step(net: Any, batch: int) -> Any:
        x, y = torch.randn(batch, 3, size, size), torch.zeros(batch, dtype=torch.long)
        return torch.nn.functional.cross_entropy(net(x), y)

    return step


#: how NVIDIA's BERT (DeepLearningExamples' modeling.py, which the fit rows and Lambda's SQuAD rows ran) attends: two
#: batched matmuls around a scale, the padding mask added, a softmax and a dropout, each its own kernel, the scores
#: written out in between; not a fused (flash) kernel, which transformers would choose by default
_DLE_ATTENTION = "eager"


def zoo_model(name: str) -> tuple[Any, Any]:
    """``(network, step)`` for a model of published_gpu.csv: ``step(net, batch)`` returns the loss of one batch of
    the shape the source trained on (224 px images, 380 px for EfficientNet-B4, the size after ``@`` for a timm model,
    300 px for SSD300; 128 tokens for BERT pre-training, 384 for SQuAD; 1,024 for the GPT)."""
    import torchvision

    if name.startswith("timm/"):  # timm/NAME@PIXELS: benchmark.py's model at its default input size
        import timm

        model, _, pixels = name.removeprefix("timm/").partition("@")
        return timm.create_model(model, pretrained=False), image_step(int(pixels))
    if name == "ssd300":
        from lit_compute.bench.whatif.ssd import SSD300, ssd_step

        return SSD300(), ssd_step
    if name == "resnet50":
        return torchvision.models.resnet50(), image_step(224)
    if name == "resnext101-32x4d":  # torchvision's ResNeXt-101 is 32x8d; 32x4d is the same blocks, half as wide
        from torchvision.models.resnet import Bottleneck, ResNet

        return ResNet(Bottleneck, [3, 4, 23, 3], groups=32, width_per_group=4), image_step(224)
    if name == "se-resnext101-32x4d":
        try:
            import timm
        except ImportError as err:  # pragma: no cover - timm is in the dev extra
            raise RuntimeError("SE-ResNeXt-101-32x4d is built with timm: pip install 'lit-compute[dev]'") from err
        return timm.create_model("seresnext101_32x4d", pretrained=False), image_step(224)
    if name in ("efficientnet-b0", "efficientnet-b4"):
        size = 224 if name.endswith("b0") else 380
        return torchvision.models.get_model(name.replace("-", "_"), weights=None), image_step(size)
    if name == "gpt":
        from lit_compute.models import GPT

        def gpt_step(net: Any, batch: int) -> Any:
            return net._loss({"input_ids": torch.zeros(batch, 1024, dtype=torch.long)})

        return GPT(block_size=1024, n_layer=12, n_head=12, n_embd=768), gpt_step
    if name in ("bert-large-squad", "bert-base-squad"):
        return _bert_squad(large=name.startswith("bert-large"))
    if name != "bert-large":
        raise ValueError(f"no model {name!r} in lit-compute bench whatif")
    from transformers import BertConfig, BertModel

    config = BertConfig(
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
        vocab_size=30528,
        attn_implementation=_DLE_ATTENTION,
    )
    encoder = BertModel(config, add_pooling_layer=True)
    heads = torch.nn.ModuleDict(
        {
            "transform": torch.nn.Linear(1024, 1024),
            "norm": torch.nn.LayerNorm(1024),
            "decoder": torch.nn.Linear(1024, 30528),
            "nsp": torch.nn.Linear(1024, 2),
        }
    )
    net = torch.nn.ModuleDict({"bert": encoder, "heads": heads})

    def bert_step(model: Any, batch: int) -> Any:
        # the masked-LM head on the masked positions only (20 of 128, as NVIDIA's pre-training gathers them)
        ids = torch.zeros(batch, 128, dtype=torch.long)
        out = model["bert"](input_ids=ids, attention_mask=torch.ones(batch, 128, dtype=torch.long))
        masked = out.last_hidden_state[:, :20]
        h = model["heads"]["norm"](torch.nn.functional.gelu(model["heads"]["transform"](masked)))
        logits = model["heads"]["decoder"](h)
        mlm = torch.nn.functional.cross_entropy(logits.reshape(-1, 30528), torch.zeros(batch * 20, dtype=torch.long))
        nsp = torch.nn.functional.cross_entropy(
            model["heads"]["nsp"](out.pooler_output), torch.zeros(batch, dtype=torch.long)
        )
        return mlm + nsp

    return net, bert_step


def _bert_squad(large: bool) -> tuple[Any, Any]:
    """BERT fine-tuned on SQuAD as NVIDIA's run_squad.py does it: the encoder, a start/end head, 384 tokens."""
    from transformers import BertConfig, BertForQuestionAnswering

    width, layers, heads = (1024, 24, 16) if large else (768, 12, 12)
    config = BertConfig(
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        vocab_size=30522,
        attn_implementation=_DLE_ATTENTION,
    )
    net = BertForQuestionAnswering(config)

    def squad_step(model: Any, batch: int) -> Any:
        ids = torch.zeros(batch, 384, dtype=torch.long)
        target = torch.zeros(batch, dtype=torch.long)
        return model(
            input_ids=ids, attention_mask=torch.ones_like(ids), start_positions=target, end_positions=target
        ).loss

    return net, squad_step
