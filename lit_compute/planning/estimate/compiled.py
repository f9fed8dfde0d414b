"""A step under ``torch.compile``: what its graphs hold that the eager step the estimate traces does not.

Inductor's layout optimization (``decide_layout_opt`` in ``torch/_inductor/graph.py``) runs a graph's convolutions in
channels-last. Its forward graph copies each convolution weight that is not channels-last already into that layout and
keeps the copy for the backward graph: for a float32 ResNet-18 that is its convolution weights' 45 MB again, alive
from the forward to each convolution's backward (bench memory's second set measured the compiled ResNet-18 9.2%
above an eager trace; the trace with these copies is within 2% of it). :func:`compiled_layout` traces the step with
the same copies: every 2-d and 3-d convolution's input and weight made channels-last where it is called, above
autograd, so the copy is what its backward keeps.

The decision follows inductor's, for a training graph: on a CPU (oneDNN available) whenever the graph has a
convolution; on CUDA, not when any convolution is grouped with more than one input channel per group, has at most
half as many output channels as input channels with a kernel over 1, or when every convolution has 64 channels or
fewer in and out. Inductor also skips graphs with few convolutions among many nodes (over 300 nodes a convolution),
which a trace of the whole step cannot count per graph: such a model is priced with the copies (more, not less).
Other changes a compiled graph makes (recomputing cheap activations in the backward, fusing) hold less than the
eager step, so the eager trace stays above them.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from lit_compute import _compat

__all__ = [
    "ChannelsLastConvolutions",
    "compiled_layout",
    "inductor_channels_last",
    "keeps_weight_copies",
    "runs_compiled",
]

#: convolution functions (``torch.nn.functional``'s are these objects) -> (the input's rank, its channels-last format)
_FORMATS: dict[Any, tuple[int, torch.memory_format]] = {
    torch.conv2d: (4, torch.channels_last),
    torch.conv_transpose2d: (4, torch.channels_last),
    torch.conv3d: (5, torch.channels_last_3d),
    torch.conv_transpose3d: (5, torch.channels_last_3d),
}


class ChannelsLastConvolutions(TorchFunctionMode):
    """Call each 2-d and 3-d convolution with its input and weight in channels-last, as a graph inductor laid out does
    (a copy where a tensor is in another layout; the copy is what the convolution's backward keeps)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        found = _FORMATS.get(func)
        if found is not None and len(args) >= 2:
            rank, fmt = found
            x, weight = args[0], args[1]
            if isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and x.dim() == weight.dim() == rank:
                args = (x.contiguous(memory_format=fmt), weight.contiguous(memory_format=fmt), *args[2:])
        return func(*args, **(kwargs or {}))


def runs_compiled(pieces: Any) -> bool:
    """Whether the config's step will run under ``torch.compile``: a ``CompileModules`` callback, a module compiled
    already, or a ``compile: true`` hyperparameter (``ImageClassifier`` compiles in ``configure_model``)."""
    from lit_compute.speedup.compile_modules import CompileModules

    callbacks = getattr(pieces.trainer, "callbacks", None) or []
    hparams = getattr(pieces.model, "hparams", None) or {}
    return (
        any(isinstance(c, CompileModules) for c in callbacks)
        or _compat.trains_compiled(pieces.model)
        or hparams.get("compile") is True
    )


def _by_inductor(pieces: Any) -> bool:
    """Whether the compiled step's graphs are inductor's (``CompileModules(backend=...)`` may name another; a module
    compiled already or a ``compile`` hyperparameter uses torch's default, inductor)."""
    from lit_compute.speedup.compile_modules import CompileModules

    backends = {c.backend for c in getattr(pieces.trainer, "callbacks", None) or [] if isinstance(c, CompileModules)}
    return not backends or "inductor" in backends


def inductor_channels_last(model: nn.Module, device: torch.device) -> bool:
    """Whether inductor lays out a training graph of ``model``'s convolutions on ``device`` in channels-last (the
    module docstring says how this follows ``decide_layout_opt``)."""
    allowed, forced = _compat.inductor_layout_optimization()
    if not allowed:
        return False
    kinds = (nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d, nn.ConvTranspose3d)
    convs = [m for m in model.modules() if isinstance(m, kinds)]
    if forced:
        return True
    if not convs:
        return False
    if device.type in ("cpu", "xpu"):
        return bool(torch.backends.mkldnn.enabled) and torch.backends.mkldnn.is_available()
    shapes = [tuple(m.weight.shape) for m in convs]
    grouped = any(m.groups > 1 and m.weight.shape[1] > 1 for m in convs)
    narrowing = any(s[0] * 2 <= s[1] and s[2] > 1 for s in shapes)
    small = all(s[0] <= 64 and s[1] <= 64 for s in shapes)
    return not (grouped or narrowing or small)


def keeps_weight_copies(pieces: Any) -> bool:
    """Whether the step runs compiled by inductor and inductor would lay its convolutions out in channels-last (so
    its graphs keep a channels-last copy of each convolution weight)."""
    device = pieces.trainer.strategy.root_device
    return runs_compiled(pieces) and _by_inductor(pieces) and inductor_channels_last(pieces.model, device)


def compiled_layout(pieces: Any) -> contextlib.AbstractContextManager[Any]:
    """The context a traced step runs in to hold what its compiled graphs hold: :class:`ChannelsLastConvolutions`
    where :func:`keeps_weight_copies`, else nothing."""
    return ChannelsLastConvolutions() if keeps_weight_copies(pieces) else contextlib.nullcontext()
