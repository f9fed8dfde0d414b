"""The counting engine: ``torch.utils.flop_counter.FlopCounterMode`` with the missing attention formulas,
failure-safe counting, stable module paths, and :func:`count_flops`.

Convention: one multiply-add = 2 FLOPs; matmul, convolution and attention (every SDPA backend, the
``nn.MultiheadAttention`` fast path, the fused ``nn.TransformerEncoderLayer`` path) are counted;
elementwise ops, normalisation, pooling and softmax are not. This is the convention of torchvision's
published ``_ops`` figures (GMACs, so FLOPs = 2 x ``_ops``) and of MFU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import FlopCounterMode

from lit_compute._compat import eager_compiled_code, seed_module_names
from lit_compute.flops.formulas import extra_formulas

# Ops that do heavy arithmetic: seen without a formula, they make a count a lower bound (we say so).
_HEAVY_OP = re.compile(r"(conv|mm|matmul|attention|linear|lstm|gru|rnn|einsum|tensordot)", re.IGNORECASE)
_ROOT = "model"


@dataclass
class FlopCount:
    """FLOPs of one forward (+ backward) pass.

    Attributes:
        forward: FLOPs of the forward pass.
        backward: FLOPs of the backward pass (0 when not counted).
        by_module: module path (``""`` excluded; ``"layer1"``, ``"layer1.0.conv1"`` ...) -> forward + backward FLOPs.
        forward_by_module: module path -> forward FLOPs.
        by_op: op name (``"aten.convolution"``) -> FLOPs, forward + backward.
        uncounted_ops: heavy ops that ran without a FLOP formula (the count is then a lower bound).
        errors: formula failures (the count is then a lower bound).
    """

    forward: int = 0
    backward: int = 0
    by_module: dict[str, int] = field(default_factory=dict)
    forward_by_module: dict[str, int] = field(default_factory=dict)
    by_op: dict[str, int] = field(default_factory=dict)
    uncounted_ops: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.forward + self.backward

    @property
    def complete(self) -> bool:
        """True when every heavy op had a formula and no formula failed."""
        return not self.uncounted_ops and not self.errors

    def table(self, depth: int = 2) -> list[tuple[str, int, int]]:
        """``(module path, forward FLOPs, forward + backward FLOPs)`` rows up to ``depth`` levels deep."""
        rows = []
        for path in sorted(self.by_module):
            if path.count(".") + 1 <= depth:
                rows.append((path, self.forward_by_module.get(path, 0), self.by_module[path]))
        return rows


class SafeFlopCounterMode(FlopCounterMode):
    """``FlopCounterMode`` with lit_compute's extra formulas that never raises from a formula.

    A formula that fails (an unexpected shape, a nested tensor) is recorded in :attr:`errors` and the op's
    result is returned untouched, so counting inside a real training step cannot break the step. Heavy ops
    without a formula are recorded in :attr:`uncounted`.
    """

    def __init__(self, root: nn.Module | None = None, depth: int = 99) -> None:
        super().__init__(depth=depth, display=False, custom_mapping=extra_formulas())
        self.errors: list[str] = []
        self.uncounted: set[str] = set()
        self._root = root

    def __enter__(self) -> SafeFlopCounterMode:
        super().__enter__()
        if self._root is not None:
            seed_module_names(self.mod_tracker, self._root, _ROOT)
        return self

    def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        if func_packet not in self.flop_registry:
            name = str(func_packet)
            if _HEAVY_OP.search(name.split(".")[-1]):
                self.uncounted.add(name)
            return out
        try:
            return super()._count_flops(func_packet, out, args, kwargs)
        except Exception as err:  # noqa: BLE001 - counting must never break the computation
            self.errors.append(f"{func_packet}: {type(err).__name__}: {err}")
            return out

    # -- reading -----------------------------------------------------------------------------------
    def snapshot(self) -> tuple[int, dict[str, int], dict[str, int]]:
        """``(total, by_module, by_op)`` so far."""
        counts = self.get_flop_counts()
        total = sum(counts.get("Global", {}).values())
        by_module: dict[str, int] = {}
        for name, ops in counts.items():
            path = _module_path(name)
            if path:
                by_module[path] = sum(ops.values())
        by_op = {str(op): n for op, n in counts.get("Global", {}).items()}
        return total, by_module, by_op


def _module_path(name: str) -> str | None:
    if name.startswith(_ROOT + "."):
        return name[len(_ROOT) + 1 :]
    return None


def build_count(
    counter: SafeFlopCounterMode, forward_snapshot: tuple[int, dict[str, int], dict[str, int]] | None
) -> FlopCount:
    """A :class:`FlopCount` from a finished counter and the snapshot taken when the forward ended."""
    total, by_module, by_op = counter.snapshot()
    fwd_total, fwd_modules, _ = forward_snapshot if forward_snapshot is not None else (total, by_module, by_op)
    # convolution backward variants are covered by the convolution_backward formula
    uncounted = sorted(op for op in counter.uncounted if "backward" not in op or "convolution" not in op)
    return FlopCount(
        forward=fwd_total,
        backward=total - fwd_total,
        by_module=by_module,
        forward_by_module=fwd_modules,
        by_op=by_op,
        uncounted_ops=uncounted,
        errors=list(counter.errors),
    )


def _to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_like(x, device="meta").requires_grad_(x.requires_grad)
    return x


def _grad_outputs(out: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(out)
    return [t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]


def _run(model: nn.Module, args: tuple, kwargs: dict, backward: bool, params: list[torch.Tensor],
         call: Any) -> FlopCount:
    counter = SafeFlopCounterMode(root=model)
    leaves = [p for p in params if p.requires_grad]
    leaves += [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    saved_grads = [t.grad for t in leaves]
    try:
        for t in leaves:
            t.grad = None
        with counter:
            out = call(args, kwargs)
            fwd = counter.snapshot()
            if backward:
                outputs = _grad_outputs(out)
                if not outputs:
                    raise RuntimeError(
                        "count_flops(backward=True): the model's output has no floating tensor that requires grad"
                    )
                # .backward rather than autograd.grad: torch's ModuleTracker hooks refuse autograd.grad on leaves.
                torch.autograd.backward(outputs, grad_tensors=[torch.ones_like(o) for o in outputs])
    finally:
        for t, g in zip(leaves, saved_grads):
            t.grad = g
    return build_count(counter, fwd if backward else None)


def _count_meta(model: nn.Module, args: tuple, kwargs: dict, backward: bool) -> FlopCount:
    params = {n: _to_meta(p) for n, p in model.named_parameters(remove_duplicate=False)}
    buffers = {n: _to_meta(b) for n, b in model.named_buffers(remove_duplicate=False)}
    margs, mkwargs = tree_map(_to_meta, args), tree_map(_to_meta, kwargs)

    def call(a: tuple, k: dict) -> Any:
        return torch.func.functional_call(model, {**params, **buffers}, a, k, strict=False)

    return _run(model, margs, mkwargs, backward, list(params.values()), call)


def _count_real(model: nn.Module, args: tuple, kwargs: dict, backward: bool) -> FlopCount:
    saved_buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    try:
        return _run(model, args, kwargs, backward, list(model.parameters()), lambda a, k: model(*a, **k))
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(saved_buffers[n])


def count_flops(
    model: nn.Module,
    *args: Any,
    backward: bool = True,
    count_on: Literal["auto", "meta", "real"] = "auto",
    **kwargs: Any,
) -> FlopCount:
    """Count the FLOPs of ``model(*args, **kwargs)``, and of its backward pass.

    Training is not affected: no parameter or gradient is touched, buffers (BatchNorm statistics) are
    restored, and the RNG state is restored. ``count_on="meta"`` runs the model on meta tensors (shapes only:
    no arithmetic, no memory for activations); ``"real"`` runs it on the inputs' device so PyTorch takes the
    same kernel path as in training (e.g. ``nn.MultiheadAttention``'s fast path under ``inference_mode``);
    ``"auto"`` tries meta and falls back to real for models that cannot run on meta (data-dependent shapes).
    The forward runs in the caller's grad mode (so ``no_grad``/``inference_mode`` paths are what is counted);
    the backward, when asked for, is the gradient of every floating output with respect to the parameters.

    Convention: one multiply-add = 2 FLOPs; matmul, convolution and attention count, elementwise ops do not.

    Args:
        model: Any ``nn.Module`` (a DDP or ``torch.compile`` wrapper is unwrapped: the original module is counted).
        *args: Positional inputs of the forward.
        backward: Also count the backward pass.
        count_on: ``"auto"``, ``"meta"`` or ``"real"`` (see above).
        **kwargs: Keyword inputs of the forward.

    Returns:
        A :class:`FlopCount`.

    Example:
        >>> import torchvision
        >>> c = count_flops(torchvision.models.resnet50().eval(), torch.zeros(1, 3, 224, 224), backward=False)
        >>> round(c.forward / 1e9, 2)
        8.18
    """
    if count_on not in ("auto", "meta", "real"):
        raise ValueError(f"count_flops(count_on={count_on!r}) must be 'auto', 'meta' or 'real'")
    model = unwrap_model(model)
    devices = [d for d in {t.device for t in model.parameters()} if d.type == "cuda"]
    grad_ctx = torch.inference_mode(False) if backward else _nullcontext()
    with torch.random.fork_rng(devices=[d.index or 0 for d in devices]), eager_compiled_code(), grad_ctx:
        enable = torch.enable_grad() if backward else _nullcontext()
        with enable:
            if count_on in ("auto", "meta"):
                try:
                    return _count_meta(model, args, kwargs, backward)
                except Exception:
                    if count_on == "meta":
                        raise
            return _count_real(model, args, kwargs, backward)


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def unwrap_model(model: nn.Module) -> nn.Module:
    """The original module under DDP/FSDP-style ``.module`` and ``torch.compile``'s ``._orig_mod`` wrappers."""
    seen = 0
    while seen < 10:
        seen += 1
        if hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        elif type(model).__name__ in ("DistributedDataParallel", "DataParallel") and hasattr(model, "module"):
            model = model.module
        else:
            break
    return model
