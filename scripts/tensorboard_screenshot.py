"""Screenshot TensorBoard's Custom Scalars page of a log dir in a headless browser (how docs/*.png are made).

    python scripts/tensorboard_screenshot.py LOG_DIR OUT.png [--height 4000] [--browser chromium]

Starts TensorBoard on 127.0.0.1 at a free port, waits until it serves the runs' tags, has the browser render
``#custom_scalars`` and write a PNG, then stops TensorBoard by its PID. Needs a Chromium (Debian: ``apt-get install
chromium``); nothing here is part of the package or its tests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serving(port: int) -> bool:
    try:
        url = f"http://127.0.0.1:{port}/data/plugin/custom_scalars/layout"
        layout = json.loads(urllib.request.urlopen(url, timeout=5).read())
        return bool(layout.get("category"))
    except OSError:
        return False


def screenshot(browser: str, url: str, out: str, width: int, height: int, wait_ms: int) -> None:
    """Have a headless Chromium render ``url`` for ``wait_ms`` of virtual time and write it to ``out`` (a PNG)."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                f"--virtual-time-budget={wait_ms}",
                f"--screenshot={out}",
                url,
            ],
            check=True,
            timeout=300,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log_dir")
    parser.add_argument("out")
    parser.add_argument("--width", type=int, default=1500)
    parser.add_argument("--height", type=int, default=4000)
    parser.add_argument("--browser", default=shutil.which("chromium") or "chromium")
    parser.add_argument("--wait-ms", type=int, default=20000, help="virtual time the page gets to draw its charts")
    args = parser.parse_args(argv)
    port = _free_port()
    board = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            args.log_dir,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast=false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not _serving(port):
            if time.monotonic() > deadline or board.poll() is not None:
                print(f"TensorBoard did not serve a custom-scalars layout for {args.log_dir}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/#custom_scalars"
        screenshot(args.browser, url, args.out, args.width, args.height, args.wait_ms)
        print(args.out)
        return 0
    finally:
        board.terminate()
        board.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
