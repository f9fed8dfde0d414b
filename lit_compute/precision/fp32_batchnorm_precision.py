"""FP32BatchNormPrecision: mixed or true-bf16 precision with normalisation layers kept in float32."""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Literal

import torch
from lightning.pytorch.plugins.precision import HalfPrecision, MixedPrecision, Precision
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

if TYPE_CHECKING:
    import lightning.pytorch as pl

_MODES = ("16-mixed", "bf16-mixed", "bf16-true")


def is_fp32_norm(module: nn.Module, names: list[str]) -> bool:
    """True for every ``_BatchNorm`` (BatchNorm1d/2d/3d, SyncBatchNorm) and classes whose name contains one of ``names``."""
    if isinstance(module, _BatchNorm):
        return True
    return any(name in cls.__name__ for cls in type(module).__mro__ for name in names)


def _cast_input_to_fp32(module: nn.Module, args: tuple) -> tuple | None:
    if args and isinstance(args[0], torch.Tensor) and args[0].is_cuda and args[0].dtype in (torch.float16, torch.bfloat16):
        module._lit_compute_out_dtype = args[0].dtype  # type: ignore[assignment]
        return (args[0].float(), *args[1:])
    module._lit_compute_out_dtype = None  # type: ignore[assignment]
    return None


def _cast_output_back(module: nn.Module, args: tuple, output: Any) -> Any:
    dtype = getattr(module, "_lit_compute_out_dtype", None)
    if dtype is not None and isinstance(output, torch.Tensor):
        return output.to(dtype)
    return None


