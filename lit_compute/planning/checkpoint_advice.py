"""Activation checkpointing advice for ``lit-compute estimate``: the repeated blocks whose recomputation in backward
(``torch.utils.checkpoint``) saves the most memory at a micro-batch, each with its recompute cost in hardware FLOPs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["Checkpointing", "checkpoint_candidates"]


@dataclass
class Checkpointing:
    """Recomputing a block's activations in backward (``torch.utils.checkpoint``): what it saves, what it costs."""

    module: str
    saved_bytes: int
    recompute_flops: int


def checkpoint_candidates(
    model: Any, batch: Any, fake_mode: Any, forward_context: Callable[[], Any], limit: int = 8
) -> list[Checkpointing]:
    """The blocks (the children of the model's largest ``nn.ModuleList``/``Sequential`` of repeated blocks, or its
    top-level children) whose recomputation saves the most activation memory on ``batch`` (fake tensors of
    ``fake_mode``; ``forward_context`` is the precision plugin's): each block's saved activations less its input,
    which checkpointing keeps; the cost is the block's forward FLOPs again."""

    blocks = _repeated_blocks(model)
    saved: dict[str, int] = {}
    inputs: dict[str, int] = {}
    handles = []
    current: list[str] = []

    def pre(name: str) -> Any:
        def hook(module: nn.Module, args: tuple) -> None:
            current.append(name)
            inputs[name] = sum(a.untyped_storage().nbytes() for a in args if isinstance(a, torch.Tensor))

        return hook

    def post(name: str) -> Any:
        def hook(module: nn.Module, args: tuple, out: Any) -> None:
            if current and current[-1] == name:
                current.pop()

        return hook

    for name, block in blocks:
        handles += [block.register_forward_pre_hook(pre(name)), block.register_forward_hook(post(name))]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if current and isinstance(t, torch.Tensor):
            saved[current[-1]] = saved.get(current[-1], 0) + t.untyped_storage().nbytes()
        return t

    try:
        with fake_mode, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), forward_context():
            out = model.training_step(batch, 0)
            del out
    except Exception:  # noqa: BLE001 - advice is a nicety: no candidates
        return []
    finally:
        for h in handles:
            h.remove()
    flops = _block_flops(model, blocks, batch, fake_mode, forward_context)
    found = [
        Checkpointing(name, max(0, saved.get(name, 0) - inputs.get(name, 0)), flops.get(name, 0))
        for name, _ in blocks
        if saved.get(name)
    ]
    return sorted(found, key=lambda c: -c.saved_bytes)[:limit]


def _repeated_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's repeated blocks: members of every ``nn.ModuleList``/``nn.Sequential`` whose two or more members
    are modules of one class with modules inside (a GPT's ``blocks.N``, a ResNet's ``layerK.N``), the outermost
    ones; the model's top-level children when it has none."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or len(module) < 2:
            continue
        members = list(module)
        if len({type(m) for m in members}) != 1 or not any(True for _ in members[0].children()):
            continue
        if any(name == f or name.startswith(f + ".") for f, _ in found):
            continue  # inside a block already chosen
        found += [(f"{name}.{i}" if name else str(i), m) for i, m in enumerate(members)]
    return found or list(model.named_children())


def _block_flops(
    model: Any, blocks: list[tuple[str, nn.Module]], batch: Any, fake_mode: Any, forward_context: Callable[[], Any]
) -> dict[str, int]:
    """Each block's forward hardware FLOPs at this batch (its recompute cost), from one counted forward."""
    from lit_compute.flops.counting import SafeFlopCounterMode

    counter = SafeFlopCounterMode(display=False, depth=99, module_paths=model, hookless=True)
    try:
        with fake_mode, counter, torch.no_grad(), forward_context():
            model.training_step(batch, 0)
    except Exception:  # noqa: BLE001 - the user's step on fake tensors: no advice, never a failure
        return {}
    by_module = counter.result().forward_by_module
    return {name: by_module.get(name, 0) for name, _ in blocks}
