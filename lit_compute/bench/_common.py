"""Shared pieces of the benchmarks: Markdown tables, step timing, an in-memory image dataset."""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lit_compute.figures import figure_header
from lit_compute.formatting import markdown_table
from lit_compute.hardware.this_machine import bf16_fast, machine_line
from lit_compute.intervals import half_width

__all__ = [
    "StepTimer",
    "cumulative_rows",
    "emit",
    "figure_header",
    "low_precision",
    "machine_line",
    "markdown",
    "median",
    "random_image_loader",
]


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


def ratio_interval(ratios: list[float]) -> tuple[float, float, float]:
    """A ratio measured in pairs (one configuration beside the other, in alternating order) and its 95% interval:
    the geometric mean of the pairs' ratios, Student's t at pairs - 1 over their logs (a pair's drift hits both of its
    runs, so the pairs are the samples). Below two pairs the interval is unbounded.

    >>> center, low, high = ratio_interval([1.0, 1.02, 0.98, 1.0])
    >>> round(center, 4), round(low, 3), round(high, 3)
    (0.9999, 0.974, 1.026)
    """
    logs = [math.log(r) for r in ratios]
    center = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(center), 0.0, math.inf
    half = half_width(logs)
    return math.exp(center), math.exp(center - half), math.exp(center + half)


def cumulative_rows(base: dict[str, Any], steps: list[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Recipe rows where each adds one change to the row above: ``(slug, name, change)`` -> settings per row."""
    rows, current = [], dict(base)
    for slug, name, change in steps:
        current = {**current, **change}
        rows.append({"slug": slug, "name": name, **current})
    return rows


def low_precision(device: str) -> str:
    """bf16-mixed where bf16 is fast (:func:`~lit_compute.hardware.this_machine.bf16_fast`: GPUs with bf16, CPUs whose
    training blocks run faster in bf16), else 16-mixed on a GPU and 32-true on a CPU."""
    if bf16_fast(device)[0]:
        return "bf16-mixed"
    return "16-mixed" if device == "cuda" else "32-true"


def run_fit(args: list[str], log: Any, warm: bool = True, timeout: float = 900) -> int:
    """``lit-compute fit ARGS`` from the repository root (its ``examples`` import from there), its output in the
    file ``log``; forked from the helper that imported torch and Lightning once (:mod:`lit_compute.warm_start`) or, with
    ``warm=False``, a new interpreter. Its exit status; a run past ``timeout`` seconds is stopped with its process group
    and raises ``subprocess.TimeoutExpired``."""
    import subprocess
    from pathlib import Path

    from lit_compute.warm_start import start_process, stop_group

    root = Path(__file__).resolve().parents[2]
    command = ["-m", "lit_compute.cli", "fit", *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    with open(log, "w") as stream:
        proc: Any = (
            start_process(command, stdout=stream, env=env, cwd=root)
            if warm
            else subprocess.Popen(
                [sys.executable, *command], stdout=stream, stderr=subprocess.STDOUT, env=env, cwd=root
            )
        )
        try:
            return int(proc.wait(timeout=timeout))
        finally:
            if proc.poll() is None:
                stop_group(proc)
