"""lit_compute: Lightning callbacks, plugins and datamodules that make the compute cost of training visible.

Components are imported on first use (``import lit_compute`` itself loads neither torch nor Lightning, so
``lit-compute --help`` answers at once); ``from lit_compute import FlopsLogger`` works as usual. The
``ddp_tuned*`` strategy names are registered with Lightning as soon as any component is taken from here, or at
``import lit_compute`` when Lightning is already imported.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from typing import Any


def _version() -> str:
    """The installed distribution's version (pyproject.toml is the one source); a source tree never installed says
    so."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lit-compute")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _version()

_WHERE = {
    "CommBenchmark": "lit_compute.distributed",
    "NCCLSettings": "lit_compute.distributed",
    "TunedDDPStrategy": "lit_compute.distributed",
    "DALIImageDataModule": "lit_compute.data",
    "TokenDataModule": "lit_compute.data",
    "TorchvisionImageDataModule": "lit_compute.data",
    "make_synthetic_image_folder": "lit_compute.data",
    "ProfilerWindow": "lit_compute.profiling",
    "profile_model": "lit_compute.profiling",
    "FP32BatchNormFSDPPrecision": "lit_compute.precision",
    "FP32BatchNormHalfPrecision": "lit_compute.precision",
    "FP32BatchNormPrecision": "lit_compute.precision",
    "fp32_norm_precision": "lit_compute.precision",
    "fully_shard_fp32_norms": "lit_compute.precision",
    "LossScaleMonitor": "lit_compute.precision",
    "DeviceMonitor": "lit_compute.monitoring",
    "PrometheusLogger": "lit_compute.monitoring",
    "StepTimeMonitor": "lit_compute.monitoring",
    "MemoryMonitor": "lit_compute.memory",
    "StorageTracker": "lit_compute.memory",
    "FlopsLogger": "lit_compute.flops",
    "SafeFlopCounterMode": "lit_compute.flops",
    "count_flops": "lit_compute.flops",
    "peak_flops": "lit_compute.flops",
    "GPT": "lit_compute.models",
    "ImageClassifier": "lit_compute.models",
    "TokenSpec": "lit_compute._batch",
    "MeasuringCallback": "lit_compute.callback",
    "Timeline": "lit_compute.timeline",
    "ChannelsLast": "lit_compute.speedup",
    "CompileModules": "lit_compute.speedup",
    "Float32MatmulPrecision": "lit_compute.speedup",
    "FusedOptimizer": "lit_compute.speedup",
    "tune": "lit_compute.tuning",
    "timeline_for": "lit_compute.timeline",
}

__all__ = sorted(_WHERE)


def _register_strategies() -> None:
    """Lightning's strategy registry learns ``ddp_tuned*`` (importing ``lit_compute.distributed`` registers them)."""
    importlib.import_module("lit_compute.distributed")


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'lit_compute' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    _register_strategies()  # any component used: Lightning is loaded anyway, so `strategy="ddp_tuned"` works too
    return value


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _one_line_warnings() -> None:
    """Print lit_compute's warnings as one line (``file:line: Category: message``) instead of Python's two (the second
    repeats the ``rank_zero_warn(...)`` source line). Other warnings keep the format installed before (Lightning's
    own one-line format for its warnings, Python's default otherwise)."""
    previous = warnings.formatwarning
    if getattr(previous, "_lit_compute", False):
        return

    def format_warning(
        message: Any, category: type[Warning], filename: str, lineno: int, line: str | None = None
    ) -> str:
        if os.path.abspath(filename).startswith(_PACKAGE_DIR):
            return f"{filename}:{lineno}: {category.__name__}: {message}\n"
        return previous(message, category, filename, lineno, line)

    format_warning._lit_compute = True  # type: ignore[attr-defined]
    warnings.formatwarning = format_warning


_one_line_warnings()

if "lightning.pytorch" in sys.modules:  # `import lightning.pytorch` first, then `import lit_compute`
    _register_strategies()


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
