"""Precision strings and dtypes, and the TF32 rules: which peak column a run's work counts against.

Lightning precision strings (``"bf16-mixed"``, ``"32-true"``, ``"16-true"``, ...) name the dtype the matmuls run in;
float32 work on CUDA runs on TF32 tensor cores where torch's switches allow it (cuDNN's switch for convolutions, on
by default; the matmuls' own switch or ``torch.set_float32_matmul_precision``, off by default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "DTYPE_NAMES",
    "Float32Math",
    "compute_dtype",
    "dtype_key",
    "half_weights",
    "has_tf32_cores",
    "precision_dtype",
    "tf32_enabled",
]

#: torch dtype -> the peak column it counts against
DTYPE_NAMES = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}


def has_tf32_cores(device: torch.device | str | None = None) -> bool:
    """Whether a CUDA device has TF32 tensor cores: NVIDIA Ampere and newer (compute capability 8.0 and up); False
    without CUDA. The one answer the tune and the benches ask."""
    if not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def tf32_enabled(kind: str = "any") -> bool:
    """True when float32 work of ``kind`` may run on TF32 tensor cores.

    ``"matmul"``: matmuls (``torch.backends.cuda.matmul.allow_tf32`` or a float32 matmul precision other than
    ``"highest"``; off by default); ``"conv"``: cuDNN convolutions (``torch.backends.cudnn.allow_tf32``, on by
    default); ``"any"``: either.
    """
    matmul = bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"
    conv = bool(torch.backends.cudnn.allow_tf32)
    return {"matmul": matmul, "conv": conv}.get(kind, matmul or conv)


@dataclass(frozen=True)
class Float32Math:
    """Where a run's float32 convolutions and matmuls would run on a GPU with TF32 tensor cores (Ampere and newer):
    torch's switches as the run had them. The defaults are torch's: convolutions on TF32 (``cudnn.allow_tf32``),
    matmuls in float32 (float32 matmul precision ``"highest"``); ``"high"`` and ``"medium"`` both count as TF32."""

    conv_tf32: bool = True
    matmul_tf32: bool = False

    @classmethod
    def current(cls) -> Float32Math:
        """This process's switches (:func:`tf32_enabled`)."""
        return cls(tf32_enabled("conv"), tf32_enabled("matmul"))

    @property
    def any_tf32(self) -> bool:
        """Whether any float32 work may run on TF32 (the peak a float32 run's MFU is against, as FlopsLogger's)."""
        return self.conv_tf32 or self.matmul_tf32

    def column(self, op_class: str) -> str:
        """The peak column float32 work of an op class counts against on a chip with TF32 tensor cores: ``tf32`` for
        convolutions (dense or grouped) when cuDNN may, for matmuls and attention when the matmuls may; ``float32``
        for everything else (depthwise convolutions, elementwise work, norms, the optimizer)."""
        if op_class in ("conv", "conv_grouped"):
            return "tf32" if self.conv_tf32 else "float32"
        if op_class in ("matmul", "attention"):
            return "tf32" if self.matmul_tf32 else "float32"
        return "float32"

    def describe(self) -> str:
        """In words: ``convolutions on TF32, matmuls in float32``."""

        def where(on: bool) -> str:
            return "on TF32" if on else "in float32"

        return f"convolutions {where(self.conv_tf32)}, matmuls {where(self.matmul_tf32)}"


def dtype_key(dtype: torch.dtype | str, device_type: str = "cuda", kind: str = "any") -> str:
    """The table column for ``dtype``: float32 becomes ``tf32`` on CUDA when TF32 is enabled for ``kind``."""
    if isinstance(dtype, str):
        key = dtype
    elif dtype in DTYPE_NAMES:
        key = DTYPE_NAMES[dtype]
    elif "float8" in str(dtype):
        key = "float8"
    else:
        raise ValueError(f"peak_flops(dtype={dtype}) has no peak; use float32, tf32, bfloat16, float16 or float8")
    if key == "float32" and device_type == "cuda" and tf32_enabled(kind):
        return "tf32"
    return key


def precision_dtype(precision: str) -> torch.dtype:
    """The dtype matmuls run in under a Lightning precision string ("bf16-mixed" -> bfloat16, ...)."""
    p = str(precision)
    if p.startswith("bf16"):
        return torch.bfloat16
    if p.startswith("16"):
        return torch.float16
    if p.startswith("64"):
        return torch.float64
    if p.startswith("transformer-engine"):
        return torch.bfloat16
    return torch.float32


def compute_dtype(precision: str) -> str:
    """The peak column a precision's matmuls run at: ``tf32`` (float32 with TF32 tensor cores), ``float32``,
    ``bfloat16``, ``float16``."""
    p = precision.lower()
    if p == "tf32":
        return "tf32"
    if p.startswith("bf16"):
        return "bfloat16"
    if p.startswith("16"):
        return "float16"
    return "float32"


def half_weights(precision: str) -> bool:
    """True when the parameters themselves are 2 bytes (``bf16-true``, ``16-true``)."""
    return precision.lower() in ("bf16-true", "16-true", "bf16", "16", "half")
