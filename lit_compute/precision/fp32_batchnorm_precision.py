"""Mixed or true-bf16 precision with normalisation layers kept in float32: drop-ins for Lightning's
``MixedPrecision`` and ``HalfPrecision``."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Annotated, Any, Literal, cast

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.precision import FSDPPrecision, HalfPrecision, MixedPrecision
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lit_compute._compat import BatchNormBase
from lit_compute._validate import Check, validated

_WHY_16_TRUE = (
    "is refused: with float16 parameters the gradients are float16 too; small ones underflow to zero and a "
    "GradScaler cannot unscale them without float32 master weights. "
)
# each class names what it accepts itself, and the other class for the rest
_REFUSED_16_TRUE = _WHY_16_TRUE + (
    "Use precision='16-mixed' (float16 compute, float32 weights, dynamic loss "
    "scaling), or FP32BatchNormHalfPrecision('bf16-true')"
)
_REFUSED_16_TRUE_HALF = _WHY_16_TRUE + (
    "Use precision='bf16-true' (bfloat16 keeps float32's range), or "
    "FP32BatchNormPrecision('16-mixed') for float16 with loss scaling"
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_USE_HALF = (
    "is a HalfPrecision, not a MixedPrecision: use FP32BatchNormHalfPrecision('bf16-true') (or "
    "lit_compute.fp32_norm_precision('bf16-true'))"
)
_REFUSED = tuple((value, _REFUSED_16_TRUE) for value in ("16-true", "16", "half")) + (("bf16-true", _USE_HALF),)
_REFUSED_HALF = tuple((value, _REFUSED_16_TRUE_HALF) for value in ("16-true", "16", "half")) + (
    ("16-mixed", "is a MixedPrecision: use FP32BatchNormPrecision('16-mixed')"),
    ("bf16-mixed", "is a MixedPrecision: use FP32BatchNormPrecision('bf16-mixed')"),
)
_REFUSED_FSDP = tuple(
    (
        value,
        "is refused: float16 gradients reduced without loss scaling underflow to zero; use '16-mixed' or 'bf16-mixed'",
    )
    for value in ("16-true", "16", "half")
)


def slow_bf16_cpu() -> str | None:
    """Why bfloat16 runs slowly on this CPU, or None: an x86 CPU on which torch uses nothing wider than AVX2 has no
    bfloat16 instructions (AVX512-BF16, AMX), and oneDNN's bfloat16 matmuls and convolutions take a path many
    times slower than float32's."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    capability = str(torch.backends.cpu.get_cpu_capability())
    if "AVX512" in capability or "AMX" in capability:
        return None
    return f"torch's CPU capability here is {capability}: no AVX512-BF16 or AMX"


_SLOW_BF16_WARNED: set[str] = set()


def warn_if_bf16_is_slow_here(name: str, precision: str, device: str | None) -> None:
    """Once per process and plugin: a bfloat16 precision on a CPU without bfloat16 instructions, with the fix."""
    reason = slow_bf16_cpu() if device == "cpu" and str(precision).startswith("bf16") else None
    if reason is None or name in _SLOW_BF16_WARNED:
        return
    _SLOW_BF16_WARNED.add(name)
    from lightning.pytorch.utilities import rank_zero_warn

    rank_zero_warn(
        f"{name}(precision={precision!r}) on this CPU: {reason}, so bfloat16 matmuls and convolutions "
        "run many times slower than float32 here. Train in '32-true' on this machine (leave the plugin "
        "out), or use a CPU with AVX512-BF16 or AMX, or a GPU."
    )


