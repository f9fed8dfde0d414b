"""What of a model changes its FLOPs while the batch shape stays: its module structure, each module's train/eval
mode, and which parameters require gradients (fine-tuning that unfreezes a backbone roughly triples its backward).

:class:`ModelState` turns those into a small key that joins the batch signature in
:class:`~lit_compute.flops.count_book.CountBook`, so a change of any of them counts again. The key is stable across
processes (a checkpoint's counts still apply after resume): digests of the module paths and classes, of the modes
and of the gradient flags. Reading it costs one walk over the modules per batch (about 0.1 ms for a ResNet-50 on
one CPU core); the structure digest is computed once per distinct set of module objects.
"""

from __future__ import annotations

import hashlib

from torch import nn

from lit_compute._compat import module_flags

__all__ = ["ModelState"]


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=6).hexdigest()


class ModelState:
    """Keys of a model's FLOP-relevant state (see the module docstring)."""

    def __init__(self) -> None:
        self._digests: dict[tuple[int, ...], str] = {}

    def key(self, model: nn.Module) -> tuple[str, str, str, int]:
        """``(structure digest, train-mode digest, requires-grad digest, parameters requiring gradients)`` now."""
        ids, training, grads, trainable = module_flags(model)
        digest = self._digests.get(ids)
        if digest is None:
            text = "\n".join(f"{path}:{type(m).__qualname__}" for path, m in model.named_modules())
            digest = _digest(text.encode())
            self._digests = {ids: digest}  # one model at a time: keep the latest only
        return digest, _digest(training), _digest(grads), trainable

    @staticmethod
    def placement(model: nn.Module) -> str:
        """A digest of every parameter's and buffer's dtype and device: what ``model.to(torch.float64)`` or a device
        move changes while the structure stays (the memory a step holds, not its FLOPs)."""
        tensors = [*model.parameters(), *model.buffers()]
        return _digest("|".join(f"{t.dtype}@{t.device}" for t in tensors).encode())

    @staticmethod
    def describe(before: tuple[str, str, str, int], after: tuple[str, str, str, int]) -> str:
        """What changed between two keys, in words."""
        changes = []
        if before[0] != after[0]:
            changes.append("the module structure")
        if before[1] != after[1]:
            changes.append("train/eval modes")
        if before[2] != after[2]:
            changes.append(f"which parameters require gradients ({before[3]} -> {after[3]} tensors)")
        return ", ".join(changes) or "nothing"
