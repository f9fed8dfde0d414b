"""The counting engine: ``torch.utils.flop_counter.FlopCounterMode`` with the missing formulas, model and
hardware FLOPs, a module tracker that cannot break autograd, stable module paths, and :func:`count_flops`.

Convention: one multiply-add = 2 FLOPs; matmul, convolution, attention (every SDPA backend, the
``nn.MultiheadAttention`` fast path, the fused ``nn.TransformerEncoderLayer`` path), expert and recurrent
matmuls are counted; elementwise ops, normalisation, pooling and softmax are not. This is the convention of
torchvision's published ``_ops`` figures (GMACs, so FLOPs = 2 x ``_ops``) and of MFU.

Two counts, PaLM's definitions (Chowdhery et al. 2022, appendix B):

- **model FLOPs**: the forward and backward of the model as written. Activation recomputation
  (``torch.utils.checkpoint``) is not counted, and every attention backward counts 2 x its forward (the four
  matmuls of the math path) whichever kernel ran, so the meta path and real kernels agree. MFU uses these.
- **hardware FLOPs**: everything the step executed: the recomputed forward of checkpointed segments and the
  score recomputation inside fused attention backward kernels included. HFU uses these.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Literal

import torch
from torch import nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from lit_compute._batch import batch_size
from lit_compute._compat import (
    compiled_original,
    eager_compiled_code,
    in_backward,
    returns_only_views,
    seed_module_names,
    suggests_channels_last,
    tree_flatten,
    tree_leaves,
    tree_map,
)
from lit_compute.flops.formulas import attention_recompute_flops, extra_formulas, unneeded_input_grad_flops
from lit_compute.flops.kernel_shapes import GEMM_CLASSES, KernelShape, gemm_shapes
from lit_compute.flops.module_tracker import HooklessModuleTracker

_ROOT = "model"
#: Ops after which the FLOPs of a batch depend on its values, not only its shapes: the nested tensors the
#: ``nn.TransformerEncoder`` fast path builds from a padding mask, and packed sequences of an RNN.
VALUE_DEPENDENT_OPS = frozenset({"aten._nested_tensor_from_mask", "aten._pack_padded_sequence"})
# Ops whose names say they do heavy arithmetic: seen without a formula, they make a count a lower bound.
_HEAVY_TOKENS = {
    "mm",
    "bmm",
    "addmm",
    "baddbmm",
    "addbmm",
    "matmul",
    "einsum",
    "tensordot",
    "linear",
    "bilinear",
    "trilinear",
    "lstm",
    "gru",
    "rnn",
    "attention",
    "convolution",
}
_NOT_HEAVY_TOKENS = {"cell", "upsample", "convert", "pack", "backward_impl"}


#: The op classes bytes and FLOPs are kept by (``FlopCount.by_class``): what a roofline needs to price a step on
#: other hardware (matmuls and convolutions are compute-bound, the rest mostly memory-bound; convolutions are kept apart
#: from matmuls because chips reach different fractions of their peak on them, and grouped and depthwise convolutions
#: apart from dense ones because they reach far less: few FLOPs per byte, kernels without tensor-core tiles).
OP_CLASSES = ("matmul", "conv", "conv_grouped", "conv_depthwise", "attention", "norm", "elementwise", "optimizer")
_NORM_TOKENS = ("layer_norm", "batch_norm", "group_norm", "rms_norm", "instance_norm")


def op_class(name: str, optimizer: bool = False) -> str:
    """The class of an op (``aten.addmm`` -> ``matmul``, ``aten.convolution_backward`` -> ``conv``); ``optimizer`` for
    every op of an optimizer's step."""
    lowered = name.lower()
    if optimizer or lowered.split(".")[-1].startswith(("_foreach", "_fused_adam", "_fused_sgd")):
        return "optimizer"
    if "attention" in lowered or "sdpa" in lowered:
        return "attention"
    if any(t in lowered for t in _NORM_TOKENS):
        return "norm"
    if is_heavy_op(name):
        return "conv" if any(t.startswith("conv") for t in re.split(r"[._]", lowered.split("::")[-1])) else "matmul"
    return "elementwise"