def bf16_is_fast_here(device: str) -> tuple[bool, str]:
    """Whether bfloat16 training is fast on ``device`` and why, in words: a CPU whose torch kernels stop at AVX2 is
    slow without measuring (:func:`slow_bf16_cpu`); any other CPU, and a CUDA device, is asked of the hardware room
    (:func:`~lit_compute.hardware.this_machine.bf16_fast`: the GPU supports bf16; the CPU's measured bf16 speed-up
    of training blocks, cached per machine, reaches its threshold)."""
    if device == "cpu":
        reason = slow_bf16_cpu()
        if reason is not None:
            return False, reason
    if device not in ("cpu", "cuda"):
        return True, f"bf16 on {device} is not measured: kept"
    from lit_compute.hardware.this_machine import bf16_fast

    return bf16_fast(device)


def is_fp32_norm(module: nn.Module, names: list[str]) -> bool:
    """True for every ``_BatchNorm`` (BatchNorm1d/2d/3d, SyncBatchNorm) and classes whose name contains one of
    ``names``."""
    if isinstance(module, BatchNormBase):
        return True
    return any(name in cls.__name__ for cls in type(module).__mro__ for name in names)


def check_fp32_norms(owner: str, fp32_norms: Any) -> list[str]:
    """``fp32_norms`` as a list of class-name fragments, or a ValueError naming the argument and the value."""
    if fp32_norms is None:
        return ["BatchNorm"]
    if isinstance(fp32_norms, str) or not isinstance(fp32_norms, (list, tuple)):
        raise ValueError(
            f"{owner}(fp32_norms={fp32_norms!r}) must be a list of norm class names such as "
            "['BatchNorm', 'LayerNorm'], not a single string"
        )
    bad = [n for n in fp32_norms if not isinstance(n, str) or len(n) < 3 or not _NAME.fullmatch(n)]
    if bad:
        raise ValueError(
            f"{owner}(fp32_norms={list(fp32_norms)!r}): {bad!r} cannot be norm class names; use class-name "
            "fragments of at least 3 letters such as 'BatchNorm', 'GroupNorm', 'LayerNorm', 'RMSNorm'"
        )
    return list(fp32_norms)


def _cast_input_to_fp32(module: nn.Module, args: tuple) -> tuple | None:
    if args and isinstance(args[0], torch.Tensor) and args[0].dtype in (torch.float16, torch.bfloat16):
        module._lit_compute_out_dtype = args[0].dtype  # type: ignore[assignment]
        return (args[0].float(), *args[1:])
    module._lit_compute_out_dtype = None  # type: ignore[assignment]
    return None


def _cast_output_back(module: nn.Module, args: tuple, output: Any) -> Any:
    dtype = getattr(module, "_lit_compute_out_dtype", None)
    if dtype is not None and isinstance(output, torch.Tensor):
        return output.to(dtype)
    return None


def keep_norms_fp32(module: nn.Module, names: list[str], others: torch.dtype | None = None) -> nn.Module:
    """Put every norm of ``module`` (see :func:`is_fp32_norm`) in float32, in place, and every other floating
    parameter and buffer in ``others`` when given. Non-BatchNorm norms get hooks that cast their low-precision
    input to float32 and back, on every device (their kernels may not take mixed dtypes: CUDA's, and CPU's for the
    nested tensors ``nn.TransformerEncoder`` builds from a padding mask; the native BatchNorm kernels do, and
    accumulate in float32)."""
    for sub in module.modules():
        if is_fp32_norm(sub, names):
            _to_dtype(sub, torch.float32)
            if not isinstance(sub, BatchNormBase) and not getattr(sub, "_lit_compute_fp32_hooks", False):
                sub.register_forward_pre_hook(_cast_input_to_fp32)
                sub.register_forward_hook(_cast_output_back)
                sub._lit_compute_fp32_hooks = True  # type: ignore[assignment]
        elif others is not None:
            _to_dtype(sub, others)
    return module


def _to_dtype(module: nn.Module, dtype: torch.dtype) -> None:
    with torch.no_grad():
        for param in module._parameters.values():
            if param is not None and param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)
                if param.grad is not None:
                    param.grad = param.grad.to(dtype)
        for key, buf in module._buffers.items():
            if buf is not None and buf.is_floating_point() and buf.dtype != dtype:
                module._buffers[key] = buf.to(dtype)


