"""``lit-compute bench precision``: training step time per precision mode, interleaved, as ratios to 32-true."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl

from lit_compute.bench._common import StepTimer, emit, machine_line, markdown, median, random_image_loader
from lit_compute.models import ImageClassifier
from lit_compute.precision import FP32BatchNormHalfPrecision, FP32BatchNormPrecision

CONFIGS: dict[str, Callable[[], dict[str, Any]]] = {
    "32-true": lambda: {"precision": "32-true"},
    "Lightning bf16-mixed": lambda: {"precision": "bf16-mixed"},
    "FP32BatchNormPrecision bf16-mixed": lambda: {"plugins": [FP32BatchNormPrecision("bf16-mixed")]},
    "FP32BatchNormHalfPrecision bf16-true": lambda: {"plugins": [FP32BatchNormHalfPrecision("bf16-true")]},
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lit-compute bench precision", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", default="resnet50", help="torchvision model")
    parser.add_argument("--image-size", type=int, default=128, help="image side (px)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per batch")
    parser.add_argument("--steps", type=int, default=10, help="steps per configuration and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, configurations interleaved")
    parser.add_argument("--accelerator", default="auto", help="Lightning accelerator")
    parser.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="channels-last memory format in every configuration",
    )
    args = parser.parse_args(argv)
    emit(
        f"# bench precision: {args.model} at {args.image_size}px, batch {args.batch_size}, {args.rounds} rounds x "
        f"{args.steps} steps per configuration, interleaved, channels_last={args.channels_last}\n# {machine_line()}\n"
    )
    loader = random_image_loader(args.batch_size * args.steps, args.batch_size, args.image_size)
    models, plugins_kwargs, timers, memory = {}, {}, {}, {}
    for name, make in CONFIGS.items():
        pl.seed_everything(0, verbose=False)
        models[name] = ImageClassifier(args.model, num_classes=10, channels_last=args.channels_last)
        plugins_kwargs[name] = make()  # one plugin instance per configuration, reused across rounds
        timers[name] = StepTimer(skip=2, sync=True)
    with tempfile.TemporaryDirectory() as tmp:
        names = list(CONFIGS)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                emit(f"  round {r + 1}/{args.rounds}: {name} ...")
                trainer = pl.Trainer(
                    accelerator=args.accelerator,
                    devices=1,
                    max_steps=args.steps,
                    callbacks=[timers[name]],
                    logger=False,
                    enable_checkpointing=False,
                    enable_progress_bar=False,
                    enable_model_summary=False,
                    limit_val_batches=0,
                    default_root_dir=tmp,
                    **plugins_kwargs[name],
                )
                trainer.fit(models[name], train_dataloaders=loader)
                memory[name] = sum(p.numel() * p.element_size() for p in models[name].parameters())
    base = median(timers["32-true"].times)
    rows = []
    for name in CONFIGS:
        m = median(timers[name].times)
        rows.append(
            [name, len(timers[name].times), round(m * 1e3, 1), f"{base / m:.3f}x", round(memory[name] / 2**20, 1)]
        )
    emit(markdown(["configuration", "steps timed", "median step ms", "speed-up vs 32-true", "parameter MiB"], rows))
    ours = median(timers["FP32BatchNormPrecision bf16-mixed"].times)
    theirs = median(timers["Lightning bf16-mixed"].times)
    emit(
        f"\nours bf16-mixed / Lightning bf16-mixed step time: {ours / theirs:.3f}; "
        f"ours bf16-mixed speed-up vs 32-true: {base / ours:.2f}x"
    )
    return 0
