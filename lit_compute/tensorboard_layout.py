"""TensorBoard custom-scalars layout for lit_compute's tags.

TensorBoard's Custom Scalars plugin matches a chart's tag patterns with ``re.match`` (a prefix match), so every
pattern here is anchored (``^time/step_ms$`` does not pull in ``time/step_ms_p90``), and every chart holds one
unit (FLOPs, FLOP/s, a fraction, milliseconds...), so no line sits flat at zero on another's axis, and training and
validation figures never share a chart (a validation figure logged at two steps would draw a line across the
training curve between them). FLOP/s charts are drawn in the unit that fits the run (:func:`flops_rate_tag`): a CPU's
GFLOP/s figures would otherwise tick ``4e-3`` on a TFLOP/s axis.
Pure data and matching; :func:`lit_compute.writer.write_layout` writes it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def _tags(*names: str) -> list[str]:
    return [f"^{re.escape(n)}$" for n in names]


# category -> chart title -> tag patterns (anchored regular expressions)
LAYOUT: dict[str, dict[str, list[str]]] = {
    "Compute": {
        "model TFLOP/s (this device, all ranks)": _tags("compute/tflops_per_sec", "compute/global_tflops_per_sec"),
        "validation TFLOP/s": _tags("compute/val_tflops_per_sec", "compute/test_tflops_per_sec"),
        "MFU and HFU (fraction of peak)": _tags("compute/mfu", "compute/hfu"),
        "validation MFU (fraction of peak)": _tags("compute/val_mfu", "compute/test_mfu"),
        "FLOPs per step (model, hardware)": _tags("compute/flops_per_step", "compute/hardware_flops_per_step"),
        "FLOPs of one global step (all ranks)": _tags("compute/global_flops_per_step"),
        "FLOPs per sample": _tags("compute/flops_per_sample"),
        "validation FLOPs per step": _tags("compute/val_flops_per_step", "compute/test_flops_per_step"),
        "padding fraction (share of positions that were padding)": _tags("compute/padding_fraction"),
        "peak TFLOP/s used for MFU": _tags("compute/peak_tflops"),
    },
    "Time": {
        "data wait vs compute (ms per step)": _tags("time/data_wait_ms", "time/compute_ms", "time/step_ms"),
        "step time p50 / p90 / max (ms)": _tags("time/step_ms_p50", "time/step_ms_p90", "time/step_ms_max"),
        "data-wait fraction": _tags("time/data_wait_fraction"),
        "samples per second (this device, all ranks)": _tags("time/samples_per_sec", "time/global_samples_per_sec"),
        "tokens per second (this device, all ranks)": _tags("time/tokens_per_sec", "time/global_tokens_per_sec"),
        "slowest rank's step time vs rank 0's (ms)": _tags("time/step_ms_rank_max", "time/step_ms"),
        "rank skew (own work of the slowest / the others' median)": _tags("time/rank_skew"),
        "lit_compute's own instrument time (ms per step)": _tags("time/instrument_ms"),
    },
    "Memory": {
        "step peak and its parts (GB per device)": _tags(
            "memory/peak_gb",
            "memory/parameters_gb",
            "memory/gradients_gb",
            "memory/optimizer_gb",
            "memory/activations_gb",
            "memory/other_gb",
        ),
        "headroom and capacity (GB)": _tags("memory/headroom_gb", "memory/capacity_gb"),
        "largest rank's peak vs rank 0's (GB)": _tags("memory/peak_gb_rank_max", "memory/peak_gb"),
    },
    "Precision": {
        "loss scale": _tags("amp/loss_scale"),
        "skipped optimizer steps": _tags("amp/skipped_steps"),
        "skipped step fraction": _tags("amp/skipped_step_fraction"),
    },
    "Device": {
        "utilisation (%)": _tags("device/gpu_utilization_percent", "device/cpu_percent", "device/system_cpu_percent"),
        "memory (GB)": _tags("device/gpu_memory_used_gb", "device/torch_max_memory_allocated_gb", "device/rss_gb"),
        "power (W)": _tags("device/gpu_power_w"),
        "temperature (C)": _tags("device/gpu_temperature_c"),
        "load average (1 min)": _tags("device/load_avg_1m"),
    },
    "Communication": {
        "all-reduce bus bandwidth (GB/s, step = message bytes)": _tags("comm/allreduce_busbw_gbps"),
        "all-reduce algorithm bandwidth (GB/s, step = message bytes)": _tags("comm/allreduce_algbw_gbps"),
        "exposed communication (share of the profiled steps no compute hides)": _tags("comm/exposed_fraction"),
    },
    "Profiler windows": {
        "window step time (ms)": _tags("profiler/step_time_ms"),
        "window shares (fraction)": _tags(
            "profiler/dataloader_fraction",
            "profiler/top_op_fraction",
            "profiler/gpu_idle_fraction",
            "profiler/comm_fraction",
            "profiler/comm_overlap_fraction",
        ),
        "window peak memory (MB)": _tags("profiler/peak_memory_mb"),
        "trace export time (ms)": _tags("profiler/export_ms"),
    },
}


#: The FLOP/s tags, logged in TFLOP/s; each has a twin in a smaller unit on a device slower than that.
FLOP_RATE_TAGS = (
    "compute/tflops_per_sec",
    "compute/global_tflops_per_sec",
    "compute/val_tflops_per_sec",
    "compute/test_tflops_per_sec",
    "compute/peak_tflops",
)


def flops_rate_tag(tag: str, unit: str) -> str:
    """A TFLOP/s tag's twin in ``unit``: ``compute/tflops_per_sec`` in ``GFLOP/s`` is ``compute/gflops_per_sec``."""
    return tag.replace("tflops", unit.split("FLOP")[0].lower() + "flops", 1)


def chart_matches(patterns: list[str], tags: Iterable[str]) -> set[str]:
    """The tags a chart shows, matched the way TensorBoard matches them (``re.match``)."""
    return {t for t in tags for p in patterns if re.match(p, t)}


def charts_in(flops_unit: str = "TFLOP/s") -> dict[str, dict[str, list[str]]]:
    """:data:`LAYOUT` with its FLOP/s charts in ``flops_unit``: their titles, and their tags' twins in that unit."""
    if flops_unit == "TFLOP/s":
        return LAYOUT
    return {
        category: {
            (title.replace("TFLOP/s", flops_unit) if "TFLOP/s" in title else title): (
                [flops_rate_tag(p, flops_unit) for p in patterns] if "TFLOP/s" in title else patterns
            )
            for title, patterns in charts.items()
        }
        for category, charts in LAYOUT.items()
    }


def layout_for(tags: Iterable[str], flops_unit: str = "TFLOP/s") -> dict[str, dict[str, list]]:
    """The custom-scalars layout restricted to the charts that have at least one of ``tags``, FLOP/s charts in
    ``flops_unit``."""
    tags = set(tags)
    out: dict[str, dict[str, list]] = {}
    for category, charts in charts_in(flops_unit).items():
        for title, patterns in charts.items():
            if chart_matches(patterns, tags):
                out.setdefault(category, {})[title] = ["Multiline", patterns]
    return out
