"""Shared pieces of the benchmarks: Markdown tables, step timing, an in-memory image dataset."""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lit_compute.flops.peaks import measure_peak_flops
from lit_compute.formatting import markdown_table


def markdown(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table for a terminal: numbers as people read them (4 significant digits, thousands separated,
    never scientific notation), right-aligned."""
    return markdown_table(header, rows, aligned=True)


def emit(text: str) -> None:
    """Print a line (rank 0 only, when a bench runs several processes)."""
    if os.environ.get("LOCAL_RANK", "0") != "0" or os.environ.get("NODE_RANK", "0") != "0":
        return
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def machine_line() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {torch.get_num_threads()} torch threads, {gpu}, torch {torch.__version__}"


class StepTimer(pl.Callback):
    """Wall time of every training step (batch end to batch end), synchronising CUDA only when asked."""

    def __init__(self, skip: int = 3, sync: bool = False) -> None:
        self.skip = skip
        self.sync = sync
        self.times: list[float] = []
        self._last: float | None = None
        self._seen = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last, self._seen = None, 0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.sync and torch.cuda.is_available():
            torch.cuda.synchronize()
        now = time.perf_counter()
        if self._last is not None and self._seen >= self.skip:
            self.times.append(now - self._last)
        self._last = now
        self._seen += 1


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def random_image_loader(n: int, batch_size: int, image_size: int, num_classes: int = 10) -> DataLoader:
    """Random images already in memory: step-time benchmarks measure the model, not the decoder."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, image_size, image_size, generator=g)
    y = torch.randint(0, num_classes, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False, drop_last=True)


def cumulative_rows(base: dict[str, Any], steps: list[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Recipe rows where each adds one change to the row above: ``(slug, name, change)`` -> settings per row."""
    rows, current = [], dict(base)
    for slug, name, change in steps:
        current = {**current, **change}
        rows.append({"slug": slug, "name": name, **current})
    return rows


def low_precision(device: str) -> str:
    """bf16-mixed where bf16 matmuls are fast (GPUs with bf16, CPUs with bf16 units), else 16-mixed on GPU."""
    if device == "cuda":
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    fp32 = measure_peak_flops("cpu", torch.float32, size=1024, seconds=0.3)
    bf16 = measure_peak_flops("cpu", torch.bfloat16, size=1024, seconds=0.3)
    return "bf16-mixed" if bf16 > 1.2 * fp32 else "32-true"


def figure_header(command: str, machine: str) -> str:
    """The header every figure file in the docs carries: the command that wrote it, the commit, the date, the
    machine (a figure without it is not quoted)."""
    import datetime
    import subprocess as sp

    try:
        here = os.path.dirname(os.path.abspath(__file__))
        commit = sp.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                        cwd=here).stdout.strip() or "unknown"
        changed = sp.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."], capture_output=True,
                         text=True, timeout=10, cwd=os.path.dirname(here)).stdout.strip()
        if commit != "unknown" and changed:  # the package's own code differs from the commit: say so
            commit += " with uncommitted changes"
    except (OSError, sp.SubprocessError):
        commit = "unknown"
    # a copy on a borrowed machine: the commit its sender named wins (the copy's own git, if any, can be stale)
    commit = os.environ.get("LIT_COMPUTE_COMMIT") or commit
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"<!-- written by `{command}` at commit {commit} on {date}; machine: {machine} -->\n\n"
            f"*Written by `{command}` at commit `{commit}` on {date}; {machine}.*\n\n")
