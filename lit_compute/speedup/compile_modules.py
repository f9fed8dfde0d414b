"""``CompileModules``: ``torch.compile`` a LightningModule's submodules in place, from a config line."""

from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lit_compute._validate import validated

_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict)


def compile_targets(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The submodules a training step calls: the LightningModule's direct children, with each element of a
    ``ModuleList``/``ModuleDict`` child in its place (containers are never called themselves)."""
    targets: list[torch.nn.Module] = []
    for child in module.children():
        if isinstance(child, _CONTAINERS):
            targets += compile_targets(child)
        else:
            targets.append(child)
    return targets


class CompileModules(Callback):
    """``torch.compile`` each submodule a training step calls (``nn.Module.compile``, in place) at
    ``on_train_start``.

    Lightning compiles a model handed to ``trainer.fit`` as ``torch.compile(model)``, which a YAML config cannot
    express, and compiling the LightningModule itself does nothing when its ``training_step`` calls ``self.net(x)``
    rather than ``self(x)``. Compiling the direct children (the elements of a ``ModuleList`` such as a
    transformer's blocks) covers both and keeps the module's class, hooks and checkpoint keys unchanged. The
    first steps compile (StepTimeMonitor and FlopsLogger leave them out of their figures).

    Args:
        mode: ``torch.compile``'s mode.
        dynamic: ``torch.compile``'s ``dynamic`` (None: torch decides after a shape changes).
        fullgraph: Refuse graph breaks.
        backend: ``torch.compile``'s backend (``"inductor"``; ``"eager"`` traces without generating code).

    Example:
        >>> import lightning.pytorch as pl
        >>> trainer = pl.Trainer(callbacks=[CompileModules()], accelerator="cpu", max_steps=1)
    """

    @validated
    def __init__(
        self,
        mode: Literal["default", "reduce-overhead", "max-autotune"] = "default",
        dynamic: bool | None = None,
        fullgraph: bool = False,
        backend: str = "inductor",
    ) -> None:
        self.mode = mode
        self.dynamic = dynamic
        self.fullgraph = fullgraph
        self.backend = backend
        self.compiled: list[str] = []

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # after Lightning's model summary: its forward of example_input_array runs with hooks on every layer,
        # which Dynamo would trace into (and fail on) inside a compiled submodule
        if self.compiled:  # a second fit on the same trainer: already compiled
            return
        for target in compile_targets(pl_module):
            if self.backend == "inductor":
                target.compile(mode=self.mode, dynamic=self.dynamic, fullgraph=self.fullgraph)
            else:  # torch.compile takes a mode only with inductor
                target.compile(backend=self.backend, dynamic=self.dynamic, fullgraph=self.fullgraph)
            self.compiled.append(type(target).__name__)
