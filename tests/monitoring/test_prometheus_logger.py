"""PrometheusLogger as a user sees it: the endpoint during and after fit, taken ports, names and arguments."""

from __future__ import annotations

import socket
import textwrap
import urllib.request

import lightning.pytorch as pl
import pytest
from prometheus_client.parser import text_string_to_metric_families
from torch.utils.data import DataLoader

from lit_compute import DeviceMonitor, PrometheusLogger, StepTimeMonitor
from lit_compute.hardware.this_machine import cpu_name
from lit_compute.monitoring import device_labels as device_labels_module
from lit_compute.monitoring import prometheus_name
from lit_compute.monitoring.device_labels import machine_id

from ..conftest import RandomImages, make_trainer, read_events, scalar_values, tiny_model


def _scrape(port: int) -> dict[str, list]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(body)}


def test_prometheus_endpoint_during_and_after_fit(tmp_path):
    prom = PrometheusLogger(port=0, run_name="demo", keep_serving=True)
    seen: dict = {}

    class ScrapeDuringFit(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 3:
                seen.update(_scrape(prom.port_in_use))

    tb = pl.loggers.TensorBoardLogger(str(tmp_path), name="tb")
    trainer = make_trainer(
        tmp_path,
        max_steps=5,
        logger=[tb, prom],
        callbacks=[StepTimeMonitor(log_every_n_steps=1), ScrapeDuringFit()],
        limit_val_batches=0,
    )
    try:
        trainer.fit(tiny_model(), train_dataloaders=DataLoader(RandomImages(), batch_size=4))
        assert "lit_compute_train_loss" in seen
        assert "lit_compute_time_step_ms" in seen
        sample = seen["lit_compute_train_loss"][0]
        # the run, the rank, and DCGM exporter's device labels with this host's values (a CPU run)
        assert sample.labels == {
            "run": "demo",
            "rank": "0",
            "gpu": "cpu",
            "UUID": f"CPU-{machine_id()}",
            "pci_bus_id": "",  # none on a CPU (Prometheus stores an empty label as no label)
            "device": "cpu",
            "modelName": cpu_name(),
            "Hostname": socket.gethostname(),
        }
        assert sample.value > 0
        after = _scrape(prom.port_in_use)
        assert after["lit_compute_step"][0].value >= 4
        # the same values TensorBoard got
        last_loss = scalar_values(read_events(tb.log_dir), "train/loss")[-1][1]
        assert after["lit_compute_train_loss"][0].value == pytest.approx(last_loss, rel=1e-5)
    finally:
        prom.close()


def test_prometheus_port_in_use_is_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        with pytest.raises(
            OSError,
            match=rf"PrometheusLogger\(host='127.0.0.1', port={port}\): cannot serve on "
            rf"127.0.0.1:{port}: the port is already in use",
        ):
            PrometheusLogger(port=port, on_port_in_use="error").start()
        fallback = PrometheusLogger(port=port)  # the default: the next free port, said once
        try:
            with pytest.warns(UserWarning, match=rf"port {port} on 127.0.0.1 is in use; serving on port"):
                fallback.start()
            assert fallback.port_in_use not in (None, port)
        finally:
            fallback.close()


@pytest.mark.slow
def test_port_in_use_warning_is_one_line_on_stderr(tmp_path):
    """As a user sees it in a terminal: one line naming the component and both ports, not Python's second line
    repeating the source line that raised it."""
    code = textwrap.dedent("""
        import socket
        from lit_compute import PrometheusLogger
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0)); sock.listen(1)
            logger = PrometheusLogger(port=sock.getsockname()[1])
            logger.start()
            logger.close()
    """)
    from ..conftest import run_script

    result = run_script(tmp_path, code, timeout=120)  # stdout and stderr together, as a terminal shows them
    assert result.returncode == 0, result.stdout
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    (line,) = [line for line in lines if "PrometheusLogger: port" in line]
    assert "prometheus_logger.py:" in line
    assert "UserWarning: PrometheusLogger: port" in line
    assert "is in use" in line
    assert not any("rank_zero_warn(" in line for line in lines), lines


def test_prometheus_names_and_bad_arguments():
    assert prometheus_name("compute/tflops_per_sec") == "lit_compute_compute_tflops_per_sec"
    assert prometheus_name("val/acc@1 (top)") == "lit_compute_val_acc_1_top"
    with pytest.raises(ValueError, match=r"PrometheusLogger\(port=70000\)"):
        PrometheusLogger(port=70000)
    with pytest.raises(ValueError, match=r"StepTimeMonitor\(stall_fraction=1.5\)"):
        StepTimeMonitor(stall_fraction=1.5)
    with pytest.raises(ValueError, match=r"DeviceMonitor\(gpu=False, cpu=False\)"):
        DeviceMonitor(gpu=False, cpu=False)


def test_one_logger_serving_two_runs_labels_each_with_its_tensorboard_run(tmp_path):
    """keep_serving=True across two fits; no lit_compute callback in either: each run's series carry that run's
    TensorBoard run as label, and run 2 never overwrites run 1."""
    prom = PrometheusLogger(port=0, keep_serving=True, file_sd_dir=str(tmp_path / "sd"))
    try:
        for _ in range(2):
            tb = pl.loggers.TensorBoardLogger(str(tmp_path), name="tb")
            trainer = make_trainer(tmp_path, max_steps=2, logger=[tb, prom], limit_val_batches=0)
            trainer.fit(tiny_model(), train_dataloaders=DataLoader(RandomImages(), batch_size=4))
        losses = {s.labels["run"]: s.value for s in _scrape(prom.port_in_use)["lit_compute_train_loss"]}
        assert set(losses) == {"tb/version_0", "tb/version_1"}
        for version in (0, 1):
            last = scalar_values(read_events(tmp_path / "tb" / f"version_{version}"), "train/loss")[-1][1]
            assert losses[f"tb/version_{version}"] == pytest.approx(last, rel=1e-5)
        assert [p.name for p in (tmp_path / "sd").glob("*.json")] == ["tb_version_1_rank0.json"]
    finally:
        prom.close()


class FakeNVML:
    """NVML's calls that labelling makes, over two GPUs of one host and a MIG instance on the second; handles are
    ``("gpu", index)`` and ``("mig", parent, instance)``. Names, UUIDs and bus ids in NVML's own formats."""

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.uuids = {0: "GPU-5a1c0d6e-0000-4c1e-9a7b-000000000000", 1: "GPU-9f2b7e11-1111-4d2f-8b8c-111111111111"}

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes):
        text = uuid.decode()
        if text.startswith("MIG-"):
            return ("mig", 1, 7)
        index = next((i for i, u in self.uuids.items() if u == text), None)
        if index is None:
            raise self.NVMLError("Not Found")
        return ("gpu", index)

    def nvmlDeviceIsMigDeviceHandle(self, handle) -> int:
        return int(handle[0] == "mig")

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle):
        return ("gpu", handle[1])

    def nvmlDeviceGetIndex(self, handle) -> int:
        assert handle[0] == "gpu", "NVML numbers GPUs, not MIG instances"
        return handle[1]

    def nvmlDeviceGetUUID(self, handle) -> str:
        return self.uuids[handle[1]]

    def nvmlDeviceGetPciInfo(self, handle):
        return type("PciInfo", (), {"busId": f"00000000:{0x3B + handle[1]:02X}:00.0"})()

    def nvmlDeviceGetName(self, handle) -> str:
        return "NVIDIA A100-SXM4-40GB MIG 1g.5gb" if handle[0] == "mig" else "NVIDIA A100-SXM4-40GB"

    def nvmlDeviceGetGpuInstanceId(self, handle) -> int:
        return handle[2]


