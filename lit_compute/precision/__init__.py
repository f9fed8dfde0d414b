"""Mixed and true-half precision with norms in float32, and the loss scale made visible."""

from lit_compute.precision.fp32_batchnorm_precision import (
    FP32BatchNormFSDPPrecision,
    FP32BatchNormHalfPrecision,
    FP32BatchNormPrecision,
    fp32_norm_precision,
    is_fp32_norm,
)
from lit_compute.precision.fsdp2_norms import fully_shard_fp32_norms
from lit_compute.precision.loss_scale_monitor import LossScaleMonitor

__all__ = [
    "FP32BatchNormFSDPPrecision",
    "FP32BatchNormHalfPrecision",
    "FP32BatchNormPrecision",
    "LossScaleMonitor",
    "fp32_norm_precision",
    "fully_shard_fp32_norms",
    "is_fp32_norm",
]
