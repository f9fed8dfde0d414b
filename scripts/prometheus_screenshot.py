"""Screenshot Prometheus's own graph page of a short CPU run's PrometheusLogger series (how docs/prometheus_graph.png is
made; there is no Grafana to run here).

    bash scripts/get_prometheus.sh .venv --web && python scripts/prometheus_screenshot.py OUT.png [--steps 80]

Starts Prometheus (on PATH, or the one ``scripts/get_prometheus.sh`` unpacked into .venv) on 127.0.0.1 at a free port,
scraping through ``file_sd`` every second; trains the demo's ResNet-18 on its synthetic images with FlopsLogger
(measured peak), StepTimeMonitor, MemoryMonitor and PrometheusLogger; waits until Prometheus holds the run's last step;
has the browser render two of the dashboard's queries and write a PNG; stops Prometheus by its PID. Needs a Chromium
(Debian: ``apt-get install chromium``); nothing here is part of the package or its tests.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tensorboard_screenshot import screenshot  # scripts/ is on the path of a script run from it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())["data"]["result"]


def _wait(what: str, check, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"prometheus_screenshot.py: {what} did not happen within {timeout} s")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1450)
    parser.add_argument("--browser", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args(argv)
    binary = shutil.which("prometheus") or str(Path(sys.prefix) / "prometheus" / "usr" / "bin" / "prometheus")
    work = Path(tempfile.mkdtemp(prefix="prometheus_screenshot_"))
    sd = work / "sd"
    sd.mkdir()
    port = _free_port()
    (work / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: lit_compute\n"
        "    honor_labels: true\n"
        f"    file_sd_configs: [{{files: ['{sd}/*.json'], refresh_interval: 1s}}]\n"
    )
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            # the pages' templates and scripts beside the binary (Debian's package keeps them apart from it)
            f"--web.local-assets={Path(binary).resolve().parents[1] / 'share' / 'prometheus' / 'web'}/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait("Prometheus ready", lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready").status == 200)
        import lightning.pytorch as pl

        from lit_compute import (
            FlopsLogger,
            ImageClassifier,
            MemoryMonitor,
            PrometheusLogger,
            StepTimeMonitor,
            TorchvisionImageDataModule,
        )

        prom = PrometheusLogger(port=0, run_name="demo", file_sd_dir=str(sd), keep_serving=True)
        trainer = pl.Trainer(
            accelerator="cpu",
            max_steps=args.steps,
            log_every_n_steps=2,
            limit_val_batches=0,
            enable_checkpointing=False,
            enable_progress_bar=False,
            default_root_dir=str(work),
            logger=[pl.loggers.TensorBoardLogger(str(work), name="tb"), prom],
            callbacks=[FlopsLogger(peak="measure"), StepTimeMonitor(), MemoryMonitor()],
        )
        data = TorchvisionImageDataModule(batch_size=16, image_size=64, num_workers=0)
        trainer.fit(ImageClassifier(arch="resnet18", num_classes=10), datamodule=data)
        last = trainer.global_step - 1
        _wait("the last step scraped", lambda: _query(port, f"lit_compute_step >= {last}"))
        prom.close()
        panels = {
            "g0.expr": '{__name__=~"lit_compute_time_step_ms_p50|lit_compute_time_step_ms_p90", run="demo"}',
            "g1.expr": 'lit_compute_compute_mfu{run="demo"}',
        }
        params = {**panels, "g0.tab": "0", "g1.tab": "0", "g0.range_input": "1m", "g1.range_input": "1m"}
        url = f"http://127.0.0.1:{port}/graph?{urllib.parse.urlencode(params)}"
        screenshot(args.browser, url, os.path.abspath(args.out), args.width, args.height, 15000)
        print(args.out)
        return 0
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
