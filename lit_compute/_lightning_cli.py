"""LitComputeCLI: LightningCLI with lit_compute's defaults and one-line errors for bad component arguments."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch.cli as lightning_cli
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

import lit_compute
import lit_compute.distributed  # noqa: F401 - registers the ddp_tuned* strategy names for `strategy: ddp_tuned`

_PACKAGE = str(Path(__file__).resolve().parent)


def constructor_error(err: BaseException) -> BaseException | str | None:
    """The ValueError/TypeError a lit_compute constructor raised, found inside jsonargparse's wrapping (as an
    exception, or as the line of jsonargparse's message that quotes it), if any."""
    seen: set[int] = set()
    stack = [err]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, (ValueError, TypeError, ModuleNotFoundError)):
            tb = current.__traceback__
            last = None
            while tb is not None:
                last = tb.tb_frame.f_code.co_filename
                tb = tb.tb_next
            if last is not None and str(Path(last).resolve()).startswith(_PACKAGE):
                return current
        stack += [e for e in (current.__cause__, current.__context__) if e is not None]
    names = "|".join(re.escape(n) for n in lit_compute.__all__ if n[:1].isupper())
    pattern = re.compile(rf"(?:^|[\s-])((?:{names})(?:\(\w+=|: ).*)$")
    for line in str(err).splitlines():
        found = pattern.search(line.strip())
        if found:
            return found.group(1).strip()
    return None


class LitComputeCLI(LightningCLI):
    """LightningCLI with lit_compute's defaults (ImageClassifier on TorchvisionImageDataModule).

    Any LightningModule or LightningDataModule class path works from YAML (``model.class_path`` /
    ``data.class_path``). A component whose arguments lit_compute refuses (a value out of range, a refused
    precision) ends the command before training with that one message (exit code 2), not a traceback.
    """

    def __init__(self, args: Sequence[str] | None = None, run: bool = True, **kwargs: Any) -> None:
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

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.set_defaults(
            {
                "model": {"class_path": "lit_compute.models.ImageClassifier"},
                "data": {"class_path": "lit_compute.data.TorchvisionImageDataModule"},
            }
        )

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as err:
            ours = constructor_error(err)
            if ours is None:
                raise
            sys.stderr.write(f"lit-compute: error: {ours}\n")
            raise SystemExit(2) from None


def run(args: Sequence[str] | None) -> None:
    """Run a LightningCLI subcommand (``args=None``: from ``sys.argv``, without Lightning's args warning)."""
    quiet_lightning()
    LitComputeCLI(args=args)


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith("💡 Tip")


def quiet_lightning() -> None:
    """Leave out lines no user of lit-compute acts on: Lightning's internal deprecation notice (its pytree
    helper), its model summary's note that mixed precision is "not supported" (the parameters are float32 there,
    which is what it then assumes), and its advertisement for a cloud logger."""
    import warnings

    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    warnings.filterwarnings("ignore", message=r"Precision (16|bf16)-mixed is not supported by the model summary.*")
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_DropTips())


__all__ = ["LitComputeCLI", "constructor_error", "lightning_cli", "run"]
