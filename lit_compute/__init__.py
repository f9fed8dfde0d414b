"""lit_compute: Lightning callbacks, plugins and datamodules that make the compute cost of training visible."""

from lit_compute.data import DALIImageDataModule, TorchvisionImageDataModule, make_synthetic_image_folder
from lit_compute.distributed import CommBenchmark, NCCLSettings, TunedDDPStrategy
from lit_compute.flops import FlopsLogger, count_flops, peak_flops
from lit_compute.models import ImageClassifier
from lit_compute.monitoring import DeviceMonitor, PrometheusLogger, StepTimeMonitor
from lit_compute.precision import (
    FP32BatchNormHalfPrecision,
    FP32BatchNormPrecision,
    LossScaleMonitor,
    fp32_norm_precision,
)
from lit_compute.profiling import ProfilerWindow, profile_model

__version__ = "0.1.0"

__all__ = [
    "CommBenchmark",
    "NCCLSettings",
    "TunedDDPStrategy",
    "DALIImageDataModule",
    "ProfilerWindow",
    "profile_model",
    "FP32BatchNormHalfPrecision",
    "FP32BatchNormPrecision",
    "fp32_norm_precision",
    "LossScaleMonitor",
    "DeviceMonitor",
    "PrometheusLogger",
    "StepTimeMonitor",
    "FlopsLogger",
    "count_flops",
    "peak_flops",
    "ImageClassifier",
    "TorchvisionImageDataModule",
    "make_synthetic_image_folder",
]