def _op_name(name: str) -> str:
    """An op's name without namespace and overload:
    ``aten.convolution_backward.default`` -> ``convolution_backward``."""
    return name.split("::")[-1].split(".")[-2 if name.count(".") >= 2 else -1]


def conv_class(name: str, args: Any) -> str:
    """``conv``, ``conv_grouped`` or ``conv_depthwise`` for a convolution op (forward or backward) from its ``groups``
    argument and its weight: depthwise when every group holds one input channel (MobileNet's and EfficientNet's
    3x3 convolutions), grouped for other groups above one (ResNeXt's), dense otherwise."""
    if not isinstance(args, (tuple, list)):
        return "conv"
    op = _op_name(name)
    # aten.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups);
    # aten.convolution_backward(grad_output, input, weight, bias_sizes, ..., output_padding, groups, output_mask)
    at = {"convolution": (1, 8), "convolution_backward": (2, 9), "_convolution": (1, 8)}.get(op)
    if at is None or len(args) <= at[1]:
        return "conv"
    weight, groups = args[at[0]], args[at[1]]
    if not isinstance(groups, int) or groups <= 1 or not isinstance(weight, torch.Tensor) or weight.dim() < 2:
        return "conv"
    return "conv_depthwise" if weight.shape[1] == 1 else "conv_grouped"


def channels_first_tensors(name: str, args: Any, out: Any) -> tuple[int, int, int]:
    """``(activation bytes, weight bytes, tensors)`` that a GPU's tensor cores transpose for one 2-D convolution op
    that runs channels-first: cuDNN convolves 16-bit tensors channels-last (NHWC), so it transposes each operand in
    and each result back. PyTorch hands cuDNN channels-first tensors when neither the input's nor the weight's
    suggested memory format is channels-last (:func:`lit_compute._compat.suggests_channels_last`). The forward
    transposes its input, weight and output; the backward's data gradient its output gradient, weight and input
    gradient, and its weight gradient its input, output gradient and weight gradient (each is its own cuDNN call).
    Zero for a channels-last convolution and for any other op."""
    if not isinstance(args, (tuple, list)):
        return 0, 0, 0
    op = _op_name(name)
    results = list(out) if isinstance(out, (tuple, list)) else [out]
    if op in ("convolution", "_convolution") and len(args) >= 2:
        data, weight = args[0], args[1]
        activations, weights = [data, results[0]], [weight]
    elif op == "convolution_backward" and len(args) >= 3 and len(results) >= 2:
        grad_out, data, weight = args[0], args[1], args[2]
        grad_in, grad_weight = results[0], results[1]
        activations, weights = [], []
        if isinstance(grad_in, torch.Tensor):
            activations += [grad_out, grad_in]
            weights.append(weight)
        if isinstance(grad_weight, torch.Tensor):
            activations += [data, grad_out]
            weights.append(grad_weight)
    else:
        return 0, 0, 0
    if (
        not (
            isinstance(data, torch.Tensor)
            and isinstance(weight, torch.Tensor)
            and data.dim() == 4
            and weight.dim() == 4
        )
        or suggests_channels_last(data)
        or suggests_channels_last(weight)
    ):
        return 0, 0, 0
    tensors = [t for t in activations + weights if isinstance(t, torch.Tensor)]
    return (sum(_nbytes(t) for t in activations), sum(_nbytes(t) for t in weights), len(tensors))


def conv_weight_bytes(name: str, args: Any) -> int:
    """The bytes of the weight a convolution's forward op takes (``aten.convolution``'s second operand); 0 for its
    backward and any other op. On a CPU oneDNN reorders that weight into its blocked layouts every call, forward and
    backward, work that does not grow with the batch."""
    if _op_name(name) not in ("convolution", "_convolution") or not isinstance(args, (tuple, list)) or len(args) < 2:
        return 0
    return _nbytes(args[1])


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) and not t.is_nested else 0


