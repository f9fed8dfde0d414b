"""DeviceMonitor: what the devices do (GPU through NVML, CPU through psutil)."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Annotated, Any

import psutil
import torch
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lit_compute._validate import Check, validated
from lit_compute.callback import MeasuringCallback
from lit_compute.monitoring.device_labels import mig_parent, nvml_handle
from lit_compute.monitoring.gpm import GPM_METRICS, GpmReader, GpmUnavailable
from lit_compute.timeline import LogEvent

if TYPE_CHECKING:
    import lightning.pytorch as pl


def _nvml() -> Any:
    import pynvml  # from nvidia-ml-py

    return pynvml


class _GpuReader:
    """NVML readings for the torch CUDA device this process trains on."""

    def __init__(self, device: torch.device) -> None:
        nvml = _nvml()
        nvml.nvmlInit()
        self.nvml = nvml
        self.device = device
        self.handle = nvml_handle(nvml, device)  # by UUID: robust to CUDA_VISIBLE_DEVICES reordering
        self.gpm: GpmReader | None = None

    def open_gpm(self) -> None:
        """Start GPM sampling (a MIG instance samples its parent GPU with the instance's id); raises
        :class:`GpmUnavailable` saying why not."""
        self.gpm = GpmReader(self.nvml, *mig_parent(self.nvml, self.handle))
        self.gpm.start()

    def read(self) -> dict[str, float]:
        nvml, h = self.nvml, self.handle
        util = nvml.nvmlDeviceGetUtilizationRates(h)
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        return {
            "device/gpu_utilization_percent": float(util.gpu),
            "device/gpu_memory_used_gb": mem.used / 1e9,
            "device/gpu_memory_total_gb": mem.total / 1e9,
            "device/gpu_power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1e3,
            "device/gpu_temperature_c": float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
            "device/gpu_sm_clock_mhz": float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            "device/torch_max_memory_allocated_gb": torch.cuda.max_memory_allocated(self.device) / 1e9,
        }

    def close(self) -> None:
        if self.gpm is not None:
            self.gpm.close()
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


class DeviceMonitor(MeasuringCallback):
    """Device utilisation, memory, power and temperature, and the training process's CPU use.

    Read once per logging step (an optimizer step, or a batch under manual optimization: see
    :mod:`lit_compute.timeline`), in the same event as every other lit_compute metric.

    GPU metrics come from NVML (``pip install 'lit-compute[monitor]'``) for the device this process trains
    on; on a machine without NVIDIA GPUs (or when training on CPU) only the CPU part is logged, and that is
    said once. An NVML error warns once, turns the GPU part off, and training goes on. Under DDP the
    loggers write rank 0's device (Lightning's loggers are rank-zero); :class:`PrometheusLogger` with
    ``ranks="all"`` exposes every rank's.

    Logged metrics:
        - ``device/gpu_utilization_percent``, ``device/gpu_memory_used_gb``, ``device/gpu_memory_total_gb``,
          ``device/gpu_power_w``, ``device/gpu_temperature_c``, ``device/gpu_sm_clock_mhz``,
          ``device/torch_max_memory_allocated_gb`` (PyTorch allocator peak) -- GPU runs only.
        - ``device/prof_pipe_tensor_active``, ``device/prof_sm_active``, ``device/prof_sm_occupancy``,
          ``device/prof_dram_active``: the ratios DCGM's ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``, ``..._SM_ACTIVE``,
          ``..._SM_OCCUPANCY`` and ``..._DRAM_ACTIVE`` give, from NVML's GPM over the interval since the last
          logging event (:mod:`lit_compute.monitoring.gpm`) -- Hopper and newer GPUs; elsewhere it says once why not.
        - ``device/cpu_percent`` (this process, 100 = one core busy), ``device/rss_gb`` (resident memory),
          ``device/system_cpu_percent`` (whole machine), ``device/load_avg_1m``.

    Args:
        log_every_n_steps: Log every n steps (default: the trainer's ``log_every_n_steps``).
        gpu: Log GPU metrics (when training on CUDA and NVML is available).
        gpm: Log tensor-pipe, SM and DRAM activity from NVML's GPM (Hopper and newer).
        cpu: Log CPU metrics.

    Example:
        >>> import lightning.pytorch as pl
        >>> trainer = pl.Trainer(callbacks=[DeviceMonitor(gpu=False)], max_steps=1, accelerator="cpu")
    """

    @validated
    def __init__(
        self,
        log_every_n_steps: Annotated[int | None, Check(ge=1)] = None,
        gpu: bool = True,
        cpu: bool = True,
        gpm: bool = True,
    ) -> None:
        super().__init__()
        if not (gpu or cpu):
            raise ValueError("DeviceMonitor(gpu=False, cpu=False) would log nothing; turn at least one on")
        self.log_every_n_steps = log_every_n_steps
        self.gpu = gpu
        self.cpu = cpu
        self.gpm = gpm
        self._gpu_reader: _GpuReader | None = None
        self._process: psutil.Process | None = None

    @override
    def _train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.cpu:
            self._process = psutil.Process(os.getpid())
            self._process.cpu_percent(None)  # first call starts the interval
            psutil.cpu_percent(None)
        if self.gpu and self._gpu_reader is None:
            self._gpu_reader = self._open_gpu(trainer.strategy.root_device)

    def _open_gpu(self, device: torch.device) -> _GpuReader | None:
        if device.type != "cuda":  # expected on a CPU run: said as information, not as a warning
            rank_zero_info(f"DeviceMonitor: training on {device.type}: CPU metrics only (no NVIDIA GPU to read).")
            return None
        try:
            reader = _GpuReader(device)
        except ModuleNotFoundError:
            self._warn_once(
                "no-nvml",
                "DeviceMonitor: nvidia-ml-py is not installed, GPU metrics are off "
                "(pip install 'lit-compute[monitor]').",
            )
        except Exception as err:  # noqa: BLE001 - NVML missing driver, permissions...
            self._warn_once("nvml-init", f"DeviceMonitor: NVML failed to start ({err}); GPU metrics are off.")
            return None
        if self.gpm:
            try:
                reader.open_gpm()
            except GpmUnavailable as err:  # expected before Hopper: said as information
                reader.gpm = None
                tags = ", ".join(tag for tag, _ in GPM_METRICS.values())
                rank_zero_info(f"DeviceMonitor: {tags} are not logged: {err}.")
            except Exception as err:  # noqa: BLE001 - GPM failing must not stop the other GPU metrics
                reader.gpm = None
                self._warn_once("gpm-init", f"DeviceMonitor: GPM sampling failed to start ({err}); its metrics are off")
        return reader

    @property
    def gpm_active(self) -> bool:
        """Whether GPM sampling runs (it reads the GPU's profiling counters: ProfilerWindow asks)."""
        return self._gpu_reader is not None and self._gpu_reader.gpm is not None

    @override
    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, event: LogEvent) -> None:
        event.log(self.read())

    def read(self) -> dict[str, float]:
        """One reading of every enabled metric."""
        metrics: dict[str, float] = {}
        if self._process is not None:
            with self._process.oneshot():
                metrics["device/cpu_percent"] = self._process.cpu_percent(None)
                metrics["device/rss_gb"] = self._process.memory_info().rss / 1e9
            metrics["device/system_cpu_percent"] = psutil.cpu_percent(None)
            metrics["device/load_avg_1m"] = os.getloadavg()[0]
        if self._gpu_reader is not None:
            try:
                metrics.update(self._gpu_reader.read())
            except Exception as err:  # noqa: BLE001 - an NVML error must not stop training
                self._warn_once(
                    "nvml-read",
                    f"DeviceMonitor: reading NVML failed ({err}); GPU metrics are now off, training goes on.",
                )
                self._gpu_reader.close()
                self._gpu_reader = None
        if self._gpu_reader is not None and self._gpu_reader.gpm is not None:
            metrics.update(self._read_gpm(self._gpu_reader))
        return metrics

    def _read_gpm(self, reader: _GpuReader) -> dict[str, float]:
        """GPM's metrics since the last reading; a failing GPM is turned off alone (the other GPU metrics go on)."""
        gpm = reader.gpm
        if gpm is None:
            return {}
        try:
            values = gpm.read()
        except Exception as err:  # noqa: BLE001 - a GPM error must not stop training or the other metrics
            self._warn_once("gpm-read", f"DeviceMonitor: reading GPM failed ({err}); its metrics are now off.")
            gpm.close()
            reader.gpm = None
            return {}
        if gpm.failed:
            failed = ", ".join(f"{tag} ({why})" for tag, why in sorted(gpm.failed.items()))
            self._warn_once("gpm-metric", f"DeviceMonitor: NVML could not give {failed}; those are not logged.")
        return values

    @override
    def _teardown(self) -> None:
        if self._gpu_reader is not None:
            self._gpu_reader.close()
            self._gpu_reader = None
