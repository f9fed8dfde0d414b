"""The labels NVIDIA's DCGM exporter puts on a GPU's series, for the device this process trains on: with them a
lit_compute series joins DCGM's (``lit_compute_compute_mfu * on(UUID) group_left() DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``).

dcgm-exporter labels every GPU series ``gpu`` (the GPU's index, as NVML numbers it: not the CUDA index, which
``CUDA_VISIBLE_DEVICES`` renumbers), ``UUID`` (NVML's ``GPU-...``), ``pci_bus_id`` (NVML's ``00000000:3B:00.0``),
``device`` (``nvidia<gpu>``), ``modelName`` (NVML's name) and the node's name (``NODE_NAME`` where set, as under
Kubernetes, else the host name). A MIG instance's series keep the parent GPU's labels and add ``GPU_I_PROFILE``
(``1g.10gb``) and ``GPU_I_ID`` (the GPU instance id). The node label was ``Hostname`` until dcgm-exporter renamed it
``hostname`` (May 2026, its pull request 655): :class:`~lit_compute.PrometheusLogger` takes the spelling.

On a CPU the same labels carry the host's values: ``gpu="cpu"``, ``device="cpu"``, ``modelName`` the CPU's model,
``UUID`` ``CPU-<machine id>`` and ``pci_bus_id`` empty (a label Prometheus then leaves out).
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

import torch

#: The labels of every GPU series, in dcgm-exporter's order (the node's name last, spelt as the caller asks).
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName")
#: The labels a MIG instance's series add.
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")


def node_name() -> str:
    """The node's name as dcgm-exporter gives it: ``NODE_NAME`` when set (Kubernetes), else the host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_handle(nvml: Any, device: torch.device) -> Any:
    """NVML's handle for a torch CUDA device (found by UUID, which ``CUDA_VISIBLE_DEVICES`` does not renumber; by
    index where torch gives no UUID). A MIG instance's handle for a MIG device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        name = text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"
        with contextlib.suppress(nvml.NVMLError, TypeError, ValueError):
            return nvml.nvmlDeviceGetHandleByUUID(name.encode())
    return nvml.nvmlDeviceGetHandleByIndex(index)


def mig_parent(nvml: Any, handle: Any) -> tuple[Any, int | None]:
    """The GPU behind an NVML handle and, for a MIG instance, its GPU instance id (``None`` for a whole GPU)."""
    mig = False
    with contextlib.suppress(nvml.NVMLError, AttributeError):
        mig = bool(nvml.nvmlDeviceIsMigDeviceHandle(handle))
    if not mig:
        return handle, None
    return nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle), int(nvml.nvmlDeviceGetGpuInstanceId(handle))


def gpu_labels(nvml: Any, handle: Any) -> dict[str, str]:
    """dcgm-exporter's labels of the GPU (or MIG instance) behind an NVML handle, the node's name left out."""
    parent, instance = mig_parent(nvml, handle)
    index = int(nvml.nvmlDeviceGetIndex(parent))
    labels = {
        "gpu": str(index),
        "UUID": _text(nvml.nvmlDeviceGetUUID(parent)),
        "pci_bus_id": _text(nvml.nvmlDeviceGetPciInfo(parent).busId),
        "device": f"nvidia{index}",
        "modelName": _text(nvml.nvmlDeviceGetName(parent)),
    }
    if instance is not None:  # the instance's name ends with its profile: "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
        name = _text(nvml.nvmlDeviceGetName(handle))
        labels["GPU_I_PROFILE"] = name.rsplit("MIG ", 1)[-1].strip()
        labels["GPU_I_ID"] = str(instance)
    return labels


def machine_id() -> str:
    """This host's id (systemd's ``/etc/machine-id``), else a digest of the host name: a CPU's stand-in UUID."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        with contextlib.suppress(OSError), open(path) as f:
            text = f.read().strip()
            if text:
                return text
    import hashlib

    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:32]


def cpu_labels() -> dict[str, str]:
    """The same labels for a CPU run: the host's values."""
    from lit_compute.hardware.this_machine import cpu_name

    return {"gpu": "cpu", "UUID": f"CPU-{machine_id()}", "pci_bus_id": "", "device": "cpu", "modelName": cpu_name()}


def cuda_labels(device: torch.device) -> dict[str, str]:
    """The labels from torch alone, where NVML cannot be read: the UUID, bus id and name CUDA gives, the CUDA index."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    uuid = str(getattr(props, "uuid", "") or "")
    bus = (
        f"{getattr(props, 'pci_domain_id', 0):08X}:{getattr(props, 'pci_bus_id', 0):02X}:"
        f"{getattr(props, 'pci_device_id', 0):02X}.0"
    )
    return {
        "gpu": str(index),
        "UUID": uuid if uuid.startswith(("GPU-", "MIG-")) or not uuid else f"GPU-{uuid}",
        "pci_bus_id": bus,
        "device": f"nvidia{index}",
        "modelName": props.name,
    }


def device_labels(device: torch.device, hostname_label: str = "Hostname") -> dict[str, str]:
    """dcgm-exporter's labels for ``device``, the node's name under ``hostname_label``: NVML's values on CUDA
    (torch's where NVML is missing or fails), the host's on a CPU."""
    labels: dict[str, str] | None = None
    if device.type == "cuda":
        with contextlib.suppress(Exception):  # nvidia-ml-py missing, no driver: a label is not worth failing for
            import pynvml  # from nvidia-ml-py

            pynvml.nvmlInit()
            try:
                labels = gpu_labels(pynvml, nvml_handle(pynvml, device))
            finally:
                pynvml.nvmlShutdown()
        if labels is None:  # torch's own view of the GPU: the CUDA index, which CUDA_VISIBLE_DEVICES may renumber
            labels = cuda_labels(device)
    else:
        labels = cpu_labels()
    return {**labels, hostname_label: node_name()}
