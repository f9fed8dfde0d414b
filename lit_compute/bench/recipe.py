"""``lit-compute bench recipe``: the same model on the same data, baseline vs optimised, one change at a time.

Rows are cumulative: each adds one change to the row above. Every row runs a StepTimeMonitor (its overhead
was measured at <= 1.01) so the data-wait fraction is known; the optimised row adds FlopsLogger, so the
cost of observing is inside the optimised figure. MFU is the model's counted FLOPs per sample x samples/s,
over the peak measured on this device in the row's dtype. Each row writes TensorBoard logs under
``--log-dir``, so ``lit-compute report`` can compare them.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_compute.bench import recipe_gpt
from lit_compute.bench._common import (
    StepTimer,
    cumulative_rows,
    emit,
    low_precision,
    machine_line,
    markdown,
    median,
)
from lit_compute.data import DALIImageDataModule, TorchvisionImageDataModule
from lit_compute.data.dali_datamodule import dali_available
from lit_compute.flops import FlopsLogger, count_flops, measure_peak_flops, precision_dtype
from lit_compute.flops.peaks import weigh_tf32_switches
from lit_compute.models import ImageClassifier
from lit_compute.monitoring import StepTimeMonitor
from lit_compute.precision import fp32_norm_precision


def rows_for(args: argparse.Namespace, device: str) -> list[dict[str, Any]]:
    precision = low_precision(device)
    base: dict[str, Any] = {
        "workers": 0,
        "precision": "32-true",
        "channels_last": False,
        "dali": False,
        "observe": False,
        "tuned_ddp": False,
    }
    steps: list[tuple[str, str, dict[str, Any]]] = [
        ("0_baseline", "baseline: 32-true, torchvision, num_workers=0", {}),
        ("1_workers", "+ DataLoader workers (75% of cores), persistent", {"workers": None}),
        (f"2_{precision}", f"+ FP32BatchNormPrecision {precision}", {"precision": precision}),
        ("3_channels_last", "+ channels_last", {"channels_last": True}),
        (
            "4_dali_optimised",
            "+ DALIImageDataModule (optimised, FlopsLogger on)",
            {"dali": True, "observe": True, "tuned_ddp": args.devices > 1},
        ),
    ]
    if args.no_dali:  # the optimised row keeps the torchvision loader
        steps[-1] = (
            "4_optimised",
            "+ FlopsLogger on (optimised, torchvision loader)",
            {"observe": True, "tuned_ddp": args.devices > 1},
        )
    return cumulative_rows(base, steps)


def run_row(row: dict[str, Any], args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    from lit_compute.distributed import TunedDDPStrategy

    pl.seed_everything(0, verbose=False)
    common = {
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "min_crop_scale": 0.35,
        "synthetic_images_per_class": args.images_per_class,
    }
    if row["dali"]:
        data: pl.LightningDataModule = DALIImageDataModule(channels_last=row["channels_last"], **common)
    else:
        data = TorchvisionImageDataModule(num_workers=row["workers"], **common)
    model = ImageClassifier(args.model, num_classes=10, channels_last=row["channels_last"])
    timer = StepTimer(skip=3, sync=True)
    callbacks: list[pl.Callback] = [timer, StepTimeMonitor(log_every_n_steps=5, window=20)]
    if row["observe"]:
        callbacks.append(FlopsLogger(peak="measure", log_every_n_steps=5))
    kwargs: dict[str, Any] = {}
    if row["precision"] != "32-true":
        kwargs["plugins"] = [fp32_norm_precision(row["precision"])]
    if args.devices > 1:
        # the baseline rows use plain settings (torch's 25 MiB buckets, no hook) through the same strategy class
        kwargs["strategy"] = TunedDDPStrategy(
            start_method="spawn",
            bucket_cap_mb=100 if row["tuned_ddp"] else None,
            gradient_as_bucket_view=row["tuned_ddp"],
        )
    logger = pl.loggers.TensorBoardLogger(str(log_dir), name=row["slug"], version=0)
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        max_steps=args.steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=5,
        **kwargs,
    )
    trainer.fit(model, datamodule=data)
    acc = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    waits = [e.value for e in acc.Scalars("time/data_wait_fraction")] if "time/data_wait_fraction" in scalars else []
    sps = [e.value for e in acc.Scalars("time/samples_per_sec")] if "time/samples_per_sec" in scalars else []
    step = median(timer.times) if timer.times else float("nan")
    # under spawned DDP the timer lives in the children: fall back to rank 0's logged samples/s x ranks
    samples_per_sec = (
        args.batch_size * args.devices / step
        if timer.times
        else (statistics.fmean(sps) * args.devices if sps else float("nan"))
    )
    return {"samples_per_sec": samples_per_sec, "data_wait": statistics.fmean(waits) if waits else float("nan")}


def main(argv: list[str]) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--model", default="resnet50")
    known, _ = pre.parse_known_args(argv)
    if known.model == "gpt":
        return recipe_gpt.main(argv)
    parser = argparse.ArgumentParser(
        prog="lit-compute bench recipe",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="--model gpt: the language-model recipe (lit-compute bench recipe --model gpt --help)",
    )
    parser.add_argument("--model", default="resnet50", help="a torchvision model, or gpt")
    parser.add_argument("--image-size", type=int, default=128, help="image side (px)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per batch and device")
    parser.add_argument("--steps", type=int, default=20, help="training steps per row")
    parser.add_argument("--devices", type=int, default=1, help="devices (2+: TunedDDPStrategy, spawned)")
    parser.add_argument("--accelerator", default="auto", help="Lightning accelerator")
    parser.add_argument("--images-per-class", type=int, default=100, help="synthetic dataset size")
    parser.add_argument("--log-dir", default="bench_logs/recipe", help="TensorBoard logs of every row")
    parser.add_argument(
        "--no-dali",
        action="store_true",
        help="the optimised row keeps the torchvision DataLoader (for machines without NVIDIA DALI)",
    )
    args = parser.parse_args(argv)
    if not args.no_dali and not dali_available():
        parser.error(
            "the optimised row uses DALIImageDataModule, and NVIDIA DALI is not installed: "
            "pip install 'lit-compute[dali]', or pass --no-dali to keep the torchvision loader"
        )
    device = "cuda" if args.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available() else "cpu"
    log_dir = Path(args.log_dir)
    rows = rows_for(args, device)
    with torch.device("meta"):
        meta_model = ImageClassifier(args.model, num_classes=10).net.train()
    # batch 2: BatchNorm in train mode refuses a batch of one
    count = count_flops(meta_model, torch.zeros(2, 3, args.image_size, args.image_size), count_on="meta")
    flops_per_sample = count.total / 2
    peaks = {}
    results = []
    for row in rows:
        dtype = precision_dtype(row["precision"])
        if dtype not in peaks:
            weighed = None
            if device == "cuda" and dtype == torch.float32:  # cuDNN's TF32 switch is not the matmuls'
                weighed = weigh_tf32_switches(
                    count.by_op, lambda on: measure_peak_flops(device, torch.float32, tf32=on)
                )
            peaks[dtype] = (weighed or measure_peak_flops(device, dtype)) * args.devices
        measured = run_row(row, args, log_dir)
        measured["mfu"] = flops_per_sample * measured["samples_per_sec"] / peaks[dtype]
        results.append(measured)
        emit(f"  {row['name']}: {measured['samples_per_sec']:.1f} samples/s")
    base = results[0]["samples_per_sec"]
    # measured values to 4 significant digits (markdown): the ratios read back from the table hold at any speed
    table = [
        [
            row["name"],
            r["samples_per_sec"],
            1e3 / r["samples_per_sec"],
            f"{100 * r['mfu']:.1f}%",
            f"{100 * r['data_wait']:.1f}%",
            f"{r['samples_per_sec'] / base:.2f}x",
        ]
        for row, r in zip(rows, results)
    ]
    emit(
        f"\n# bench recipe: {args.model} at {args.image_size}px, batch {args.batch_size}, {args.steps} steps per row, "
        f"{args.devices} device(s) on {device}; forward+backward {flops_per_sample / 1e9:.3f} GFLOPs per sample\n"
        f"# {machine_line()}\n# TensorBoard logs: {log_dir} (lit-compute report {log_dir} --out recipe.md)\n"
    )
    emit(markdown(["configuration", "samples/s", "ms per sample", "MFU", "data wait", "vs baseline"], table))
    emit(f"\noptimised / baseline samples per second: {results[-1]['samples_per_sec'] / base:.2f}x")
    return 0
