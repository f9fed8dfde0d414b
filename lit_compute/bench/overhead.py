"""``lit-compute bench overhead --callback NAME``: steady-state step time with and without a callback.

The two configurations alternate round by round on the same model and in-memory data (so drift in the
machine's speed hits both), and the ratio of median step times is printed. On a busy machine that ratio moves by
a few percent from run to run, so the time spent inside the callback's own Lightning hooks is measured directly
too (per step, median), which no other process can inflate by more than it slows the hooks themselves.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lit_compute.bench._common import (
    StepTimer,
    emit,
    machine_line,
    markdown,
    median,
    random_image_loader,
    ratio_interval,
)
from lit_compute.intervals import t95
from lit_compute.models import ImageClassifier


class HookClock:
    """Wall time inside a callback's own Lightning hooks (every ``on_*`` method its class overrides), per step."""

    def __init__(self, callback: pl.Callback) -> None:
        self.total = 0.0
        self.per_step: list[float] = []
        self._mark = 0.0
        for name in dir(type(callback)):
            if name.startswith("on_") and getattr(type(callback), name) is not getattr(pl.Callback, name, None):
                setattr(callback, name, self._timed(getattr(callback, name)))

    def _timed(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(hook)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return hook(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - start

        return timed

    def step_done(self) -> None:
        self.per_step.append(self.total - self._mark)
        self._mark = self.total


class _StepMark(pl.Callback):
    """Last in the list: closes a step's hook time after every other callback's ``on_train_batch_end``."""

    def __init__(self, clock: HookClock, skip: int) -> None:
        self.clock, self.skip, self._seen = clock, skip, 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._seen = 0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self._seen >= self.skip:
            self.clock.step_done()
        else:
            self.clock._mark = self.clock.total
        self._seen += 1


def _flops() -> pl.Callback:
    from lit_compute.flops import FlopsLogger

    return FlopsLogger(peak="measure", log_every_n_steps=10)


def _step_time() -> pl.Callback:
    from lit_compute.monitoring import StepTimeMonitor

    return StepTimeMonitor(log_every_n_steps=10)


def _device() -> pl.Callback:
    from lit_compute.monitoring import DeviceMonitor

    return DeviceMonitor(log_every_n_steps=10)


def _profiler() -> pl.Callback:
    from lit_compute.profiling import ProfilerWindow

    # the window lies beyond the benchmark: what is measured is the cost outside windows, which must be none
    return ProfilerWindow(start_step=10**9)


CALLBACKS: dict[str, Callable[[], pl.Callback]] = {
    "flops": _flops,
    "step_time": _step_time,
    "device": _device,
    "profiler": _profiler,
}


def variable_length_loader(n_batches: int, batch_size: int, lengths: tuple[int, int], vocab: int) -> list[dict]:
    """Token batches whose lengths vary between ``lengths`` (each padded to its own longest, with a mask), in
    memory: the same batches in the same order for every round."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(n_batches):
        sizes = torch.randint(lengths[0], lengths[1] + 1, (batch_size,), generator=g).tolist()
        longest = max(sizes)
        ids = torch.randint(0, vocab, (batch_size, longest), generator=g)
        mask = (torch.arange(longest)[None, :] < torch.tensor(sizes)[:, None]).long()
        batches.append({"input_ids": ids * mask, "attention_mask": mask})
    return batches


def resolved(ratios: list[float], tolerance: float) -> bool:
    """Whether the rounds' interval is narrow enough to tell ``1 +- tolerance`` from what lies beyond it: its half
    width (in logs) at most ``tolerance``."""
    _, low, high = ratio_interval(ratios)
    return math.log(high / low) / 2 <= tolerance


def rounds_to_resolve(ratios: list[float], tolerance: float, limit: int = 10_000) -> int | None:
    """How many rounds at the spread ``ratios`` show would give an interval of half width ``tolerance``; None from
    fewer than three rounds (no spread to go by) or beyond ``limit``."""
    if len(ratios) < 3:
        return None
    spread = statistics.stdev(math.log(r) for r in ratios)
    return next((n for n in range(2, limit) if t95(n - 1) * spread / math.sqrt(n) <= tolerance), None)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lit-compute bench overhead", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--callback", choices=sorted(CALLBACKS), required=True, help="the callback to measure")
    parser.add_argument("--model", default="resnet18", help="torchvision model (image batches)")
    parser.add_argument("--image-size", type=int, default=64, help="image side")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per batch (variable-length: 8)")
    parser.add_argument("--steps", type=int, default=30, help="training steps per round and configuration")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per configuration, alternating")
    parser.add_argument(
        "--resolve",
        type=float,
        default=None,
        metavar="PERCENT",
        help="after --rounds, go on round by round until the ratio's 95%% interval is within +-PERCENT (or "
        "--max-rounds); says how many rounds it took",
    )
    parser.add_argument("--max-rounds", type=int, default=60, help="the most rounds --resolve runs")
    parser.add_argument("--accelerator", default="auto", help="Lightning accelerator")
    parser.add_argument(
        "--variable-length",
        action="store_true",
        help="a small GPT (lit_compute.models.GPT) on token batches of 64..256 tokens, padded per batch",
    )
    parser.add_argument(
        "--sharded",
        choices=["fsdp2", "tp"],
        default=None,
        help="a small GPT sharded on 2 processes by Lightning's ModelParallelStrategy: FSDP2 "
        "(data parallel 2) or tensor parallel 2; fixed-length token batches; rank 0's steps timed",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1 round is needed (the default is 6)")
    if args.resolve is not None and not 0 < args.resolve < 100:
        parser.error(f"--resolve {args.resolve}: a percent between 0 and 100, e.g. --resolve 1")
    if args.resolve is not None and args.max_rounds < args.rounds:
        parser.error(f"--max-rounds {args.max_rounds} is below --rounds {args.rounds}: raise it or drop --resolve")

    pl.seed_everything(0, verbose=False)
    devices: int = 1
    strategy: Callable[[], Any] = functools.partial(str, "auto")  # a new strategy per Trainer
    if args.sharded:
        from lightning.pytorch.strategies import ModelParallelStrategy

        from lit_compute.models import GPT

        data_parallel = 2 if args.sharded == "fsdp2" else 1
        strategy = functools.partial(
            ModelParallelStrategy, data_parallel_size=data_parallel, tensor_parallel_size=2 // data_parallel
        )
        devices = 2
        batch = 8 if args.batch_size == parser.get_default("batch_size") else args.batch_size
        model: pl.LightningModule = GPT(vocab_size=256, block_size=128, n_layer=2, n_head=4, n_embd=128)
        g = torch.Generator().manual_seed(0)
        loader: Any = DataLoader(
            [
                {"input_ids": torch.randint(0, 256, (batch, 128), generator=g)}  # type: ignore[arg-type]
                for _ in range(args.steps * data_parallel)
            ],
            batch_size=None,
        )  # per replica
        what = (
            f"GPT (2 layers, width 128) on 2 processes, {args.sharded} (data parallel {data_parallel} x tensor "
            f"parallel {2 // data_parallel}), fixed-length batches of {batch} x 128 tokens per replica"
        )
    elif args.variable_length:
        from lit_compute.models import GPT

        batch = 8 if args.batch_size == parser.get_default("batch_size") else args.batch_size
        model = GPT(vocab_size=256, block_size=256, n_layer=2, n_head=4, n_embd=128)
        loader = DataLoader(
            variable_length_loader(args.steps, batch, (64, 256), 256),  # type: ignore[arg-type]
            batch_size=None,
        )  # a list is a map-style dataset
        what = f"GPT (2 layers, width 128) on token batches of 64..256 tokens padded per batch, batch {batch}"
    else:
        model = ImageClassifier(args.model, num_classes=10)
        loader = random_image_loader(args.batch_size * args.steps, args.batch_size, args.image_size)
        what = f"{args.model} at {args.image_size}px, batch {args.batch_size}"
    emit(
        f"# bench overhead --callback {args.callback}: {what}, {args.rounds} rounds x {args.steps} steps per "
        f"configuration, alternating\n# {machine_line()}\n"
    )
    callback = CALLBACKS[args.callback]()
    hooks = HookClock(callback)
    timers = {"without": StepTimer(skip=3), "with": StepTimer(skip=3)}
    rounds: dict[str, list[float]] = {"without": [], "with": []}  # each round's median step
    tolerance = math.log1p(args.resolve / 100) if args.resolve is not None else None

    def go_on(r: int) -> bool:
        if r < args.rounds:
            return True
        if tolerance is None or r >= args.max_rounds:
            return False
        return not resolved([w / wo for w, wo in zip(rounds["with"], rounds["without"])], tolerance)

    with tempfile.TemporaryDirectory() as tmp:
        r = 0
        while go_on(r):
            order = ["without", "with"] if r % 2 == 0 else ["with", "without"]
            r += 1
            for variant in order:
                emit(
                    f"  round {r}/{args.rounds if r <= args.rounds else args.max_rounds}: {variant} {args.callback} ..."
                )
                callbacks = [timers[variant]] + ([callback, _StepMark(hooks, skip=3)] if variant == "with" else [])
                trainer = pl.Trainer(
                    accelerator=args.accelerator,
                    devices=devices,
                    strategy=strategy(),
                    max_steps=args.steps,
                    callbacks=callbacks,
                    logger=pl.loggers.TensorBoardLogger(tmp, name=variant),
                    enable_checkpointing=False,
                    enable_progress_bar=False,
                    enable_model_summary=False,
                    log_every_n_steps=10,
                    num_sanity_val_steps=0,
                    limit_val_batches=0,
                )
                before = len(timers[variant].times)
                trainer.fit(model, train_dataloaders=loader)
                rounds[variant].append(median(timers[variant].times[before:]))
    base = median(timers["without"].times)
    rows = []
    for variant in ("without", "with"):
        times = timers[variant].times
        m = median(times)
        rows.append(
            [
                f"{variant} {args.callback}",
                len(times),
                round(m * 1e3, 2),
                round(sum(times) / len(times) * 1e3, 2),
                round(m / base, 4),
            ]
        )
    emit(markdown(["configuration", "steps timed", "median step ms", "mean step ms", "ratio to without"], rows))
    ratio = median(timers["with"].times) / base
    emit(f"\noverhead ratio (median step time with / without): {ratio:.4f}")
    paired = [w / wo for w, wo in zip(rounds["with"], rounds["without"])]
    pairs = sorted(paired)
    emit(
        f"per-round ratios (each round's median with / without; a machine's drift between rounds shows here): "
        f"median {median(pairs):.4f}, range {pairs[0]:.4f}-{pairs[-1]:.4f} over {len(pairs)} rounds"
    )
    center, low, high = ratio_interval(paired)
    emit(f"ratio over the paired rounds: {center:.4f}, 95% interval {low:.4f}-{high:.4f} ({len(paired)} rounds)")
    if tolerance is not None:
        goal = f"+-{args.resolve:g}%"
        if resolved(paired, tolerance):
            emit(f"resolved to {goal} after {len(paired)} rounds")
        else:
            needed = rounds_to_resolve(paired, tolerance)
            emit(
                f"not resolved to {goal} in {len(paired)} rounds (--max-rounds {args.max_rounds}); at this spread "
                + (f"about {needed} rounds would" if needed else "no practical number of rounds would")
            )
    inside = median(hooks.per_step)
    emit(
        f"time inside {type(callback).__name__}'s hooks: median {inside * 1e3:.3f} ms per step "
        f"({100 * inside / base:.2f}% of the median step without it; {len(hooks.per_step)} steps)"
    )
    counter: Any = callback if hasattr(callback, "counted_batches") else None
    if counter is not None:
        emit(
            f"FlopsLogger counted {counter.counted_batches} batches for real and predicted {counter.predicted_batches} "
            f"over {args.rounds // 2 + args.rounds % 2} rounds"
        )
    return 0
