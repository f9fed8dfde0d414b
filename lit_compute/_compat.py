"""The one place that touches private attributes of torch / Lightning (each use guarded)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


def seed_module_names(tracker: Any, root: nn.Module, prefix: str) -> bool:
    """Name ``root``'s submodules by their real paths in torch's ``ModuleTracker`` (``prefix.path``).

    ``ModuleTracker`` names modules by the class name of the first module it sees, so the same layer is
    ``ResNet.layer1`` or ``DistributedDataParallel.module._forward_module.net.layer1`` depending on how the
    forward was entered. Seeding its name table gives stable paths. Returns False when the private table
    is not there (another torch version); names then fall back to torch's own.
    """
    known = getattr(tracker, "_known_modules", None)
    seen = getattr(tracker, "_seen_modules", None)
    if known is None or seen is None:
        return False
    for path, module in root.named_modules():
        known[module] = f"{prefix}.{path}" if path else prefix
        seen.add(module)
    return True


@contextlib.contextmanager
def eager_compiled_code() -> Iterator[None]:
    """Run ``torch.compile``d code eagerly (so dispatch-mode counting sees every op), where torch allows."""
    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    if set_stance is None:  # torch < 2.6
        yield
        return
    with set_stance("force_eager"):
        yield


def grad_scaler_scale_tensor(scaler: Any) -> torch.Tensor | None:
    """The GradScaler's current scale as a device tensor (reading it as a number would force a sync)."""
    scale = getattr(scaler, "_scale", None)
    return scale if isinstance(scale, torch.Tensor) else None


def start_profiler_at_step(profiler: Any, step: int) -> None:
    """Start a scheduled ``torch.profiler.profile`` whose step counter begins at ``step`` (a global step), so
    its ``ProfilerStep#N`` ranges carry the trainer's step numbers."""
    profiler.step_num = step
    profiler.current_action = profiler.schedule(step)
    if hasattr(profiler, "_prev_schedule_action"):
        profiler._prev_schedule_action = profiler.current_action
    profiler.start()
