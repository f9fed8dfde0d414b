"""Training a config with ``lit-compute fit`` in a fresh process: the arguments the measured parts share, the
run folder each reads, and how a prediction's error is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]

LOGGER = (
    "--trainer.logger=[{class_path: lightning.pytorch.loggers.TensorBoardLogger, init_args: {save_dir: %s, "
    "name: runs}}]"
)

#: a short run by steps: logged every 5, no validation, no progress bar
SHORT_RUN = [
    "--trainer.max_epochs=null",
    "--trainer.log_every_n_steps=5",
    "--trainer.limit_val_batches=0",
    "--trainer.num_sanity_val_steps=0",
    "--trainer.enable_progress_bar=false",
]

IMAGE_ARGS = [
    "--config",
    "configs/baseline.yaml",
    "--trainer.max_steps=50",
    *SHORT_RUN,
    "--data.init_args.image_size=64",
    "--data.init_args.num_workers=0",
    "--model.init_args.arch=resnet18",
    "--data.init_args.batch_size=16",
]

GPT_ARGS = [
    "--config",
    "configs/gpt_baseline.yaml",
    "--trainer.max_steps=50",
    *SHORT_RUN,
    "--data.init_args.mode=packed",
    "--data.init_args.seq_len=128",
    "--data.init_args.max_tokens=300000",
    "--model.init_args.block_size=128",
    "--model.init_args.n_layer=2",
    "--data.init_args.batch_size=8",
]

MEASURING_CALLBACKS = (
    "--trainer.callbacks=[{class_path: lit_compute.FlopsLogger, init_args: {peak: measure}}, "
    "{class_path: lit_compute.StepTimeMonitor, init_args: {window: 10}}, "
    "{class_path: lit_compute.MemoryMonitor}]"
)


def fit_run(args: list[str], out: str, timeout: float = 900) -> Path:
    """Train with ``lit-compute fit`` in a fresh process; the run's TensorBoard folder."""
    command = [sys.executable, "-m", "lit_compute.cli", "fit", *args, LOGGER % out]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"lit-compute fit {' '.join(args[:2])} failed: {done.stderr[-1500:]}")
    return max(Path(out, "runs").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))


def error_text(predicted: float, measured: float) -> str:
    return f"{100 * (predicted / measured - 1):+.1f}%"


def median_run(runs: list[Any]) -> Any:
    """The run of median step time (the facts of one real run, not an average of several)."""
    return sorted(runs, key=lambda r: r.step_s)[len(runs) // 2]