def is_heavy_op(name: str) -> bool:
    """True for ops whose name says matmul/convolution/attention/RNN (``aten._grouped_mm``, ``aten.mkldnn_rnn_layer``),
    false for elementwise look-alikes (``lgamma``, ``upsample_bilinear2d``, ``_thnn_fused_lstm_cell``)."""
    tokens = [t for t in re.split(r"[._]", name.split("::")[-1].lower()) if t]
    if not tokens or any(t in _NOT_HEAVY_TOKENS for t in tokens):
        return False
    return any(t in _HEAVY_TOKENS or t.startswith("conv") or (t.endswith("mm") and len(t) <= 8) for t in tokens)


@dataclass
class FlopCount:
    """FLOPs of one forward (+ backward) pass.

    Attributes:
        forward: Model FLOPs of the forward pass.
        backward: Model FLOPs of the backward pass (0 when not counted): no recomputation, attention backward
            = 2 x its forward.
        hardware: Every FLOP executed: forward, backward, recomputed checkpoint segments and fused-attention score
            recomputation (equal to ``forward + backward`` when nothing is recomputed).
        recompute: The recomputed part of ``hardware``.
        by_module: module path (``"layer1"``, ``"layer1.0.conv1"``; the root excluded) -> model FLOPs, forward +
            backward.
        forward_by_module: module path -> model forward FLOPs.
        by_op: op name (``"aten.convolution"``) -> hardware FLOPs, forward + backward.
        uncounted_ops: heavy ops that ran without a FLOP formula (the count is then a lower bound).
        errors: formula failures (the count is then a lower bound).
        unnamed_modules: module class -> why the module tracker could not name it: its FLOPs are in the totals and
            its parents' rows, not under its own name in ``by_module``.
        value_dependent: ops whose FLOPs depend on the values of their inputs, not only on shapes (a nested tensor
            built from a padding mask, a packed sequence) -> the module paths they ran in: this count holds for
            this batch's values only.
        by_class: op class (:data:`OP_CLASSES`) -> ``(hardware FLOPs, bytes read and written, ops)``: every op
            counts its operands' and results' bytes (a view none), elementwise ops included, and is one kernel; the
            arithmetic intensity of a class is its FLOPs over its bytes.
        bytes_by_module: module path -> bytes its ops read and wrote, forward and backward.
        channels_first: ``(activation bytes, weight bytes, tensors)`` of the dense and grouped 2-D convolutions that
            ran channels-first (:func:`channels_first_tensors`): what a GPU transposes for its tensor cores at 16
            bits, and ``lit_compute.speedup.ChannelsLast`` saves.
        conv_weights: bytes of the weights the convolutions' forward ops took (each weight once a call,
            :func:`conv_weight_bytes`): what a CPU's convolutions set up whatever the batch.
        kernels: the GEMMs of the matmuls, the dense and grouped convolutions and the fused attention kernels, one
            :class:`~lit_compute.flops.kernel_shapes.KernelShape` per class and shape: what ``whatif`` prices as
            tiles and waves on a GPU's SMs.
    """

    forward: int = 0
    backward: int = 0
    hardware: int = 0
    recompute: int = 0
    by_module: dict[str, int] = field(default_factory=dict)
    forward_by_module: dict[str, int] = field(default_factory=dict)
    by_op: dict[str, int] = field(default_factory=dict)
    uncounted_ops: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    value_dependent: dict[str, list[str]] = field(default_factory=dict)
    unnamed_modules: dict[str, str] = field(default_factory=dict)
    by_class: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    bytes_by_module: dict[str, int] = field(default_factory=dict)
    channels_first: tuple[int, int, int] = (0, 0, 0)
    conv_weights: int = 0
    kernels: tuple[KernelShape, ...] = ()

    @property
    def bytes(self) -> int:
        """Bytes every op of the count read and wrote (views move nothing)."""
        return sum(v[1] for v in self.by_class.values())

    @property
    def total(self) -> int:
        """Model FLOPs, forward + backward."""
        return self.forward + self.backward

    @property
    def complete(self) -> bool:
        """True when every heavy op had a formula and no formula failed."""
        return not self.uncounted_ops and not self.errors

    def table(self, depth: int = 2) -> list[tuple[str, int, int]]:
        """``(module path, model forward FLOPs, model forward + backward FLOPs)`` rows up to ``depth`` levels deep."""
        rows = []
        for path in sorted(self.by_module):
            if path.count(".") + 1 <= depth:
                rows.append((path, self.forward_by_module.get(path, 0), self.by_module[path]))
        return rows


