"""``lit-compute bench loaders``: images per second of DALI vs the torchvision DataLoader, interleaved."""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from lit_compute._compat import available_cpu_cores
from lit_compute.bench._common import emit, machine_line, markdown, median
from lit_compute.data import DALIImageDataModule, TorchvisionImageDataModule
from lit_compute.data.dali_datamodule import dali_available


def _epoch_rate(loader: Any, device: torch.device | None) -> float:
    start, n = time.perf_counter(), 0
    for images, labels in loader:
        if device is not None and device.type == "cuda":
            images = images.to(device, non_blocking=True)
        n += labels.shape[0]
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize()
    return n / (time.perf_counter() - start)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lit-compute bench loaders", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--data-dir", default=None, help="ImageNet-style folder (default: the synthetic dataset)")
    parser.add_argument("--image-size", type=int, default=224, help="crop side (px)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch")
    parser.add_argument("--images-per-class", type=int, default=60, help="synthetic dataset size (10 classes)")
    parser.add_argument("--rounds", type=int, default=3, help="passes per loader, alternating")
    parser.add_argument(
        "--workers", type=int, default=None, help="DataLoader workers = DALI threads (default: the cores)"
    )
    args = parser.parse_args(argv)
    if not dali_available():
        parser.error("NVIDIA DALI is not installed, so there is nothing to compare: pip install 'lit-compute[dali]'")
    cores = args.workers or available_cpu_cores()
    common = {
        "data_dir": args.data_dir,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "synthetic_images_per_class": args.images_per_class,
    }
    loaders: dict[str, tuple[Any, torch.device | None]] = {}
    tv = TorchvisionImageDataModule(num_workers=cores, persistent_workers=True, **common)
    tv.setup("fit")
    loaders["torchvision DataLoader (PIL decode)"] = (tv.train_dataloader(), None)
    dali = DALIImageDataModule(num_threads=cores, device="cpu", **common)
    dali.setup("fit")
    loaders["DALI CPU pipeline"] = (dali.train_dataloader(), None)
    if torch.cuda.is_available():
        gpu = DALIImageDataModule(num_threads=cores, device="gpu", **common)
        gpu.setup("fit")
        loaders["DALI GPU pipeline (mixed decode)"] = (gpu.train_dataloader(), torch.device("cuda"))
        loaders["torchvision DataLoader (PIL decode)"] = (tv.train_dataloader(), torch.device("cuda"))
    n = len(tv.train_set) if tv.train_set is not None else 0
    emit(
        f"# bench loaders: {n} training images at {args.image_size}px (decode, random-resized crop, flip, "
        f"normalise), batch {args.batch_size}, {cores} workers/threads, {args.rounds} interleaved rounds\n"
        f"# {machine_line()}\n"
    )
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for loader, device in loaders.values():  # warm-up: worker start, pipeline build, page cache
        _epoch_rate(loader, device)
    for r in range(args.rounds):
        names = list(loaders) if r % 2 == 0 else list(reversed(loaders))
        for name in names:
            loader, device = loaders[name]
            rates[name].append(_epoch_rate(loader, device))
    base = median(rates["torchvision DataLoader (PIL decode)"])
    rows = [[name, round(median(v), 1), f"{median(v) / base:.2f}x"] for name, v in rates.items()]
    emit(markdown(["loader", "images/s (median)", "ratio to torchvision"], rows))
    ratio = median(rates["DALI CPU pipeline"]) / base
    emit(f"\nDALI CPU / torchvision images per second: {ratio:.2f}")
    if "DALI GPU pipeline (mixed decode)" in rates:
        emit(
            f"DALI GPU / torchvision images per second: {median(rates['DALI GPU pipeline (mixed decode)']) / base:.2f}"
        )
    return 0
