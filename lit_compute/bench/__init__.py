"""``lit-compute bench ...``: measured comparisons, ratios taken side by side in one run."""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS: dict[str, tuple[str, str]] = {
    "flops": ("lit_compute.bench.flops_table", "our FLOP counts vs torchvision's published figures and plain FlopCounterMode"),
    "overhead": ("lit_compute.bench.overhead", "step time with and without a measuring callback, as a ratio"),
    "loaders": ("lit_compute.bench.loaders", "images/s of the DALI pipeline vs the torchvision DataLoader"),
    "precision": ("lit_compute.bench.precision_bench", "step time per precision mode, as ratios to 32-true"),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHMARKS:
        parser = argparse.ArgumentParser(prog="lit-compute bench")
        parser.add_argument("benchmark", choices=sorted(BENCHMARKS), help="; ".join(f"{k}: {v[1]}" for k, v in BENCHMARKS.items()))
        parser.parse_args(argv[:1])
    module = importlib.import_module(BENCHMARKS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)
