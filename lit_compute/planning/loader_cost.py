"""What a run's training loader costs in the training process, split into a cost per batch and a cost per sample,
timed apart from the run (``lit-compute whatif`` prices a target's input with it).

A loader without workers runs in the training process: each step waits for it. Part of that wait does not grow
with the batch (Lightning's fetch and hooks, a collate's fixed work, a file opened per batch) and part does (each
sample decoded and augmented). One batch size cannot tell them apart, so :func:`loader_cost` builds the run's own
training loader from its config (``config.yaml`` in the run folder, written by ``lit-compute fit``) and times the
same samples at two batch sizes, in this process: what the smaller batches' extra batches cost is the cost per
batch, the rest the cost per sample. :func:`kept_loader_cost` keeps that timing in the run folder
(``loader_cost.json``), so that every later ``whatif`` of the run prices the same input instead of a new draw of
the machine's noise.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lit_compute import files

__all__ = [
    "KEPT_FILE",
    "LoaderCost",
    "fit_counts",
    "kept_loader_cost",
    "loader_cost",
    "run_config",
    "time_batches",
    "time_loader",
]

#: The file in a run folder that keeps its loader's timing (:func:`kept_loader_cost`).
KEPT_FILE = "loader_cost.json"


@dataclass
class LoaderCost:
    """Seconds a loader takes per batch of ``n`` samples in the training process: ``per_batch + per_sample * n``."""

    per_batch: float
    per_sample: float
    sizes: tuple[int, int]  # the two batch sizes timed
    seconds: tuple[float, float]  # their mean seconds per batch

    def at(self, n: int) -> float:
        return self.per_batch + self.per_sample * n

    def describe(self) -> str:
        return f"{self.per_batch * 1e3:.3g} ms a batch + {self.per_sample * 1e3:.3g} ms a sample"


def time_batches(
    dataset: Any,
    collate_fn: Any,
    size: int,
    batches: int,
    clock: Callable[[], float] = time.perf_counter,
    min_seconds: float = 0.2,
    max_batches: int = 64,
) -> tuple[float, int]:
    """``(seconds, batches timed)`` for the first samples of ``dataset`` in batches of ``size`` through
    ``collate_fn`` in this process, after a first batch (which may fill caches): at least ``batches`` batches, and
    more (up to ``max_batches``, or the end of the dataset) until ``min_seconds`` have been timed, so that a loader of
    a few milliseconds a batch is not read off three samples of the machine's noise."""
    from torch.utils.data import DataLoader

    # full batches only: every timed batch holds ``size`` samples
    loader = DataLoader(dataset, batch_size=size, collate_fn=collate_fn, num_workers=0, shuffle=False, drop_last=True)
    next(iter(loader))  # the warm-up: a pass of its own, so the timed pass starts at the first sample
    it, timed, start = iter(loader), 0, clock()
    while timed < max_batches and (timed < batches or clock() - start < min_seconds):
        try:
            next(it)
        except StopIteration:
            break
        timed += 1
    if not timed:
        raise ValueError(f"the dataset holds fewer than {size} samples: nothing to time at batch {size}")
    return clock() - start, timed


