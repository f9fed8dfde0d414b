"""The ``lit-compute`` command: LightningCLI (fit/validate/test/predict) plus our own subcommands.

``lit-compute fit --config configs/quickstart.yaml`` is LightningCLI over :class:`ImageClassifier` and
:class:`TorchvisionImageDataModule` as defaults, in subclass mode: any LightningModule or
LightningDataModule class path works from YAML (``model.class_path`` / ``data.class_path``). ``--help`` and
``--version`` answer without importing torch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

LIGHTNING_COMMANDS = {
    "fit": "train a model: lit-compute fit --config quickstart (a packaged config, or your YAML file)",
    "validate": "run one validation epoch",
    "test": "run one test epoch",
    "predict": "run prediction",
}
# Subcommands handled outside LightningCLI: name -> (module with a ``main(argv)`` function, summary).
EXTRA_COMMANDS: dict[str, tuple[str, str]] = {
    "init": (
        "lit_compute.packaged_configs:init_main",
        "copy a packaged config to edit (init quickstart; no name: list them)",
    ),
    "report": (
        "lit_compute.report",
        "a Markdown report with plots and advice over log dirs (LOG_DIR ... --out report.md)",
    ),
    "estimate": (
        "lit_compute.planning.estimate_cli",
        "the peak memory per device of your config before any real step, "
        "the largest micro-batch that fits (--config my.yaml --device h100-sxm)",
    ),
    "whatif": (
        "lit_compute.planning.whatif_cli",
        "your run's step on other chips, node counts and networks: time, "
        "MFU, bottleneck, memory, cost (RUN --hardware h100-sxm,a100 --nodes 1,8)",
    ),
    "tune": (
        "lit_compute.tuning",
        "the fastest configuration of your config, measured and written out (--config my.yaml --budget 15m)",
    ),
    "bench": (
        "lit_compute.bench",
        "measured comparisons: flops, overhead, precision, loaders, allreduce, ddp, recipe, gpu "
        "(lit-compute bench --help)",
    ),
}


def _overview() -> str:
    from lit_compute import __version__

    lines = [
        "usage: lit-compute {" + ",".join([*LIGHTNING_COMMANDS, *EXTRA_COMMANDS]) + "} ... | --version",
        "",
        f"Lightning training with the compute cost made visible (lit_compute {__version__}).",
        "",
        "LightningCLI subcommands (see `lit-compute fit --help`):",
    ]
    lines += [f"  {name:<11} {summary}" for name, summary in LIGHTNING_COMMANDS.items()]
    lines += ["", "lit_compute subcommands:"]
    lines += [f"  {name:<11} {summary}" for name, (_, summary) in EXTRA_COMMANDS.items()]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lit-compute`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(_overview())
        return 0
    if args[0] in ("-V", "--version"):
        from lit_compute import __version__

        sys.stdout.write(f"lit-compute {__version__}\n")
        return 0
    import os

    # a config's class paths are imported from the current directory too, as `python -m` and `python train.py`
    # users expect (`model: examples.hf_gpt2.HFCausalLM` from the repository root): by fit, and by the commands that
    # build a config or a run's config again (estimate, whatif, tune)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    if args[0] == "tune" and not {"-h", "--help"} & set(args):
        from lit_compute.warm_start import prestart

        prestart()  # the trials' helper imports torch and Lightning while this process does the same (2 cores)
    if args[0] in EXTRA_COMMANDS:
        module_name, _, func = EXTRA_COMMANDS[args[0]][0].partition(":")
        return int(getattr(importlib.import_module(module_name), func or "main")(args[1:]) or 0)
    if args[0] not in LIGHTNING_COMMANDS and not args[0].startswith("-"):
        sys.stderr.write(
            _overview() + f"\nlit-compute: error: unknown command {args[0]!r}; choose one of "
            f"{', '.join([*LIGHTNING_COMMANDS, *EXTRA_COMMANDS])}\n"
        )
        return 2
    from lit_compute.packaged_configs import first_unknown_config, resolve_config_args

    args = resolve_config_args(args)  # `--config quickstart`: the packaged config of that name
    if (message := first_unknown_config(args)) is not None:
        sys.stderr.write(f"lit-compute {args[0]}: error: {message}\n")
        return 2
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10's profiler notes ("Memory block of unknown size")
    from lit_compute._lightning_cli import run

    if argv is None:  # LightningCLI reads sys.argv itself (given args, it warns that they are meant for Python use)
        sys.argv[1:] = args
    run(None if argv is None else args)
    return 0


def __getattr__(name: str) -> Any:
    if name == "LitComputeCLI":
        from lit_compute._lightning_cli import LitComputeCLI

        return LitComputeCLI
    raise AttributeError(f"module 'lit_compute.cli' has no attribute {name!r}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