def test_gpu_labels_spell_dcgm_exporters_and_a_mig_instance_keeps_its_parents():
    """dcgm-exporter labels a GPU's series gpu, UUID, pci_bus_id, device and modelName from NVML, and a MIG
    instance's with its parent GPU's plus GPU_I_PROFILE and GPU_I_ID: the join on UUID needs the same values."""
    nvml = FakeNVML()
    gpu = device_labels_module.gpu_labels(nvml, nvml.nvmlDeviceGetHandleByUUID(nvml.uuids[1].encode()))
    assert gpu == {
        "gpu": "1",
        "UUID": "GPU-9f2b7e11-1111-4d2f-8b8c-111111111111",
        "pci_bus_id": "00000000:3C:00.0",
        "device": "nvidia1",
        "modelName": "NVIDIA A100-SXM4-40GB",
    }
    mig = device_labels_module.gpu_labels(nvml, nvml.nvmlDeviceGetHandleByUUID(b"MIG-0b1c2d3e"))
    assert mig == {**gpu, "GPU_I_PROFILE": "1g.5gb", "GPU_I_ID": "7"}


def test_the_node_label_is_node_name_where_set_and_its_spelling_is_the_callers(tmp_path, monkeypatch):
    monkeypatch.setenv("NODE_NAME", "gpu-node-17")
    prom = PrometheusLogger(port=0, run_name="k8s", hostname_label="hostname")
    try:
        prom.start()
        prom.log_metrics({"train/loss": 1.5}, step=3)
        sample = _scrape(prom.port_in_use)["lit_compute_train_loss"][0]
        assert sample.labels["hostname"] == "gpu-node-17"
        assert "Hostname" not in sample.labels
        assert _scrape(prom.port_in_use)["lit_compute_step"][0].labels == sample.labels
    finally:
        prom.close()
    plain = PrometheusLogger(port=0, run_name="plain", dcgm_labels=False)
    try:
        plain.start()
        plain.log_metrics({"train/loss": 1.5}, step=3)
        assert _scrape(plain.port_in_use)["lit_compute_train_loss"][0].labels == {"run": "plain", "rank": "0"}
    finally:
        plain.close()
    with pytest.raises(ValueError, match="hostname_label"):
        PrometheusLogger(hostname_label="host")