class FP32BatchNormPrecision(Precision):
    """Mixed (fp16/bf16 autocast) or true-bf16 precision with BatchNorm (and other norms) kept in float32.

    - ``"16-mixed"``/``"bf16-mixed"``: autocast exactly as Lightning's ``MixedPrecision`` (which this plugin
      uses underneath), plus the guarantee that every norm's weight, bias, running mean and running variance
      stay float32. ``"16-mixed"`` uses a ``torch.amp.GradScaler`` built from the arguments below; its state
      is saved in checkpoints.
    - ``"bf16-true"``: every other floating parameter and buffer is bfloat16 (half the parameter memory),
      inputs are cast to bfloat16, no scaler; the norms stay float32.

    BatchNorm parameters and statistics are kept in float32 and statistics are computed in float32: the native
    BatchNorm kernels (CPU and cuDNN) take low-precision input with float32 parameters and accumulate in
    float32, and their output stays in the input's low-precision dtype, so the next layer does not upcast and
    no cast is paid. (A wrapper casting each BatchNorm input to float32 and back cost 45% more step time.)
    Other norms named in ``fp32_norms`` get the same treatment; on CUDA their low-precision input is cast to
    float32 around the layer (their kernels may not take mixed dtypes), on CPU the native kernels do.
    ``SyncBatchNorm`` (``Trainer(sync_batchnorm=True)``) is a BatchNorm too. Conversion is in place (Lightning's
    DDP strategy discards the module ``convert_module`` returns).

    ``"16-true"`` is refused: fp16 parameters would receive fp16 gradients that underflow, and a GradScaler
    cannot unscale them without float32 master weights. Use ``"16-mixed"``.

    Args:
        precision: ``"16-mixed"``, ``"bf16-mixed"`` or ``"bf16-true"``.
        fp32_norms: Class-name fragments of norms kept in float32 besides every ``_BatchNorm``
            (``["BatchNorm", "GroupNorm", "LayerNorm"]`` keeps all three).
        init_scale: GradScaler initial scale (``"16-mixed"``).
        growth_factor: GradScaler growth factor.
        backoff_factor: GradScaler backoff factor.
        growth_interval: GradScaler growth interval (steps).

    Raises:
        ValueError: ``"16-true"`` (with the reason) or any other unknown precision, bad scaler values.

    Example:
        >>> import lightning.pytorch as pl
        >>> trainer = pl.Trainer(plugins=[FP32BatchNormPrecision("bf16-mixed")], accelerator="cpu", max_steps=1)
    """

    precision: Literal["16-mixed", "bf16-mixed", "bf16-true"]

    def __init__(
        self,
        precision: Literal["16-mixed", "bf16-mixed", "bf16-true"] = "bf16-mixed",
        fp32_norms: list[str] | None = None,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        name = type(self).__name__
        if precision in ("16-true", "16", 16, "half"):
            raise ValueError(
                f"{name}(precision={precision!r}) is refused: with float16 parameters the gradients are float16 too; "
                "small ones underflow to zero and a GradScaler cannot unscale them without float32 master weights. "
                "Use precision='16-mixed' (float16 compute, float32 weights, dynamic loss scaling) or 'bf16-true'."
            )
        if precision not in _MODES:
            raise ValueError(f"{name}(precision={precision!r}) must be one of {', '.join(map(repr, _MODES))}")
        if init_scale <= 0:
            raise ValueError(f"{name}(init_scale={init_scale}) must be > 0")
        if growth_factor <= 1.0:
            raise ValueError(f"{name}(growth_factor={growth_factor}) must be > 1")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"{name}(backoff_factor={backoff_factor}) must be in (0, 1)")
        if growth_interval < 1:
            raise ValueError(f"{name}(growth_interval={growth_interval}) must be >= 1")
        self.precision = precision
        self.fp32_norms = list(fp32_norms) if fp32_norms is not None else ["BatchNorm"]
        self.init_scale = init_scale
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self._inner: Precision | None = None
        self._pending_state: dict[str, Any] | None = None

    # -- the plugin that does the autocast / dtype work -------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return torch.float16 if self.precision == "16-mixed" else torch.bfloat16

    def _build(self, device_type: str) -> Precision:
        if self.precision == "bf16-true":
            return HalfPrecision("bf16-true")
        scaler = None
        if self.precision == "16-mixed":
            scaler = torch.amp.GradScaler(
                device_type, init_scale=self.init_scale, growth_factor=self.growth_factor,
                backoff_factor=self.backoff_factor, growth_interval=self.growth_interval,
            )
        return MixedPrecision(self.precision, device=device_type, scaler=scaler)  # type: ignore[arg-type]

    def _ensure(self, device_type: str | None = None) -> Precision:
        if self._inner is None or (device_type is not None and getattr(self._inner, "device", device_type) != device_type):
            device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
            self._inner = self._build(device_type)
            if self._pending_state:
                self._inner.load_state_dict(self._pending_state)
                self._pending_state = None
        return self._inner

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The GradScaler (``"16-mixed"`` only), as Lightning's ``MixedPrecision.scaler``."""
        return getattr(self._inner, "scaler", None) if self._inner is not None else None

    # -- module conversion ---------------------------------------------------------------------------
    def convert_module(self, module: nn.Module) -> nn.Module:
        for sub in module.modules():
            if is_fp32_norm(sub, self.fp32_norms):
                self._to_dtype(sub, torch.float32)
                if not isinstance(sub, _BatchNorm) and not getattr(sub, "_lit_compute_fp32_hooks", False):
                    sub.register_forward_pre_hook(_cast_input_to_fp32)
                    sub.register_forward_hook(_cast_output_back)
                    sub._lit_compute_fp32_hooks = True  # type: ignore[assignment]
            elif self.precision == "bf16-true":
                self._to_dtype(sub, torch.bfloat16)
        return module

    @staticmethod
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

    def connect(self, model: nn.Module, optimizers: list, lr_schedulers: list) -> tuple:
        device_type = next((p.device.type for p in model.parameters()), None)
        self._ensure(device_type if device_type in ("cuda", "cpu") else None)
        return super().connect(model, optimizers, lr_schedulers)

    # -- delegated behaviour -------------------------------------------------------------------------
    def tensor_init_context(self) -> AbstractContextManager:
        return self._ensure().tensor_init_context() if self.precision == "bf16-true" else nullcontext()

    def module_init_context(self) -> AbstractContextManager:
        return self.tensor_init_context()

    @contextmanager
    def forward_context(self) -> Generator[None, None, None]:
        with self._ensure().forward_context():
            yield

    def convert_input(self, data: Any) -> Any:
        return self._ensure().convert_input(data)

    def convert_output(self, data: Any) -> Any:
        return self._ensure().convert_output(data)

    def pre_backward(self, tensor: torch.Tensor, module: pl.LightningModule) -> torch.Tensor:  # type: ignore[override]
        return self._ensure().pre_backward(tensor, module)

    def optimizer_step(self, optimizer: Any, model: pl.LightningModule, closure: Callable[[], Any],
                       **kwargs: Any) -> Any:  # type: ignore[override]
        return self._ensure().optimizer_step(optimizer, model=model, closure=closure, **kwargs)

    def clip_gradients(self, optimizer: Any, clip_val: int | float = 0.0, gradient_clip_algorithm: Any = None) -> None:
        inner = self._ensure()
        if gradient_clip_algorithm is None:
            return inner.clip_gradients(optimizer, clip_val)
        return inner.clip_gradients(optimizer, clip_val, gradient_clip_algorithm)

    def state_dict(self) -> dict[str, Any]:
        if self._inner is None:
            return dict(self._pending_state or {})
        return self._inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._inner is None:
            self._pending_state = dict(state_dict)
        else:
            self._inner.load_state_dict(state_dict)
