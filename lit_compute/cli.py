"""The ``lit-compute`` command: LightningCLI (fit/validate/test/predict) plus our own subcommands.

``lit-compute fit --config configs/quickstart.yaml`` is LightningCLI over :class:`ImageClassifier` and
:class:`TorchvisionImageDataModule` as defaults, in subclass mode: any LightningModule or
LightningDataModule class path works from YAML (``model.class_path`` / ``data.class_path``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

# Subcommands handled outside LightningCLI: name -> (module with a ``main(argv)`` function, summary).
EXTRA_COMMANDS: dict[str, tuple[str, str]] = {
    "report": ("lit_compute.report", "a Markdown report with plots and advice over log dirs (LOG_DIR ... --out report.md)"),
    "bench": ("lit_compute.bench", "measured comparisons: flops, overhead, precision, loaders, allreduce, ddp, recipe, gpu (lit-compute bench --help)"),
}


class LitComputeCLI(LightningCLI):
    """LightningCLI with lit_compute's defaults (ImageClassifier on TorchvisionImageDataModule)."""

    def __init__(self, args: Sequence[str] | None = None, run: bool = True, **kwargs) -> None:
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("auto_configure_optimizers", False)
        super().__init__(
            LightningModule,
            LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=args,
            run=run,
            **kwargs,
        )

    def add_arguments_to_parser(self, parser) -> None:  # noqa: ANN001 - LightningArgumentParser
        parser.set_defaults(
            {
                "model": {"class_path": "lit_compute.models.ImageClassifier"},
                "data": {"class_path": "lit_compute.data.TorchvisionImageDataModule"},
            }
        )


def _print_overview() -> None:
    lines = [
        "usage: lit-compute {fit,validate,test,predict," + ",".join(EXTRA_COMMANDS) + "} ...",
        "",
        "Lightning training with the compute cost made visible (lit_compute).",
        "",
        "LightningCLI subcommands (see `lit-compute fit --help`):",
        "  fit         train a model: lit-compute fit --config configs/quickstart.yaml",
        "  validate    run one validation epoch",
        "  test        run one test epoch",
        "  predict     run prediction",
    ]
    if EXTRA_COMMANDS:
        lines += ["", "lit_compute subcommands:"]
        lines += [f"  {name:<11} {summary}" for name, (_, summary) in EXTRA_COMMANDS.items()]
    sys.stdout.write("\n".join(lines) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lit-compute`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        _print_overview()
        return 0
    if args[0] in EXTRA_COMMANDS:
        module = importlib.import_module(EXTRA_COMMANDS[args[0]][0])
        return int(module.main(args[1:]) or 0)
    LitComputeCLI(args=args)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
