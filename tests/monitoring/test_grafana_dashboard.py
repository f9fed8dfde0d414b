"""The Grafana dashboard shipped in the package: the fields Grafana needs to import it, and every query of every panel
evaluated by a real Prometheus server (Debian's, unpacked by ``scripts/get_prometheus.sh``) scraping a two-rank CPU fit
through ``file_sd`` beside a stand-in DCGM exporter page with the labels dcgm-exporter gives this host."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from lit_compute import FlopsLogger, MemoryMonitor, PrometheusLogger, StepTimeMonitor
from lit_compute.monitoring.device_labels import device_labels
from lit_compute.packaged_configs import DASHBOARD, init_main

from ..conftest import RandomImages, SpawnDDP, make_trainer, small_model

#: The panels that need a GPU to return data (their description says "GPU only"): float16 loss scaling runs on CUDA
GPU_ONLY = {"Loss scale and skipped steps"}
ALL = {"$run": ".*", "$Hostname": ".*", "$gpu": ".*"}  # what Grafana puts for "All" (each variable's allValue)


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _queries(dashboard: dict) -> list[tuple[str, str]]:
    out = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in ALL.items():
                expr = expr.replace(var, value)
            out.append((panel["title"], expr))
    return out


def test_the_dashboard_has_what_grafana_needs_to_import_it_beside_dcgms():
    d = _dashboard()
    assert isinstance(d["schemaVersion"], int)
    assert d["schemaVersion"] >= 36
    assert d["uid"]
    assert d["title"]
    assert d["id"] is None
    # dashboard 12239's convention: one Prometheus data source input, DS_PROMETHEUS, that every panel and query uses
    assert d["__inputs"] == [
        {
            "name": "DS_PROMETHEUS",
            "label": "Prometheus",
            "description": "",
            "type": "datasource",
            "pluginId": "prometheus",
            "pluginName": "Prometheus",
        }
    ]
    sources = [p["datasource"] for p in d["panels"]] + [t["datasource"] for p in d["panels"] for t in p["targets"]]
    sources += [v["datasource"] for v in d["templating"]["list"]]
    assert all(s == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"} for s in sources)
    assert [v["name"] for v in d["templating"]["list"]] == ["run", "Hostname", "gpu"]
    ids = [p["id"] for p in d["panels"]]
    assert len(set(ids)) == len(ids)
    assert all(isinstance(i, int) for i in ids)
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert min(g["w"], g["h"]) >= 1, p["title"]
        assert min(g["x"], g["y"]) >= 0, p["title"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        refs = [t["refId"] for t in p["targets"]]
        assert refs
        assert len(set(refs)) == len(refs)
    assert {p["title"] for p in d["panels"] if p["description"].startswith("GPU only")} == GPU_ONLY
    wanted = [
        "time_step_ms_p50",
        "time_step_ms_p90",
        "time_data_wait_fraction",
        "compute_tflops_per_sec",
        "compute_mfu",
        "compute_hfu",
        "time_samples_per_sec",
        "time_tokens_per_sec",
        "memory_peak_gb",
        "memory_capacity_gb",
        "amp_loss_scale",
        "amp_skipped_steps",
        "time_slowest_rank",
        "time_rank_skew",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    ]
    text = json.dumps(d)
    assert [w for w in wanted if w not in text] == []


def test_init_grafana_copies_the_dashboard_out_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "board.json"
    assert init_main(["grafana", "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == _dashboard()
    assert "import it in Grafana" in capsys.readouterr().out
    assert init_main(["grafana", "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err


# -- a real Prometheus ------------------------------------------------------------------------------------------------
def _prometheus_binary() -> str:
    found = shutil.which("prometheus") or str(Path(sys.prefix) / "prometheus" / "usr" / "bin" / "prometheus")
    if not os.access(found, os.X_OK):
        pytest.fail(
            "no Prometheus server: `make test` unpacks Debian's into .venv/prometheus (scripts/get_prometheus.sh); "
            "run that script, or put a prometheus binary on PATH"
        )
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(port: int, path: str, **params: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


def _wait_for(what: str, check, timeout: float = 90.0):
    """Poll ``check`` until it returns something true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            result = check()
            if result:
                return result
        if time.monotonic() > deadline:
            pytest.fail(f"Prometheus: {what} within {timeout} s")
        time.sleep(0.2)