def _time_samples(
    dataset: Any, collate_fn: Any, size: int, samples: int, clock: Callable[[], float]
) -> tuple[float, int]:
    """``(seconds, batches)`` for the first ``samples`` samples in full batches of ``size`` (after a warm-up batch):
    the batches that hold them, so up to ``size - 1`` samples more when ``size`` does not divide ``samples``."""
    batches = -(-samples // size)
    return time_batches(dataset, collate_fn, size, batches, clock, min_seconds=0.0, max_batches=batches)


def run_config(config: Path) -> dict[str, Any]:
    """The classes' settings of a run's ``config.yaml``: the fit subcommand's own keys (``ckpt_path``,
    ``weights_only``) left out."""
    import yaml

    saved = yaml.safe_load(config.read_text()) or {}
    return {
        k: v
        for k, v in saved.items()
        if k in ("seed_everything", "trainer", "model", "data", "optimizer", "lr_scheduler")
    }


def loader_cost(
    run_dir: str | Path, batch_size: int, batches: int = 3, clock: Callable[[], float] = time.perf_counter
) -> LoaderCost:
    """Time the training loader of the run in ``run_dir`` (its ``config.yaml``) at ``batch_size`` and half of it
    (1 and 2 for a batch of 1). Raises ``FileNotFoundError`` without a config, ``ValueError`` when its loader cannot
    be built or timed (the message says why)."""
    from lit_compute.planning.estimate import build_pieces

    config = Path(run_dir) / "config.yaml"
    if not config.is_file():
        raise FileNotFoundError(f"{run_dir} has no config.yaml (runs of lit-compute fit write one)")
    import tempfile

    import yaml

    kept = run_config(config)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        classes = Path(tmp, "config.yaml")
        classes.write_text(yaml.safe_dump(kept))
        try:
            pieces = build_pieces(classes, [])
        except ValueError as err:  # the CLI's one line for a config that does not build here
            raise ValueError(f"its config does not build here: {err}") from None
    return time_loader(pieces.loader, batch_size, batches, clock)


def time_loader(
    loader: Any, batch_size: int, batches: int = 3, clock: Callable[[], float] = time.perf_counter, rounds: int = 2
) -> LoaderCost:
    """Time ``loader``'s dataset and collate at ``batch_size`` and half of it (1 and 2 for a batch of 1), in this
    process, over the same samples at both sizes (the larger size sets how many: at least ``batches`` batches and
    0.2 s), so a dataset whose samples differ in cost (random crops, images of different sizes) moves both sizes
    alike and the difference is the cost per batch. ``rounds`` passes at each size, alternating; each size's
    fastest pass (a pass the process was preempted in does not count). Raises ``ValueError`` for a loader that is
    not a torch DataLoader or holds too few samples."""
    dataset, collate = getattr(loader, "dataset", None), getattr(loader, "collate_fn", None)
    if dataset is None:
        raise ValueError(f"its loader is a {type(loader).__name__}, not a torch DataLoader")
    small, big = (max(1, batch_size // 2), batch_size) if batch_size > 1 else (1, 2)
    first, n_big = time_batches(dataset, collate, big, batches, clock)
    samples = n_big * big
    big_s, small_s, n_small = [first], [], 0
    for round_ in range(rounds):
        seconds, n_small = _time_samples(dataset, collate, small, samples, clock)
        small_s.append(seconds)
        if round_ + 1 < rounds:
            big_s.append(_time_samples(dataset, collate, big, samples, clock)[0])
    return fit_counts((small, big), (n_small, n_big), (min(small_s), min(big_s)))


def fit_counts(sizes: tuple[int, int], batches: tuple[int, int], seconds: tuple[float, float]) -> LoaderCost:
    """The cost per batch and per sample from ``batches[i]`` full batches of ``sizes[i]`` loaded in ``seconds[i]``
    (the same samples, or nearly: the smaller size's last batch may hold a few more): the two lines
    ``seconds = batches * per_batch + samples * per_sample`` solved together, neither cost below 0 (when one would
    be, the other carries all the time)."""
    (n1, n2), (t1, t2) = batches, seconds
    s1, s2 = n1 * sizes[0], n2 * sizes[1]
    det = n1 * s2 - n2 * s1
    per_batch = (t1 * s2 - t2 * s1) / det if det else 0.0
    per_sample = (n1 * t2 - n2 * t1) / det if det else (t1 + t2) / max(1, s1 + s2)
    if per_batch < 0:
        per_batch, per_sample = 0.0, (t1 + t2) / (s1 + s2)
    elif per_sample < 0:
        per_batch, per_sample = (t1 + t2) / (n1 + n2), 0.0
    return LoaderCost(per_batch, per_sample, sizes, (t1 / n1, t2 / n2))


def _kept_key(config: Path, batch_size: int) -> dict[str, Any]:
    """What a kept timing holds for: the run's config (its bytes), the batch size, this CPU and torch."""
    import torch

    from lit_compute.hardware.this_machine import cpu_name

    return {
        "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
        "batch_size": batch_size,
        "cpu": cpu_name(),
        "torch": torch.__version__,
    }


def kept_loader_cost(
    run_dir: str | Path, batch_size: int, timer: Callable[[Path, int], LoaderCost] | None = None
) -> tuple[LoaderCost, str]:
    """``(cost, note)``: the run's loader timed apart (:func:`loader_cost`) once and kept in
    ``run_dir/loader_cost.json``, then read back while the run's config, the batch size, this CPU and torch are the ones
    it was timed with (timed again when any differs, or the file is unreadable). A loader of a few milliseconds a batch
    moves by the machine's noise from one timing to the next; kept, every ``whatif`` of the run prices the same input. A
    folder that cannot be written keeps nothing (the note says so). ``timer``: what times it (default
    :func:`loader_cost`)."""
    run_dir = Path(run_dir)
    config, kept = run_dir / "config.yaml", run_dir / KEPT_FILE
    if not config.is_file():
        raise FileNotFoundError(f"{run_dir} has no config.yaml (runs of lit-compute fit write one)")
    key = _kept_key(config, batch_size)
    try:
        saved = json.loads(kept.read_text())
        if saved.get("key") == key:
            cost = LoaderCost(
                float(saved["per_batch_s"]),
                float(saved["per_sample_s"]),
                (int(saved["sizes"][0]), int(saved["sizes"][1])),
                (float(saved["seconds"][0]), float(saved["seconds"][1])),
            )
            return cost, (
                f"its loader, timed apart on this CPU at {saved.get('timed_at', '?')}: {cost.describe()} "
                f"(kept in {kept}; delete it to time again)"
            )
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass  # nothing kept, another run's or machine's timing, or a damaged file: time it now
    cost = (timer or loader_cost)(run_dir, batch_size)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    record = {
        "key": key,
        "timed_at": stamp,
        "per_batch_s": cost.per_batch,
        "per_sample_s": cost.per_sample,
        "sizes": list(cost.sizes),
        "seconds": list(cost.seconds),
    }
    try:
        files.write_whole(kept, json.dumps(record, indent=1))
        where = f"kept in {kept}; later whatifs of this run read it"
    except OSError as err:
        where = f"not kept: {kept} cannot be written ({err.strerror or err}), so each whatif times it again"
    return cost, f"its loader, timed apart on this CPU now: {cost.describe()} ({where})"
