"""FLOP counting (forward + backward, every attention path), peak FLOP/s tables, and FlopsLogger."""

from lit_compute.flops.counting import FlopCount, SafeFlopCounterMode, count_flops
from lit_compute.flops.flops_logger import FlopsLogger
from lit_compute.flops.peaks import PEAK_TABLE, chip_for_name, measure_peak_flops, peak_flops, precision_dtype

__all__ = [
    "PEAK_TABLE",
    "FlopCount",
    "FlopsLogger",
    "SafeFlopCounterMode",
    "chip_for_name",
    "count_flops",
    "measure_peak_flops",
    "peak_flops",
    "precision_dtype",
]
