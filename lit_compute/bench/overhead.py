"""``lit-compute bench overhead --callback NAME``: steady-state step time with and without a callback.

The two configurations alternate round by round on the same model and in-memory data (so drift in the
machine's speed hits both), and the ratio of median step times is printed.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable

import lightning.pytorch as pl

from lit_compute.bench._common import StepTimer, emit, machine_line, markdown, median, random_image_loader
from lit_compute.models import ImageClassifier


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
    "flops": _flops, "step_time": _step_time, "device": _device, "profiler": _profiler,
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lit-compute bench overhead", description=__doc__)
    parser.add_argument("--callback", choices=sorted(CALLBACKS), required=True)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30, help="training steps per round and configuration")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--accelerator", default="auto")
    args = parser.parse_args(argv)

    emit(f"# bench overhead --callback {args.callback}: {args.model} at {args.image_size}px, batch "
         f"{args.batch_size}, {args.rounds} rounds x {args.steps} steps per configuration, alternating\n"
         f"# {machine_line()}\n")
    pl.seed_everything(0, verbose=False)
    model = ImageClassifier(args.model, num_classes=10)
    loader = random_image_loader(args.batch_size * args.steps, args.batch_size, args.image_size)
    callback = CALLBACKS[args.callback]()
    timers = {"without": StepTimer(skip=3), "with": StepTimer(skip=3)}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ["without", "with"] if r % 2 == 0 else ["with", "without"]
            for variant in order:
                callbacks = [timers[variant]] + ([callback] if variant == "with" else [])
                trainer = pl.Trainer(
                    accelerator=args.accelerator, devices=1, max_steps=args.steps, callbacks=callbacks,
                    logger=pl.loggers.TensorBoardLogger(tmp, name=variant), enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=10,
                    num_sanity_val_steps=0, limit_val_batches=0,
                )
                trainer.fit(model, train_dataloaders=loader)
    base = median(timers["without"].times)
    rows = []
    for variant in ("without", "with"):
        times = timers[variant].times
        m = median(times)
        rows.append([f"{variant} {args.callback}", len(times), round(m * 1e3, 2),
                     round(sum(times) / len(times) * 1e3, 2), round(m / base, 4)])
    emit(markdown(["configuration", "steps timed", "median step ms", "mean step ms", "ratio to without"], rows))
    ratio = median(timers["with"].times) / base
    emit(f"\noverhead ratio (median step time with / without): {ratio:.4f}")
    return 0
