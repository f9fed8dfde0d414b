"""TensorBoard custom-scalars layout for lit_compute's tags, and the run-info text the report reads."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import lightning.pytorch as pl

# category -> chart title -> tag patterns (regular expressions, as custom_scalars accepts)
LAYOUT: dict[str, dict[str, list[str]]] = {
    "Compute": {
        "TFLOP/s (per device, all ranks, validation)": [r"compute/tflops_per_sec", r"compute/global_tflops_per_sec",
                                                        r"compute/val_tflops_per_sec"],
        "MFU (achieved / peak)": [r"compute/mfu", r"compute/val_mfu"],
        "peak TFLOP/s used for MFU": [r"compute/peak_tflops"],
        "FLOPs per step and per sample": [r"compute/flops_per_step", r"compute/flops_per_sample",
                                          r"compute/forward_gflops_per_sample"],
    },
    "Time": {
        "data wait vs compute (ms per step)": [r"time/data_wait_ms", r"time/compute_ms", r"time/step_ms"],
        "step time p50 / p90 / max (ms)": [r"time/step_ms_p50", r"time/step_ms_p90", r"time/step_ms_max"],
        "data-wait fraction": [r"time/data_wait_fraction"],
        "samples per second": [r"time/samples_per_sec"],
    },
    "Precision": {
        "loss scale": [r"amp/loss_scale"],
        "skipped optimizer steps": [r"amp/skipped_steps", r"amp/skipped_step_fraction"],
    },
    "Device": {
        "utilisation (%)": [r"device/gpu_utilization_percent", r"device/cpu_percent", r"device/system_cpu_percent"],
        "memory (GB)": [r"device/gpu_memory_used_gb", r"device/torch_max_memory_allocated_gb", r"device/rss_gb"],
        "power (W) and temperature (C)": [r"device/gpu_power_w", r"device/gpu_temperature_c"],
    },
    "Communication": {
        "all-reduce bus bandwidth (GB/s)": [r"comm/allreduce_busbw_gbps.*"],
        "all-reduce algorithm bandwidth (GB/s)": [r"comm/allreduce_algbw_gbps.*"],
    },
    "Profiler windows": {
        "window step time (ms)": [r"profiler/step_time_ms"],
        "window shares": [r"profiler/dataloader_fraction", r"profiler/top_op_fraction",
                          r"profiler/gpu_idle_fraction", r"profiler/comm_overlap_fraction"],
        "window peak memory (MB)": [r"profiler/peak_memory_mb"],
    },
}


def layout_for(tags: Iterable[str]) -> dict[str, dict[str, list]]:
    """The custom-scalars layout restricted to the charts that have at least one of ``tags``."""
    tags = set(tags)
    out: dict[str, dict[str, list]] = {}
    for category, charts in LAYOUT.items():
        for title, patterns in charts.items():
            if any(re.fullmatch(p, t) for p in patterns for t in tags):
                out.setdefault(category, {})[title] = ["Multiline", patterns]
    return out


def write_layout(trainer: pl.Trainer, tags: Iterable[str]) -> bool:
    """Write the layout to the TensorBoard logger's event file (TensorBoard shows the latest one)."""
    from lit_compute._utils import tensorboard_logger

    tb = tensorboard_logger(trainer)
    layout = layout_for(tags)
    if tb is None or not layout or not trainer.is_global_zero:
        return False
    tb.experiment.add_custom_scalars(layout)
    tb.experiment.flush()
    return True
