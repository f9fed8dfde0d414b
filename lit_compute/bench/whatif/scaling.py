"""The ``scaling`` part: twice the micro-batch on this CPU outside Lightning, measured only (the ratios the CPU rows
are read against)."""

from __future__ import annotations

from typing import Any

import torch


def scaling_part(out: str, rounds: int = 5, steps: int = 6) -> list[list[Any]]:
    """The CPU rows at twice the micro-batch, taken apart outside Lightning: torchvision's ResNet-18 and ResNet-34 at
    64 px (as the CPU rows train them) and ResNet-18's last 3x3 convolution alone (512 channels on 2x2 px), forward
    and backward only (no optimizer, no loader), at micro-batches 16 and 32; the rounds interleaved, each figure a
    round's median step. The FLOPs double with the batch; each round's ratio is printed, since the machine's other
    work and the allocator's state move them."""
    import statistics
    import time

    import torchvision

    conv = torch.nn.Conv2d(512, 512, 3, padding=1, bias=False)
    nets = [
        ("ResNet-18 64 px, forward + backward", torchvision.models.resnet18(num_classes=10), 64, 3),
        ("ResNet-34 64 px, forward + backward", torchvision.models.resnet34(num_classes=10), 64, 3),
        ("ResNet-18's last 3x3 convolution (512 channels, 2x2 px), forward + backward", conv, 2, 512),
    ]
    times: dict[tuple[int, int], list[float]] = {}
    for _ in range(rounds):
        for index, (_, net, pixels, channels) in enumerate(nets):
            for batch in (16, 32):
                x = torch.randn(batch, channels, pixels, pixels)
                net(x).sum().backward()  # warm: oneDNN's primitives for this shape
                steps_s = []
                for _ in range(steps):
                    start = time.perf_counter()
                    net(x).sum().backward()
                    steps_s.append(time.perf_counter() - start)
                times.setdefault((index, batch), []).append(statistics.median(steps_s) * 1e3)
    rows = []
    for index, (name, *_rest) in enumerate(nets):
        small, large = times[(index, 16)], times[(index, 32)]
        ratios = sorted(b / a for a, b in zip(small, large))
        rows.append(
            [
                name,
                f"{statistics.median(small):.1f} / {statistics.median(large):.1f}",
                ", ".join(f"{r:.2f}" for r in ratios),
                f"{statistics.median(ratios):.2f}",
            ]
        )
    return rows
