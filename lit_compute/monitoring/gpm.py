"""Tensor-pipe, SM and DRAM activity without DCGM: NVML's GPU Performance Monitoring (GPM, Hopper and newer), read
between two samples, under tags named after the DCGM profiling field each one matches.

NVML's utilisation (``device/gpu_utilization_percent``) is the share of time any kernel ran: 100% on a GPU whose
tensor cores sit idle behind a memory-bound kernel. GPM counts what DCGM's profiling fields count, from the same
hardware counters, as percentages over the interval between two samples; these tags give them as DCGM does, ratios
from 0 to 1, so a dashboard reads both alike.

The pure part (which metrics, how an interval's values become tags) lives apart from NVML's calls: tested with a
stand-in NVML.
"""

from __future__ import annotations

import contextlib
from typing import Any

#: NVML's GPM metric -> (DeviceMonitor's tag, the DCGM profiling field it matches)
GPM_METRICS: dict[str, tuple[str, str]] = {
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": ("device/prof_pipe_tensor_active", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    "NVML_GPM_METRIC_SM_UTIL": ("device/prof_sm_active", "DCGM_FI_PROF_SM_ACTIVE"),
    "NVML_GPM_METRIC_SM_OCCUPANCY": ("device/prof_sm_occupancy", "DCGM_FI_PROF_SM_OCCUPANCY"),
    "NVML_GPM_METRIC_DRAM_BW_UTIL": ("device/prof_dram_active", "DCGM_FI_PROF_DRAM_ACTIVE"),
}


class GpmUnavailable(RuntimeError):
    """GPM cannot be read on this device; the message says why."""


class GpmReader:
    """Two GPM samples a logging interval apart, and the metrics between them.

    ``handle`` is NVML's handle of the GPU (for a MIG instance: its parent's, with ``gpu_instance`` the instance id,
    sampled with ``nvmlGpmMigSampleGet``)."""

    def __init__(self, nvml: Any, handle: Any, gpu_instance: int | None = None) -> None:
        self.nvml, self.handle, self.gpu_instance = nvml, handle, gpu_instance
        try:
            supported = bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except (AttributeError, nvml.NVMLError) as err:  # an older driver or nvidia-ml-py without GPM
            raise GpmUnavailable(f"this driver or nvidia-ml-py has no GPM ({err})") from err
        if not supported:
            name = nvml.nvmlDeviceGetName(handle)
            raise GpmUnavailable(f"{name.decode() if isinstance(name, bytes) else name} has no GPM (Hopper and newer)")
        self.metric_ids = {getattr(nvml, key): value for key, value in GPM_METRICS.items() if hasattr(nvml, key)}
        self.failed: dict[str, str] = {}  # tag -> NVML's error, for the one message saying so
        self._samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        self._have_first = False

    def _sample(self, sample: Any) -> None:
        if self.gpu_instance is None:
            self.nvml.nvmlGpmSampleGet(self.handle, sample)
        else:
            self.nvml.nvmlGpmMigSampleGet(self.handle, self.gpu_instance, sample)

    def start(self) -> None:
        """Take the first sample: the next :meth:`read` covers the time from now."""
        self._sample(self._samples[0])
        self._have_first = True

    def read(self) -> dict[str, float]:
        """The metrics since the previous sample (nothing on the first call, which only samples), as DCGM's ratios."""
        if not self._have_first:
            self.start()
            return {}
        first, second = self._samples
        self._sample(second)
        request = self.nvml.c_nvmlGpmMetricsGet_t()
        request.version = self.nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self.metric_ids)
        request.sample1, request.sample2 = first, second
        for slot, metric_id in zip(request.metrics, self.metric_ids):
            slot.metricId = metric_id
        self.nvml.nvmlGpmMetricsGet(request)
        self._samples.reverse()  # this interval's end starts the next one
        return self.values(request)

    def values(self, request: Any) -> dict[str, float]:
        """The tags of a filled request: percentages as ratios; a metric NVML could not give is left out (and kept
        in :attr:`failed`)."""
        out: dict[str, float] = {}
        for slot in request.metrics[: request.numMetrics]:
            tag = self.metric_ids[slot.metricId][0]
            if slot.nvmlReturn != 0:
                self.failed[tag] = f"NVML error {slot.nvmlReturn}"
                continue
            out[tag] = float(slot.value) / 100.0
        return out

    def close(self) -> None:
        for sample in self._samples:
            with contextlib.suppress(Exception):  # freeing at teardown: nothing left to do on failure
                self.nvml.nvmlGpmSampleFree(sample)