class ScrapedBeforeTheEnd(pl.Callback):
    """Each rank waits at the end of training until Prometheus holds its last step, then all ranks meet, and rank 0
    waits for a moment at which Prometheus holds every rank's last step and the DCGM stand-in's gauge at once, and
    writes Prometheus's time of it: every endpoint was serving then (after it, a closed endpoint's series are marked
    stale). One scrape that times out on a busy machine marks that target's series stale until the next, so the
    moment is checked for all of them together, not one by one."""

    def __init__(self, port: int, out: str) -> None:
        self.port, self.out = port, out

    def on_train_end(self, trainer, pl_module):
        rank = trainer.global_rank
        prom = next(logger for logger in trainer.loggers if isinstance(logger, PrometheusLogger))
        with urllib.request.urlopen(f"http://127.0.0.1:{prom.port_in_use}/metrics", timeout=10) as response:
            served = response.read().decode()
        step = float(re.search(r"^lit_compute_step\{[^}]*\} (\S+)$", served, re.MULTILINE).group(1))

        def scraped():
            query = f'lit_compute_step{{rank="{rank}"}} >= {step}'
            return _api(self.port, "query", query=query)["result"]

        _wait_for(f"rank {rank}'s last step ({step:g}) scraped", scraped)
        trainer.strategy.barrier()
        if rank == 0:
            ranks = trainer.world_size
            everything = (
                f"count(lit_compute_step >= {step}) == {ranks} and on() count(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE) == 1"
            )

            def all_scraped():
                return _api(self.port, "query", query=everything)["result"]

            moment = _wait_for("every rank's last step and the DCGM gauge scraped at one moment", all_scraped)
            Path(self.out).write_text(str(moment[0]["value"][0]))
        trainer.strategy.barrier()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_panel_query_returns_data_from_a_real_prometheus_and_the_dcgm_join_works(tmp_path):
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    prometheus = _prometheus_binary()
    # a stand-in for dcgm-exporter on this host: its profiling gauges, with the labels it gives a GPU (this host's)
    registry = CollectorRegistry()
    host = device_labels(torch.device("cpu"))
    dcgm = Gauge("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Tensor pipe active ratio", list(host), registry=registry)
    dcgm.labels(**host).set(0.5)
    dcgm_server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    sd = tmp_path / "sd"
    sd.mkdir()
    (sd / "dcgm.json").write_text(json.dumps([{"targets": [f"127.0.0.1:{dcgm_server.server_address[1]}"]}]))
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: training\n"
        "    honor_labels: true\n"  # the series' own run and rank, not exported_run beside the target's
        f"    file_sd_configs: [{{files: ['{sd}/*.json'], refresh_interval: 1s}}]\n"
    )
    server = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "prometheus.log", "wb"),  # noqa: SIM115 - the server's log, closed with the process
        start_new_session=True,
    )
    try:
        _wait_for("ready", lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5).status == 200)
        moment = tmp_path / "moment"
        trainer = make_trainer(
            tmp_path,
            devices=2,
            strategy=SpawnDDP(),
            max_steps=4,
            limit_train_batches=8,
            limit_val_batches=0,
            logger=[
                pl.loggers.TensorBoardLogger(str(tmp_path), name="tb"),
                PrometheusLogger(port=0, file_sd_dir=str(sd)),
            ],
            callbacks=[
                FlopsLogger(peak_flops=1e11),
                StepTimeMonitor(log_every_n_steps=1),
                MemoryMonitor(),
                ScrapedBeforeTheEnd(port, str(moment)),
            ],
        )
        trainer.fit(small_model(), train_dataloaders=DataLoader(RandomImages(n=64), batch_size=4))
        at = moment.read_text()
        results = {}
        for title, expr in _queries(_dashboard()):
            results.setdefault(title, []).extend(_api(port, "query", query=expr, time=at)["result"])
        empty = sorted(t for t, series in results.items() if not series)
        assert empty == sorted(GPU_ONLY), f"panels with no data: {empty}"
        # the variables' values: both ranks' runs, this host, its device label
        for var in _dashboard()["templating"]["list"]:
            name = re.match(r"label_values\((.*), (\w+)\)$", var["definition"])
            assert name, var
            selector = name.group(1)
            for key, value in ALL.items():
                selector = selector.replace(key, value)
            values = _api(port, f"label/{name.group(2)}/values", **{"match[]": selector, "time": at})
            assert values, var["name"]
        # the join the docs show: lit_compute's MFU times DCGM's tensor activity of the same device, for each rank
        # (every rank sends its own figures to a PrometheusLogger with ranks="all")
        join = "lit_compute_compute_mfu * on(UUID) group_left() DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
        joined = _api(port, "query", query=join, time=at)["result"]
        assert sorted(s["metric"]["rank"] for s in joined) == ["0", "1"]
        mfu = _api(port, "query", query="lit_compute_compute_mfu", time=at)["result"]
        by_rank = {s["metric"]["rank"]: float(s["value"][1]) for s in mfu}
        assert all(float(s["value"][1]) == pytest.approx(0.5 * by_rank[s["metric"]["rank"]]) for s in joined)
        assert {s["metric"]["UUID"] for s in joined} == {host["UUID"]}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        dcgm_server.shutdown()