def _phase() -> str:
    """``"forward"``, ``"backward"`` or ``"recompute"`` (a checkpointed segment re-running its forward in backward)."""
    if not in_backward():
        return "forward"
    if not torch.is_grad_enabled():
        return "backward"
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:  # grad enabled inside backward: checkpoint recomputation, or create_graph=True
        if frame.f_code.co_filename.replace("\\", "/").endswith("torch/utils/checkpoint.py"):
            return "recompute"
        frame = frame.f_back
    return "backward"


class SafeFlopCounterMode(FlopCounterMode):
    """``torch.utils.flop_counter.FlopCounterMode`` with lit_compute's formulas, model and hardware FLOPs, and no
    formula that can raise.

    A drop-in for ``FlopCounterMode``: the same constructor (``mods``, ``depth``, ``display``, ``custom_mapping``),
    the same module names (``ResNet.layer1``), the same ``get_total_flops()`` / ``get_flop_counts()`` /
    ``get_table()``. Differences, all additive:

    - lit_compute's formulas (:mod:`lit_compute.flops.formulas`) are registered under the user's
      ``custom_mapping`` (which wins on a clash), and depthwise-convolution backward is counted correctly;
    - a formula that fails (an unexpected shape) is recorded in :attr:`errors` instead of raising, and heavy
      ops without a formula in :attr:`uncounted`, so counting inside a real training step cannot break it;
    - :meth:`result` splits the count into model and hardware FLOPs (see :mod:`lit_compute.flops.counting`).
      ``get_total_flops()`` stays torch's figure: everything executed (hardware FLOPs).

    Options (keyword-only, off by default):

    Args:
        mods: Accepted and ignored, as by ``FlopCounterMode``.
        depth: Depth of the printed table.
        display: Print the table on exit.
        custom_mapping: ``{op: formula}`` added to the registry.
        module_paths: Name modules by their path in this module (``model.layer1``, stable whichever wrapper -
            DDP, ``torch.compile``, a LightningModule - the forward was entered through) instead of torch's
            class-name naming.
        hookless: Track modules with :class:`HooklessModuleTracker` (no autograd hooks: ``torch.autograd.grad``
            and double backward inside the counted code keep working).
    """

    def __init__(
        self,
        mods: nn.Module | list[nn.Module] | None = None,
        depth: int = 2,
        display: bool = True,
        custom_mapping: dict[Any, Any] | None = None,
        *,
        module_paths: nn.Module | None = None,
        hookless: bool = False,
    ) -> None:
        super().__init__(
            mods=mods, depth=depth, display=display, custom_mapping={**extra_formulas(), **(custom_mapping or {})}
        )
        self.errors: list[str] = []
        self.uncounted: set[str] = set()
        self._module_paths = module_paths
        self._hookless = hookless
        self._step_hook: Any = None  # the optimizer step post-hook while the mode is entered
        if hookless:
            self.mod_tracker = HooklessModuleTracker()
        self._reset_counts()

    @classmethod
    def for_module(cls, module: nn.Module) -> SafeFlopCounterMode:
        """A silent, hookless counter with ``module``'s paths as module names: the one FlopsLogger runs a step under.
        Under tensor parallelism it counts what this device executes: its shards' local ops and, whole, the work
        every peer repeats (modules left unsharded)."""
        return cls(display=False, depth=99, module_paths=module, hookless=True)

    def _reset_counts(self) -> None:
        self._model: dict[str, list[int]] = {}  # module -> [forward, backward] model FLOPs
        self._recompute = 0
        self._value_dependent: dict[str, set[str]] = {}  # op -> module paths it ran in
        self._by_class: dict[str, list[int]] = {}  # op class -> [hardware FLOPs, bytes read and written, ops]
        self._bytes_by_module: dict[str, int] = {}
        self._channels_first = [0, 0, 0]  # activation bytes, weight bytes, tensors (channels_first_tensors)
        self._conv_weights = 0  # the forward convolutions' weights (conv_weight_bytes)
        self._kernels: dict[tuple[str, int, int, int, int, str], list[float]] = {}  # shape -> [count, flops, bytes]
        self._overload: Any = None  # the op being counted (set by the dispatch mode: its schema says view or not)
        #: set to True for the ops of an optimizer's step (FlopsLogger's on_before_optimizer_step); back to False as
        #: each optimizer's step ends, so a second forward after a step (a GAN's generator after its discriminator's
        #: step, under manual optimization) is its own classes again
        self.in_optimizer_step = False

    def _optimizer_stepped(self, *_: Any) -> None:
        self.in_optimizer_step = False

    def __enter__(self) -> SafeFlopCounterMode:
        self._reset_counts()
        self.errors.clear()
        self.uncounted.clear()
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._step_hook = register_optimizer_step_post_hook(self._optimizer_stepped)
        super().__enter__()
        if _SafeCountingMode is not None and type(self.mode) is _SafeCountingMode.__base__:
            self.mode.__class__ = _SafeCountingMode  # DTensor shards, nested tensors, no failure reaches the step
        if self._module_paths is not None:
            seed_module_names(self.mod_tracker, self._module_paths, _ROOT)
        return self

    def _op_bytes(self, args: Any, kwargs: Any, out: Any) -> int:
        """Bytes an op reads and writes: its tensor operands and results; 0 for a view (its result aliases an
        operand: nothing moves) and for a metadata query (no tensor result)."""
        results = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not results:  # a metadata query (prim.device, sizes): no kernel, nothing moved
            return 0
        if returns_only_views(self._overload):
            return 0
        return sum(_nbytes(t) for t in tree_leaves((args, kwargs))) + sum(_nbytes(t) for t in results)

    def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        try:
            phase = _phase()
            if phase == "forward" and isinstance(self.mod_tracker, HooklessModuleTracker):
                self.mod_tracker.note_forward_op(args)
            if str(func_packet) in VALUE_DEPENDENT_OPS:
                self._value_dependent.setdefault(str(func_packet), set()).update(set(self.mod_tracker.parents))
            moved = self._op_bytes(args, kwargs, out)
            kind = op_class(str(func_packet), self.in_optimizer_step)
            if kind == "conv":
                kind = conv_class(str(func_packet), args)
                self._conv_weights += conv_weight_bytes(str(func_packet), args)
                if kind != "conv_depthwise":
                    for i, n in enumerate(channels_first_tensors(str(func_packet), args, out)):
                        self._channels_first[i] += n
            parents = set(self.mod_tracker.parents)
            if moved:
                book = self._by_class.setdefault(kind, [0, 0, 0])
                book[1] += moved
                book[2] += 1  # a kernel that moves data (views launch none)
                for parent in parents:
                    self._bytes_by_module[parent] = self._bytes_by_module.get(parent, 0) + moved
            formula = self.flop_registry.get(func_packet)
            if formula is None:
                if is_heavy_op(str(func_packet)):
                    self.uncounted.add(str(func_packet))
                return out
            hardware = int(formula(*args, **kwargs, out_val=out))
            self._by_class.setdefault(kind, [0, 0, 0])[0] += hardware
            if hardware and kind in GEMM_CLASSES:
                self._note_kernels(kind, str(func_packet), args, out, phase != "forward", hardware, moved)
            recompute = hardware if phase == "recompute" else attention_recompute_flops(func_packet, args, hardware)
            model = hardware - recompute - (unneeded_input_grad_flops(func_packet, args) if phase != "forward" else 0)
            self._recompute += recompute
            column = 0 if phase == "forward" else 1
            for parent in parents:
                self.flop_counts[parent][func_packet] += hardware
                self._model.setdefault(parent, [0, 0])[column] += model
        except Exception as err:  # noqa: BLE001 - counting must never break the computation
            self.errors.append(f"{func_packet}: {type(err).__name__}: {err}")
        return out

    def _note_kernels(self, kind: str, name: str, args: Any, out: Any, backward: bool, flops: int, moved: int) -> None:
        """Book an op's GEMMs (:func:`~lit_compute.flops.kernel_shapes.gemm_shapes`) under its class, its FLOPs and
        bytes shared among them as their multiply-adds are."""
        shapes = gemm_shapes(name, args, out, backward)
        work = [s.m * s.n * s.k * s.b for s in shapes]
        total = sum(work)
        if not total:
            return
        for shape, share in zip(shapes, work):
            book = self._kernels.setdefault((kind, *shape), [0, 0, 0])
            book[0] += 1
            book[1] += flops * share / total
            book[2] += moved * share / total

    # -- reading -----------------------------------------------------------------------------------
    def get_model_flops(self) -> tuple[int, int]:
        """``(forward, backward)`` model FLOPs so far."""
        forward, backward = self._model.get("Global", [0, 0])
        return forward, backward

    def __exit__(self, *args: Any) -> None:
        hook, self._step_hook = self._step_hook, None
        if hook is not None:
            hook.remove()
        super().__exit__(*args)

    def result(self) -> FlopCount:
        """What was counted, as a :class:`FlopCount` (module paths relative to ``module_paths`` when given)."""
        forward, backward = self.get_model_flops()
        by_module: dict[str, int] = {}
        forward_by_module: dict[str, int] = {}
        for name, (fwd, bwd) in self._model.items():
            path = _module_path(name) if self._module_paths is not None else (None if name == "Global" else name)
            if path:
                by_module[path] = fwd + bwd
                forward_by_module[path] = fwd
        counts = self.get_flop_counts()
        return FlopCount(
            forward=forward,
            backward=backward,
            hardware=self.get_total_flops(),
            recompute=self._recompute,
            by_module=by_module,
            forward_by_module=forward_by_module,
            by_op={str(op): n for op, n in counts.get("Global", {}).items()},
            # convolution backward variants are covered by the convolution_backward formula
            uncounted_ops=sorted(op for op in self.uncounted if "backward" not in op or "convolution" not in op),
            errors=list(self.errors),
            value_dependent={
                op: _deepest(names, self._module_paths is not None) for op, names in self._value_dependent.items()
            },
            unnamed_modules=dict(getattr(self.mod_tracker, "unnamed", {})),
            by_class={k: (v[0], v[1], v[2]) for k, v in self._by_class.items()},
            bytes_by_module={
                path: n
                for name, n in self._bytes_by_module.items()
                if (path := (_module_path(name) if self._module_paths is not None else name))
            },
            channels_first=(self._channels_first[0], self._channels_first[1], self._channels_first[2]),
            conv_weights=self._conv_weights,
            kernels=tuple(
                KernelShape(*key, int(n), float(f), float(b)) for key, (n, f, b) in sorted(self._kernels.items())
            ),
        )


