"""HooklessModuleTracker: torch's ``ModuleTracker`` without autograd hooks (as torch keeps its own tracker in
``torch/utils/module_tracker.py``), used by :class:`~lit_compute.flops.SafeFlopCounterMode` to name modules
without breaking the tracked code's autograd."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.module_tracker import ModuleTracker

from lit_compute import _compat
from lit_compute._compat import tree_flatten

__all__ = ["HooklessModuleTracker"]


class HooklessModuleTracker(ModuleTracker):
    """torch's ``ModuleTracker`` without autograd hooks: it cannot break the tracked code's autograd.

    torch's tracker registers gradient hooks on every module's inputs and outputs to see which module's backward
    runs; those hooks raise under ``torch.autograd.grad`` on leaves (gradient penalties), double backward and
    some user hooks. This tracker follows the forward with the same global module hooks (names only) and, in
    the backward, asks autograd which node is executing (``torch._C._current_autograd_node()``) and maps it, by
    its sequence number, to the modules that were running when the forward created it.
    """

    def __init__(self) -> None:
        self._stack: list[str] = []
        self._by_sequence: dict[int, frozenset[str]] = {}
        self.unnamed: dict[str, str] = {}  # module class -> why naming it failed (its FLOPs go to its parents)
        super().__init__()

    @property
    def parents(self) -> set[str]:
        if not _compat.in_backward():
            return {"Global", *self._stack}
        try:
            node = _compat.current_autograd_node()
            found = self._by_sequence.get(_compat.autograd_node_sequence_nr(node)) if node is not None else None
        except Exception:  # noqa: BLE001 - another torch version's internals: attribute to Global only
            found = None
        return set(found) if found else {"Global"}

    @parents.setter
    def parents(self, value: set[str]) -> None:  # ModuleTracker.__init__ assigns {"Global"}
        self._stack = [v for v in value if v != "Global"]

    def note_forward_op(self, args: Any) -> None:
        """Called for each forward op: remember the modules around the autograd node this op just created."""
        if not torch.is_grad_enabled():
            return
        flat, _ = tree_flatten(args)
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in flat):
            self._by_sequence[_compat.last_autograd_sequence_nr()] = frozenset(("Global", *self._stack))

    def _fw_pre_hook(self, mod: nn.Module, input: Any) -> None:
        try:
            self._stack.append(self._get_mod_name(mod))
        except Exception as err:  # noqa: BLE001 - the tracker must never raise inside the tracked code: say it
            if len(self.unnamed) < 16:
                self.unnamed.setdefault(type(mod).__name__, f"{type(err).__name__}: {err}")

    def _fw_post_hook(self, mod: nn.Module, input: Any, output: Any) -> None:
        try:
            name = self._get_mod_name(mod)
            for i in range(len(self._stack) - 1, -1, -1):
                if self._stack[i] == name:
                    del self._stack[i]
                    break
        except Exception:  # noqa: BLE001 - a module hook must never break the user's forward
            pass

    def __exit__(self, *args: Any) -> None:
        super().__exit__(*args)
        self._stack.clear()
