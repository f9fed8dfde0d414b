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
from lit_compute.monitoring import prometheus_name

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
        assert sample.labels == {"run": "demo", "rank": "0"}
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