def _has_dtensor(args: Any, kwargs: Any) -> bool:
    module = sys.modules.get("torch.distributed.tensor")  # not imported: no DTensor can exist
    dtensor = getattr(module, "DTensor", None)
    return dtensor is not None and any(isinstance(t, dtensor) for t in tree_leaves((args, kwargs)))


def is_sharded(module: nn.Module) -> bool:
    """True for a module FSDP (``fully_shard`` or ``FullyShardedDataParallel``) or tensor parallelism manages:
    DTensor parameters, or an FSDP unit whose set-up runs lazily at the strategy's first forward (a forward of ours
    before it breaks it: FSDP1 takes the first unit that runs for its root)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    kinds = tuple(
        k
        for k in (getattr(fsdp, "FSDPModule", None), getattr(fsdp, "FullyShardedDataParallel", None))
        if isinstance(k, type)
    )
    if kinds and any(isinstance(m, kinds) for m in module.modules()):
        return True
    return _has_dtensor(tuple(module.parameters()), {})


def _has_fake(args: Any, kwargs: Any) -> bool:
    fake = getattr(sys.modules.get("torch._subclasses.fake_tensor"), "FakeTensor", None)
    return fake is not None and any(isinstance(t, fake) for t in tree_leaves((args, kwargs)))


_InnerMode = getattr(flop_counter, "_FlopCounterMode", None)  # torch >= 2.5: the dispatch mode FlopCounterMode enters


def _has_nested(args: Any, kwargs: Any) -> bool:
    return any(isinstance(t, torch.Tensor) and t.is_nested for t in tree_leaves((args, kwargs)))


if _InnerMode is not None:

    class _SafeCountingMode(_InnerMode):  # type: ignore[misc, valid-type]
        """FlopCounterMode's dispatch mode, made safe to run inside a user's training step and counting what this
        device executes.

        - **DTensor** (tensor parallel, FSDP2 with TP): an op with DTensor arguments is handed to DTensor, whose
          local ops on this rank's shards (after any redistribution) come back through this mode and are counted;
          DTensor's sharding propagation on fake tensors executes nothing and is not counted. Without it a sharded
          matmul counts its global shape on every rank (each of two tensor-parallel ranks would report the whole
          model's FLOPs).
        - **Nested tensors** (``nn.TransformerEncoder``'s padding-mask path, a model's own): torch's mode tries an
          op's Python decomposition when it has no formula, and those read ``sizes()``, which a nested tensor
          refuses ("NestedTensorImpl doesn't support sizes"); ops on nested tensors run as they are.
        - **Any other failure of the counting path** (a decomposition that raises where the op itself does not):
          the op runs as it would without the counter, the failure is recorded in the counter's ``errors`` (the
          count is then a lower bound), and the user's step goes on. An op that fails on its own raises its own
          error, as without the counter."""

        _in_dtensor_op = False

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if _has_dtensor(args, kwargs):
                if self._in_dtensor_op:
                    return NotImplemented  # DTensor runs it on the local shards, through this mode
                self._in_dtensor_op = True
                try:
                    with self:
                        return func(*args, **kwargs)
                finally:
                    self._in_dtensor_op = False
            if self._in_dtensor_op and _has_fake(args, kwargs):
                return func(*args, **kwargs)  # DTensor's sharding propagation: nothing is executed
            if isinstance(func, torch._ops.OpOverload) and _has_nested(args, kwargs):
                return self._run_and_count(func, args, kwargs)
            self.counter._overload = func  # its schema tells a view (no bytes moved) from a copy
            try:
                return super().__torch_dispatch__(func, types, args, kwargs)
            except Exception as err:  # the counting path must not break the user's step
                if not isinstance(func, torch._ops.OpOverload):
                    raise
                out = func(*args, **kwargs)  # raises the op's own error if the op itself fails
                self.counter.errors.append(f"{func}: counting failed ({type(err).__name__}: {err}); ran uncounted")
                return out

        def _run_and_count(self, func: Any, args: Any, kwargs: Any) -> Any:
            out = func(*args, **kwargs)
            return self.counter._count_flops(func._overloadpacket, out, args, kwargs)

else:  # pragma: no cover - torch < 2.5 counts DTensor ops at their global shapes
    _SafeCountingMode = None  # type: ignore[assignment, misc]


def _deepest(names: set[str], relative: bool) -> list[str]:
    """The innermost module paths of a set of tracker names (``Global`` and enclosing modules left out)."""
    paths = [p for n in names if n != "Global" and (p := (_module_path(n) if relative else n))]
    return sorted(p for p in paths if not any(q != p and q.startswith(p + ".") for q in paths)) or ["the model"]


def _module_path(name: str) -> str | None:
    if name.startswith(_ROOT + "."):
        return name[len(_ROOT) + 1 :]
    return None


def _grad_outputs(out: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(out)
    return [t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]


def _run(
    model: nn.Module, args: tuple, kwargs: dict, backward: bool, params: list[torch.Tensor], call: Any
) -> FlopCount:
    counter = SafeFlopCounterMode(display=False, depth=99, module_paths=model, hookless=True)
    leaves = [p for p in params if p.requires_grad]
    leaves += [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    saved_grads = [t.grad for t in leaves]
    try:
        for t in leaves:
            t.grad = None
        with counter:
            out = call(args, kwargs)
            if backward:
                outputs = _grad_outputs(out)
                if not outputs:
                    raise RuntimeError(
                        "count_flops(backward=True): the model's output has no floating tensor that requires grad"
                    )
                torch.autograd.backward(outputs, grad_tensors=[torch.ones_like(o) for o in outputs])
    finally:
        for t, g in zip(leaves, saved_grads):
            t.grad = g
    return counter.result()


def _count_meta(model: nn.Module, args: tuple, kwargs: dict, backward: bool) -> FlopCount:
    memo: dict[int, torch.Tensor] = {}

    def to_meta(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) not in memo:  # tied weights (GPT-2's embedding and head) stay one tensor on meta too
            memo[id(x)] = torch.empty_like(x, device="meta").requires_grad_(x.requires_grad)
        return memo[id(x)]

    params = {n: to_meta(p) for n, p in model.named_parameters(remove_duplicate=False)}
    buffers = {n: to_meta(b) for n, b in model.named_buffers(remove_duplicate=False)}
    margs, mkwargs = tree_map(to_meta, args), tree_map(to_meta, kwargs)

    def call(a: tuple, k: dict) -> Any:
        return torch.func.functional_call(model, {**params, **buffers}, a, k, strict=False, tie_weights=True)

    unique = list({id(t): t for t in params.values()}.values())
    return _run(model, margs, mkwargs, backward, unique, call)


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
    ``forward``/``backward``/``total`` are model FLOPs, ``hardware`` everything executed (see the module docstring).

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
        inner = compiled_original(model)  # torch.compile's wrapper
        if not isinstance(inner, nn.Module) and type(model).__name__ in ("DistributedDataParallel", "DataParallel"):
            inner = getattr(model, "module", None)
        if isinstance(inner, nn.Module):
            model = inner
        else:
            break
    return model


def count_example_forward(module: nn.Module, example: Any) -> FlopCount | None:
    """The forward FLOPs of a module's ``example_input_array``, run in eval mode under ``no_grad`` as Lightning's
    model summary runs it (BatchNorm takes a batch of 1); None when the module cannot take the example."""
    training = module.training
    try:
        module.eval()
        with torch.no_grad():
            args = example if isinstance(example, tuple) else (example,)
            kwargs = example if isinstance(example, dict) else {}
            return count_flops(module, *(() if kwargs else args), backward=False, **kwargs)
    except Exception:  # noqa: BLE001 - an example the model cannot take: the figure comes with the first real count
        return None
    finally:
        module.train(training)


def example_gflops_per_sample(module: nn.Module) -> float | None:
    """The forward GFLOPs per sample of a module's ``example_input_array`` (:func:`count_example_forward`); None
    without an example, for a sharded module (FSDP2 sets itself up at the strategy's first forward, not ours), or
    when the example cannot be counted."""
    example = getattr(module, "example_input_array", None)
    if example is None or is_sharded(module):
        return None
    count = count_example_forward(module, example)
    samples = batch_size(example)
    return count.forward / samples / 1e9 if count is not None and count.forward and samples else None