class FP32BatchNormPrecision(MixedPrecision):
    """Lightning's ``MixedPrecision`` (fp16/bf16 autocast) with BatchNorm (and other named norms) kept in float32.

    A drop-in for ``lightning.pytorch.plugins.MixedPrecision``: it *is* one (``isinstance`` holds, so
    Lightning's ``ThroughputMonitor`` sees the bf16/fp16 compute dtype), takes its constructor
    ``(precision, device, scaler)`` first, and inherits its autocast, scaler, gradient clipping (a subclass's
    ``clip_grad_by_norm``/``clip_grad_by_value`` override is called), ``autocast_context_manager()`` and checkpointed
    scaler state. What it adds: every norm's weight, bias, running mean and running variance stay float32
    (``convert_module``), and the GradScaler settings can be given as numbers.

    BatchNorm parameters and statistics are kept in float32 and statistics are computed in float32: the native
    BatchNorm kernels (CPU and cuDNN) take low-precision input with float32 parameters and accumulate in
    float32, and their output stays in the input's low-precision dtype, so the next layer does not upcast and no
    cast is paid. (A wrapper casting each BatchNorm input to float32 and back cost 45% more step time.) Other
    norms named in ``fp32_norms`` get the same treatment; on CUDA their low-precision input is cast to float32
    around the layer. ``SyncBatchNorm`` (``Trainer(sync_batchnorm=True)``) is a BatchNorm too. Conversion is in
    place (Lightning's DDP strategy discards the module ``convert_module`` returns).

    Differences from ``MixedPrecision`` (all documented here):

    - ``precision`` defaults to ``"bf16-mixed"`` and ``device`` to None: the device type of the model's
      parameters, read when Lightning connects the plugin (``"cuda"``, ``"cpu"``, ``"mps"``).
    - ``"bf16-true"`` belongs to :class:`FP32BatchNormHalfPrecision` (a ``HalfPrecision``); ``"16-true"`` is refused
      with the reason.
    - keyword-only: ``fp32_norms`` and the GradScaler settings ``init_scale``, ``growth_factor``,
      ``backoff_factor``, ``growth_interval`` (used when ``scaler`` is not given, under ``"16-mixed"``).
    - keyword-only ``slow_bf16``: ``"warn"`` (the default: bf16 as asked, one warning on a CPU without bf16
      instructions) or ``"float32"``: the precision is picked for the hardware the run trains on, by one rule:
      bf16 where it is fast (a CUDA device that supports it; a CPU whose measured bf16 speed-up of training
      blocks reaches :data:`~lit_compute.hardware.this_machine.BF16_FAST_RATIO`), float32 where it is not (a CPU
      whose torch kernels stop at AVX2 without measuring). In float32 autocast is off and
      ``trainer.precision`` reads ``"32-true"``; the plugin says which it picked in one line, and the run's
      record shows it. (Lightning's ``ThroughputMonitor`` still reads a ``MixedPrecision`` as half precision.)

    Args:
        precision: ``"16-mixed"`` or ``"bf16-mixed"``.
        device: The device type for ``torch.autocast`` (None: the model's).
        scaler: A ``torch.amp.GradScaler`` (``"16-mixed"``; default: one built from the settings below).
        fp32_norms: Class-name fragments of norms kept in float32 besides every ``_BatchNorm``
            (``["BatchNorm", "GroupNorm", "LayerNorm"]`` keeps all three).
        init_scale: GradScaler initial scale.
        growth_factor: GradScaler growth factor.
        backoff_factor: GradScaler backoff factor.
        growth_interval: GradScaler growth interval (steps).
        slow_bf16: ``"warn"``, or ``"float32"`` to train in float32 where bf16 is slow (``"bf16-mixed"`` only).

    Raises:
        ValueError: ``"16-true"`` (with the reason), ``"bf16-true"`` (use :class:`FP32BatchNormHalfPrecision`), any
            other precision, a scaler under ``"bf16-mixed"``, bad ``fp32_norms`` or scaler settings.

    Example:
        >>> import lightning.pytorch as pl
        >>> trainer = pl.Trainer(plugins=[FP32BatchNormPrecision("bf16-mixed")], accelerator="cpu", max_steps=1)
    """

    @validated
    def __init__(
        self,
        precision: Annotated[str, Check(choices=("16-mixed", "bf16-mixed"), refuse=_REFUSED)] = "bf16-mixed",
        device: str | None = None,
        scaler: Any = None,  # a torch.amp.GradScaler (duck-typed, as MixedPrecision takes it)
        *,
        fp32_norms: list[str] | None = None,
        init_scale: Annotated[float, Check(gt=0)] = 2.0**16,
        growth_factor: Annotated[float, Check(gt=1.0)] = 2.0,
        backoff_factor: Annotated[float, Check(gt=0.0, lt=1.0)] = 0.5,
        growth_interval: Annotated[int, Check(ge=1)] = 2000,
        slow_bf16: Literal["warn", "float32"] = "warn",
    ) -> None:
        name = type(self).__name__
        if slow_bf16 == "float32" and precision != "bf16-mixed":
            raise ValueError(
                f"{name}(precision={precision!r}, slow_bf16='float32'): the fallback is for 'bf16-mixed' "
                "only; use precision='bf16-mixed' or leave slow_bf16 at 'warn'"
            )
        self.slow_bf16 = slow_bf16
        self.float32 = False  # slow_bf16='float32' and bf16 is slow on the device picked for
        self._picked_for: str | None = None  # that device, once picked
        if scaler is not None and precision == "bf16-mixed":
            raise ValueError(f"{name}(precision='bf16-mixed', scaler=...): bf16 needs no loss scaling; drop the scaler")
        self.fp32_norms = check_fp32_norms(name, fp32_norms)
        self.init_scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self._pending_state: dict[str, Any] | None = None
        # MixedPrecision builds a GradScaler for "16-mixed" when none is given; ours is built from the settings
        # once the device is known (connect), unless the device is given now.
        if scaler is None and precision == "16-mixed" and device is not None:
            scaler = self._build_scaler(device)
        super().__init__(precision=cast(Any, precision), device=device or "cpu", scaler=scaler)
        if device is None:
            self.device = None  # type: ignore[assignment]  # resolved in connect()
            if precision == "16-mixed":
                self.scaler = None

    def _build_scaler(self, device: str) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(
            device,
            init_scale=self.init_scale,
            growth_factor=self.growth_factor,
            backoff_factor=self.backoff_factor,
            growth_interval=self.growth_interval,
        )

    def convert_module(self, module: nn.Module) -> nn.Module:
        return keep_norms_fp32(module, self.fp32_norms)

    def connect(self, model: nn.Module, optimizers: list, lr_schedulers: list) -> tuple:
        if self.device is None:
            device = next((p.device.type for p in model.parameters()), "cpu")
            self.device = device if device in ("cuda", "cpu", "mps", "xpu") else "cpu"
        if self.precision == "16-mixed" and self.scaler is None:
            self.scaler = self._build_scaler(self.device)
        if self.slow_bf16 == "float32" and self._asked == "bf16-mixed":
            if self._picked_for != self.device:  # picked before the device was known, for another one
                self._pick_for_the_hardware()
        else:
            warn_if_bf16_is_slow_here(type(self).__name__, self.precision, self.device)
        if self._pending_state and self.scaler is not None:
            self.scaler.load_state_dict(self._pending_state)
            self._pending_state = None
        return super().connect(model, optimizers, lr_schedulers)

    @property  # type: ignore[override]
    def precision(self) -> str:
        """What trains: under ``slow_bf16='float32'`` the pick for the hardware (made at the first read, so callbacks
        that read ``trainer.precision`` in their ``setup``, before Lightning connects this plugin, see it too)."""
        constructed = hasattr(self, "device")  # MixedPrecision's __init__ reads it before setting the device
        if constructed and getattr(self, "slow_bf16", "warn") == "float32" and self._asked == "bf16-mixed":
            if self._picked_for is None:
                self._pick_for_the_hardware()
            return "32-true" if self.float32 else "bf16-mixed"
        return self._asked

    @precision.setter
    def precision(self, value: str) -> None:
        self._asked = value

    def _pick_for_the_hardware(self) -> None:
        """``slow_bf16='float32'``: bf16 where it is fast on this run's device (before Lightning connects the plugin:
        the device this process would train on), float32 where not; said in one line."""
        device = str(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        fast, why = bf16_is_fast_here(device)
        self.float32, self._picked_for = not fast, device
        picked = "float32 (autocast off)" if self.float32 else "bf16-mixed"
        rank_zero_info(f"{type(self).__name__}(slow_bf16='float32'): training in {picked} on {device}: {why}")

    def forward_context(self) -> Any:
        if self.float32:
            return contextlib.nullcontext()
        return super().forward_context()

    def autocast_context_manager(self) -> torch.autocast:
        if self.device is None:  # used before Lightning connected it: the device this process would train on
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        return super().autocast_context_manager()

    def state_dict(self) -> dict[str, Any]:
        if self.scaler is None:
            return dict(self._pending_state or {})
        return super().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.scaler is None:  # not connected yet: applied when the scaler exists
            self._pending_state = dict(state_dict) if state_dict else None
            return
        super().load_state_dict(state_dict)


class FP32BatchNormHalfPrecision(HalfPrecision):
    """Lightning's ``HalfPrecision`` in ``"bf16-true"`` with BatchNorm (and other named norms) kept in float32.

    A drop-in for ``lightning.pytorch.plugins.HalfPrecision``: it *is* one, takes its ``precision`` argument first,
    and inherits its input conversion, default-dtype forward context and init contexts. Every floating parameter
    and buffer is bfloat16 (half the parameter memory) except the norms', which stay float32; inputs are cast to
    bfloat16; there is no scaler. The float32-norm behaviour is :class:`FP32BatchNormPrecision`'s.

    Differences from ``HalfPrecision``: ``precision`` defaults to ``"bf16-true"`` and ``"16-true"`` is refused with the
    reason (float16 parameters get float16 gradients that underflow, and without float32 master weights no loss
    scaling can help); keyword-only ``fp32_norms``.

    Args:
        precision: ``"bf16-true"``.
        fp32_norms: Class-name fragments of norms kept in float32 besides every ``_BatchNorm``.

    Example:
        >>> import lightning.pytorch as pl
        >>> trainer = pl.Trainer(plugins=[FP32BatchNormHalfPrecision()], accelerator="cpu", max_steps=1)
    """

    @validated
    def __init__(
        self,
        precision: Annotated[str, Check(choices=("bf16-true",), refuse=_REFUSED_HALF)] = "bf16-true",
        *,
        fp32_norms: list[str] | None = None,
    ) -> None:
        name = type(self).__name__
        self.fp32_norms = check_fp32_norms(name, fp32_norms)
        super().__init__(cast(Any, precision))

    def connect(self, model: nn.Module, optimizers: list, lr_schedulers: list) -> tuple:
        device = next((p.device.type for p in model.parameters()), "cpu")
        warn_if_bf16_is_slow_here(type(self).__name__, self.precision, device)
        return super().connect(model, optimizers, lr_schedulers)

    def convert_module(self, module: nn.Module) -> nn.Module:
        # Lightning's model summary forwards ``example_input_array`` as it is (no convert_input): float32 into
        # bfloat16 weights fails, so the example is converted with the weights, as every batch is
        example = getattr(module, "example_input_array", None) if isinstance(module, pl.LightningModule) else None
        if example is not None:
            module.example_input_array = self.convert_input(example)
        return keep_norms_fp32(module, self.fp32_norms, others=self._desired_input_dtype)


def fp32_norm_precision(precision: str, **kwargs: Any) -> FP32BatchNormPrecision | FP32BatchNormHalfPrecision:
    """The float32-norm plugin for a Lightning precision string: :class:`FP32BatchNormPrecision` for ``"16-mixed"``
    and ``"bf16-mixed"``, :class:`FP32BatchNormHalfPrecision` for ``"bf16-true"`` (keyword arguments go to it)."""
    if precision == "bf16-true":
        return FP32BatchNormHalfPrecision(precision, **kwargs)
    return FP32BatchNormPrecision(precision, **kwargs)


class FP32BatchNormFSDPPrecision(FSDPPrecision):
    """Lightning's ``FSDPPrecision`` (what ``FSDPStrategy`` requires) with BatchNorm and other named norms kept in
    float32: the FSDP variant of :class:`FP32BatchNormPrecision`.

    A drop-in for ``lightning.pytorch.plugins.FSDPPrecision``: it *is* one and takes its ``(precision, scaler)``
    first. FSDP casts parameters to the policy's ``param_dtype`` for compute; modules whose classes are in the
    policy's ``_module_classes_to_ignore`` are wrapped on their own with mixed precision off, so their parameters
    and buffers stay float32. torch's default there is ``(_BatchNorm,)``; this plugin adds every class that
    ``fp32_norms`` names and the model holds (found in ``convert_module``, which Lightning's FSDPStrategy calls
    before wrapping), and gives those norms the float32 input cast of :class:`FP32BatchNormPrecision`. FSDP applies
    ``_module_classes_to_ignore`` only with an ``auto_wrap_policy`` (``FSDPStrategy(auto_wrap_policy={Block})``).

    Differences from ``FSDPPrecision``: ``"16-true"`` is refused (float16 gradients reduced without loss scaling
    underflow); keyword-only ``fp32_norms``.

    Args:
        precision: ``"32-true"``, ``"16-mixed"``, ``"bf16-mixed"`` or ``"bf16-true"``.
        scaler: A ``ShardedGradScaler`` (``"16-mixed"``; default: a new one).
        fp32_norms: Class-name fragments of norms kept in float32 besides every ``_BatchNorm``.

    Example:
        >>> plugin = FP32BatchNormFSDPPrecision("bf16-mixed", fp32_norms=["LayerNorm"])
    """

    @validated
    def __init__(
        self,
        precision: Annotated[
            str, Check(choices=("32-true", "16-mixed", "bf16-mixed", "bf16-true"), refuse=_REFUSED_FSDP)
        ] = "bf16-mixed",
        scaler: Any = None,
        *,
        fp32_norms: list[str] | None = None,
    ) -> None:
        self.fp32_norms = check_fp32_norms(type(self).__name__, fp32_norms)
        self.norm_classes: tuple[type, ...] = (BatchNormBase,)
        super().__init__(precision, scaler)  # type: ignore[arg-type]

    def convert_module(self, module: nn.Module) -> nn.Module:
        found = {type(m) for m in module.modules() if is_fp32_norm(m, self.fp32_norms)}
        self.norm_classes = tuple(dict.fromkeys([BatchNormBase, *sorted(found, key=lambda c: c.__qualname__)]))
        others = torch.bfloat16 if self.precision == "bf16-true" else None
        return keep_norms_fp32(super().convert_module(module), self.fp32_norms, others=others)

    @property
    def mixed_precision_config(self) -> Any:
        config = super().mixed_precision_config
        ignored = tuple(dict.fromkeys([*config._module_classes_to_ignore, *self.norm_classes]))
        return dataclasses.replace(config, _module_classes_to_ignore=ignored)
