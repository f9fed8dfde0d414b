"""What of a model changes its FLOPs while the batch shape stays: its module structure, each module's train/eval
mode, and which parameters require gradients (fine-tuning that unfreezes a backbone roughly triples its backward).

:class:`ModelState` turns those into a small key that joins the batch signature in
:class:`~lit_compute.flops.count_book.CountBook`, so a change of any of them counts again. The key is stable across
processes (a checkpoint's counts still apply after resume): the structure is a digest of the module paths and
classes, the modes and gradient flags are bit masks. Reading it costs one walk over the modules and parameters per
batch; the structure digest is computed once per distinct set of module objects.
"""

from __future__ import annotations

import hashlib

from torch import nn

__all__ = ["ModelState"]


def _bits(flags: list[bool]) -> int:
    return sum(1 << i for i, flag in enumerate(flags) if flag)


class ModelState:
    """Keys of a model's FLOP-relevant state (see the module docstring)."""

    def __init__(self) -> None:
        self._digests: dict[tuple[int, ...], str] = {}

    def key(self, model: nn.Module) -> tuple[str, int, int]:
        """``(structure digest, train-mode bits, requires-grad bits)`` of ``model`` now."""
        modules = list(model.named_modules())
        ids = tuple(id(m) for _, m in modules)
        digest = self._digests.get(ids)
        if digest is None:
            text = "\n".join(f"{path}:{type(m).__qualname__}" for path, m in modules)
            digest = hashlib.blake2b(text.encode(), digest_size=6).hexdigest()
            self._digests = {ids: digest}  # one model at a time: keep the latest only
        grads = _bits([p.requires_grad for p in model.parameters()])
        return digest, _bits([m.training for _, m in modules]), grads

    @staticmethod
    def describe(before: tuple[str, int, int], after: tuple[str, int, int]) -> str:
        """What changed between two keys, in words."""
        changes = []
        if before[0] != after[0]:
            changes.append("the module structure")
        if before[1] != after[1]:
            changes.append("train/eval modes")
        if before[2] != after[2]:
            changes.append(f"which parameters require gradients ({bin(before[2]).count('1')} -> "
                           f"{bin(after[2]).count('1')} tensors)")
        return ", ".join(changes) or "nothing"
