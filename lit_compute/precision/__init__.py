"""Mixed and true-half precision with norms in float32, and the loss scale made visible."""

from lit_compute.precision.fp32_batchnorm_precision import FP32BatchNormPrecision, is_fp32_norm
from lit_compute.precision.loss_scale_monitor import LossScaleMonitor

__all__ = ["FP32BatchNormPrecision", "LossScaleMonitor", "is_fp32_norm"]
