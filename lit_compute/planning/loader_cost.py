"""What a run's training loader costs in the training process, split into a cost per batch and a cost per sample,
timed apart from the run (``lit-compute whatif`` prices a target's input with it).

A loader without workers runs in the training process: each step waits for it. Part of that wait does not grow
with the batch (Lightning's fetch and hooks, a collate's fixed work, a file opened per batch) and part does (each
sample decoded and augmented). One batch size cannot tell them apart, so :func:`loader_cost` builds the run's own
training loader from its config (``config.yaml`` in the run folder, written by ``lit-compute fit``) and times a few
batches at two batch sizes, in this process: the cost per batch is the line's intercept, the cost per sample its
slope.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LoaderCost", "loader_cost", "time_batches", "time_loader"]


@dataclass
class LoaderCost:
    """Seconds a loader takes per batch of ``n`` samples in the training process: ``per_batch + per_sample * n``."""

    per_batch: float
    per_sample: float
    sizes: tuple[int, int]  # the two batch sizes timed
    seconds: tuple[float, float]  # their mean seconds per batch

    def at(self, n: int) -> float:
        return self.per_batch + self.per_sample * n


def time_batches(dataset: Any, collate_fn: Any, size: int, batches: int,
                 clock: Callable[[], float] = time.perf_counter) -> float:
    """Mean seconds per batch of ``size`` samples of ``dataset`` through ``collate_fn`` in this process, over
    ``batches`` batches after a first one (which may fill caches)."""
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=size, collate_fn=collate_fn, num_workers=0, shuffle=False)
    it = iter(loader)
    next(it)
    start, timed = clock(), 0
    for _ in range(batches):
        try:
            next(it)
        except StopIteration:
            break
        timed += 1
    if not timed:
        raise ValueError(f"the dataset holds fewer than {2 * size} samples: nothing to time at batch {size}")
    return (clock() - start) / timed


def fit_line(sizes: tuple[int, int], seconds: tuple[float, float]) -> LoaderCost:
    """The cost per batch and per sample through two timed batch sizes (neither below 0)."""
    (s1, s2), (t1, t2) = sizes, seconds
    per_sample = max(0.0, (t2 - t1) / (s2 - s1))
    per_batch = max(0.0, t1 - per_sample * s1)
    return LoaderCost(per_batch, per_sample, sizes, seconds)


def loader_cost(run_dir: str | Path, batch_size: int, batches: int = 3,
                clock: Callable[[], float] = time.perf_counter) -> LoaderCost:
    """Time the training loader of the run in ``run_dir`` (its ``config.yaml``) at ``batch_size`` and half of it
    (1 and 2 for a batch of 1). Raises ``FileNotFoundError`` without a config, ``ValueError`` when its loader cannot
    be built or timed (the message says why)."""
    from lit_compute.planning.estimate import _build

    config = Path(run_dir) / "config.yaml"
    if not config.is_file():
        raise FileNotFoundError(f"{run_dir} has no config.yaml (runs of lit-compute fit write one)")
    import tempfile

    import yaml

    # the fit subcommand's own keys (ckpt_path, weights_only) are not the classes' settings: left out
    saved = yaml.safe_load(config.read_text()) or {}
    kept = {k: v for k, v in saved.items() if k in ("seed_everything", "trainer", "model", "data", "optimizer",
                                                     "lr_scheduler")}
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        classes = Path(tmp, "config.yaml")
        classes.write_text(yaml.safe_dump(kept))
        try:
            pieces = _build(classes, [])
        except SystemExit as err:  # the CLI's one line for a config that does not build here
            raise ValueError(f"its config does not build here (exit {err.code})") from None
    return time_loader(pieces.loader, batch_size, batches, clock)


def time_loader(loader: Any, batch_size: int, batches: int = 3,
                clock: Callable[[], float] = time.perf_counter) -> LoaderCost:
    """Time ``loader``'s dataset and collate at ``batch_size`` and half of it (1 and 2 for a batch of 1), in this
    process. Raises ``ValueError`` for a loader that is not a torch DataLoader or holds too few samples."""
    dataset, collate = getattr(loader, "dataset", None), getattr(loader, "collate_fn", None)
    if dataset is None:
        raise ValueError(f"its loader is a {type(loader).__name__}, not a torch DataLoader")
    sizes = (max(1, batch_size // 2), batch_size) if batch_size > 1 else (1, 2)
    seconds = (time_batches(dataset, collate, sizes[0], batches, clock),
               time_batches(dataset, collate, sizes[1], batches, clock))
    return fit_line(sizes, seconds)
