"""NVML's GPM read as DCGM's profiling fields: two samples a logging interval apart, percentages as DCGM's ratios, a
device without GPM said why; against a stand-in NVML that keeps pynvml's own request structure."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pynvml
import pytest

from lit_compute import ProfilerWindow
from lit_compute.monitoring.gpm import GPM_METRICS, GpmReader, GpmUnavailable

from ..conftest import make_trainer, small_model, tiny_data


class FakeGpmNVML:
    """GPM's calls over one device: ``percent`` maps a GPM metric id to what the interval gives (``None``: NVML fails
    that metric)."""

    NVMLError = pynvml.NVMLError
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION

    def __init__(self, supported: bool = True, percent: dict | None = None) -> None:
        self.supported, self.percent, self.samples, self.freed = supported, dict(percent or {}), [], 0
        for key in GPM_METRICS:
            setattr(self, key, getattr(pynvml, key))

    def nvmlGpmQueryDeviceSupport(self, handle):
        return type("Support", (), {"isSupportedDevice": int(self.supported)})()

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA A100-SXM4-80GB"

    def nvmlGpmSampleAlloc(self):
        return pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleGet(self, handle, sample):
        self.samples.append((handle, None))

    def nvmlGpmMigSampleGet(self, handle, instance, sample):
        self.samples.append((handle, instance))

    def nvmlGpmMetricsGet(self, request):
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        for slot in request.metrics[: request.numMetrics]:
            value = self.percent.get(slot.metricId)
            slot.nvmlReturn, slot.value = (pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0) if value is None else (0, value)

    def nvmlGpmSampleFree(self, sample):
        self.freed += 1


def test_an_interval_gives_dcgms_ratios_and_a_failed_metric_is_left_out_and_named():
    nvml = FakeGpmNVML(
        percent={
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 62.5,
            pynvml.NVML_GPM_METRIC_SM_UTIL: 90.0,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 40.0,
        }
    )
    reader = GpmReader(nvml, "gpu0")
    assert reader.read() == {}  # the first call only samples: an interval needs two
    assert reader.read() == {
        "device/prof_pipe_tensor_active": 0.625,
        "device/prof_sm_active": 0.9,
        "device/prof_dram_active": 0.4,
    }
    assert reader.failed == {"device/prof_sm_occupancy": f"NVML error {pynvml.NVML_ERROR_NOT_SUPPORTED}"}
    assert nvml.samples == [("gpu0", None), ("gpu0", None)]
    reader.close()
    assert nvml.freed == 2
    # each tag is named after the DCGM field it matches
    for tag, field in GPM_METRICS.values():
        assert tag.removeprefix("device/").upper() == field.removeprefix("DCGM_FI_")


def test_a_gpu_without_gpm_is_named_and_a_mig_instance_samples_its_parent():
    with pytest.raises(GpmUnavailable, match=r"NVIDIA A100-SXM4-80GB has no GPM \(Hopper and newer\)"):
        GpmReader(FakeGpmNVML(supported=False), "gpu0")
    nvml = FakeGpmNVML(percent={pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 10.0})
    reader = GpmReader(nvml, "parent", gpu_instance=3)
    reader.start()
    reader.read()
    assert nvml.samples == [("parent", 3), ("parent", 3)]


def test_a_profiler_window_beside_gpm_sampling_says_so_once(tmp_path):
    class SamplingGpm(pl.Callback):
        gpm_active = True  # what DeviceMonitor says while it samples GPM (on a Hopper GPU)

    window = ProfilerWindow(start_step=1, warmup=0, active=1, profile_memory=False, record_shapes=False)
    trainer = make_trainer(tmp_path, max_steps=3, callbacks=[SamplingGpm(), window])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer.fit(small_model(), datamodule=tiny_data())
    said = [str(w.message) for w in seen if "GPM" in str(w.message)]
    assert len(said) == 1
    assert "DeviceMonitor(gpm=False)" in said[0]


def test_a_failing_gpm_reading_turns_gpm_off_alone_and_training_metrics_go_on():
    """An NVML error inside GPM: one warning, GPM off; the other GPU readings and the CPU's go on."""
    from lit_compute import DeviceMonitor

    class BrokenGpm:
        closed = False

        def read(self):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

        def close(self):
            self.closed = True

    class Reader:  # the NVML reader's surface DeviceMonitor.read uses
        def __init__(self):
            self.gpm = BrokenGpm()

        def read(self):
            return {"device/gpu_power_w": 250.0}

    monitor = DeviceMonitor(cpu=False)
    gpm = Reader().gpm
    monitor._gpu_reader = reader = Reader()
    reader.gpm = gpm
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert monitor.read() == {"device/gpu_power_w": 250.0}
        assert monitor.read() == {"device/gpu_power_w": 250.0}
    assert [str(w.message) for w in seen if "GPM" in str(w.message)] == [
        f"DeviceMonitor: reading GPM failed ({pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)}); its metrics are now off."
    ]
    assert gpm.closed
    assert not monitor.gpm_active
    assert monitor._gpu_reader is reader  # the other GPU metrics stay on
