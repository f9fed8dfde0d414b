"""``lit-compute bench ...``: measured comparisons, ratios taken side by side in one run."""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS: dict[str, tuple[str, str]] = {
    "flops": ("lit_compute.bench.flops_table", "our FLOP counts vs torchvision's published figures and plain FlopCounterMode"),
    "overhead": ("lit_compute.bench.overhead", "step time with and without a measuring callback, as a ratio"),
    "loaders": ("lit_compute.bench.loaders", "images/s of the DALI pipeline vs the torchvision DataLoader"),
    "allreduce": ("lit_compute.bench.distributed_bench:allreduce_main", "all-reduce bandwidth table (nccl-tests style)"),
    "ddp": ("lit_compute.bench.distributed_bench:ddp_main", "DDP step time under bucket sizes and comm hooks"),
    "recipe": ("lit_compute.bench.recipe", "baseline vs optimised training, one change at a time"),
    "gpu": ("lit_compute.bench.gpu_checks", "every GPU-only check in one command (exits 0 without a GPU)"),
    "precision": ("lit_compute.bench.precision_bench", "step time per precision mode, as ratios to 32-true"),
    "whatif": ("lit_compute.bench.whatif_bench", "lit-compute whatif's predictions beside measured and published runs"),
    "memory": ("lit_compute.bench.memory_bench", "peak memory predicted by lit-compute estimate vs measured, per device"),
}


def quiet() -> None:
    """Benchmarks print their own progress and tables: Lightning's per-Trainer banners, its tips and its own
    deprecation notices would bury them."""
    import logging
    import warnings

    import lightning.pytorch  # noqa: F401 - sets its loggers' levels on import: lower them after

    from lit_compute._lightning_cli import quiet_lightning

    quiet_lightning()
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*validation_step. but have no .val_dataloader.*")


def main(argv: list[str]) -> int:
    if argv and argv[0] in BENCHMARKS:
        quiet()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHMARKS:
        parser = argparse.ArgumentParser(prog="lit-compute bench")
        parser.add_argument("benchmark", choices=sorted(BENCHMARKS), help="; ".join(f"{k}: {v[1]}" for k, v in BENCHMARKS.items()))
        parser.parse_args(argv[:1])
    target = BENCHMARKS[argv[0]][0]
    module_name, _, func = target.partition(":")
    module = importlib.import_module(module_name)
    return int(getattr(module, func or "main")(argv[1:]) or 0)
