"""``lit-compute bench ...``: measured comparisons, ratios taken side by side in one run."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import sys
from pathlib import Path

BENCHMARKS: dict[str, tuple[str, str]] = {
    "flops": (
        "lit_compute.bench.flops_table",
        "our FLOP counts vs torchvision's published figures and plain FlopCounterMode",
    ),
    "overhead": ("lit_compute.bench.overhead", "step time with and without a measuring callback, as a ratio"),
    "loaders": ("lit_compute.bench.loaders", "images/s of the DALI pipeline vs the torchvision DataLoader"),
    "allreduce": (
        "lit_compute.bench.distributed_bench:allreduce_main",
        "all-reduce bandwidth table (nccl-tests style)",
    ),
    "ddp": ("lit_compute.bench.distributed_bench:ddp_main", "DDP step time under bucket sizes and comm hooks"),
    "recipe": ("lit_compute.bench.recipe", "baseline vs optimised training, one change at a time"),
    "gpu": ("lit_compute.bench.gpu_checks", "every GPU-only check in one command (exits 0 without a GPU)"),
    "precision": ("lit_compute.bench.precision_bench", "step time per precision mode, as ratios to 32-true"),
    "whatif": ("lit_compute.bench.whatif.cli", "lit-compute whatif's predictions beside measured and published runs"),
    "memory": (
        "lit_compute.bench.memory_bench",
        "peak memory predicted by lit-compute estimate vs measured, per device",
    ),
    "warmstart": (
        "lit_compute.bench.warm_start_bench",
        "a run forked from the warm helper against the same run in a new interpreter, in alternating pairs",
    ),
    "configs": (
        "lit_compute.bench.configs_bench",
        "whole lit-compute fit configs measured side by side in rounds, as ratios to the first",
    ),
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
    """Run a benchmark; ``--markdown FILE`` (any benchmark) also writes what it printed to FILE, under the header
    naming the command, the commit, the date and the machine that every figure file in the docs carries."""
    markdown = None
    if "--markdown" in argv[1:] and argv[0] not in ("memory", "whatif", "gpu", "warmstart"):  # those write their own
        i = argv.index("--markdown")
        if i + 1 >= len(argv):
            sys.stderr.write("lit-compute bench: error: --markdown needs a file name\n")
            return 2
        markdown, argv = argv[i + 1], argv[:i] + argv[i + 2 :]
    if markdown is not None:
        return _to_markdown(argv, markdown)
    if argv and argv[0] in BENCHMARKS:
        quiet()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHMARKS:
        parser = argparse.ArgumentParser(prog="lit-compute bench")
        parser.add_argument(
            "benchmark", choices=sorted(BENCHMARKS), help="; ".join(f"{k}: {v[1]}" for k, v in BENCHMARKS.items())
        )
        parser.parse_args(argv[:1])
    target = BENCHMARKS[argv[0]][0]
    module_name, _, func = target.partition(":")
    module = importlib.import_module(module_name)
    return int(getattr(module, func or "main")(argv[1:]) or 0)


def _to_markdown(argv: list[str], path: str) -> int:
    """Run ``lit-compute bench ARGV`` printing as usual, and write its output to ``path`` with the figure header."""
    from lit_compute.bench._common import figure_header, machine_line

    class Tee(io.TextIOBase):
        def __init__(self) -> None:
            self.outer = sys.stdout
            self.buffer_text = io.StringIO()

        def write(self, text: str) -> int:
            self.outer.write(text)
            return self.buffer_text.write(text)

        def flush(self) -> None:
            self.outer.flush()

    tee = Tee()
    with contextlib.redirect_stdout(tee):
        status = main(argv)
    if status == 0:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(
            figure_header("lit-compute bench " + " ".join(argv), machine_line())
            + "```\n"
            + tee.buffer_text.getvalue()
            + "```\n"
        )
        sys.stdout.write(f"written: {path}\n")
    return status
