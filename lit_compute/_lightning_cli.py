"""LitComputeCLI: LightningCLI with lit_compute's defaults and one-line errors for bad component arguments."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import lightning.pytorch.cli as lightning_cli
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

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


def compact_parser_error(message: str) -> str:
    """jsonargparse's error (a nested Union report of 10-20 lines: every subtype it tried) as one line: the key, and
    for a ``class_path`` the class and what it refused; else the first lines joined."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return "the command line or config file is not valid"
    if lines[0].startswith("Unexpected config"):
        return "the config file is empty or not a mapping of sections (trainer:, model:, data:, ...)"
    head = lines[0].rstrip(":")
    for i, line in enumerate(lines):
        problem = re.match(r"- Problem with given class_path '([^']+)':?", line)
        if problem:
            detail = []
            for follow in lines[i + 1:]:
                if follow.startswith("- "):
                    break
                detail.append(follow.rstrip(":"))
            return f"{head}: {problem.group(1)}: {' '.join(detail) or 'refused'}"
    if any(line.startswith("Does not validate against any of the Union subtypes") for line in lines):
        given = next((line for line in lines if line.startswith("Given value:")), "")
        expected = [line[2:] for line in lines if line.startswith("- Expected")]
        return f"{head}: {given or 'a value'} is none of: {'; '.join(expected)}"[:600]
    return " ".join(lines)[:600]


class _OneLineParser(LightningArgumentParser):
    """LightningCLI's parser, whose errors are one line (``lit-compute: error: ...``, exit code 2) instead of the usage
    text and a nested Union report."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:  # type: ignore[override]
        if not self.exit_on_error:
            super().error(message, ex)
        prog = (getattr(ex, "subcommand_parser", None) or self).prog.replace(" [options]", "")
        sys.stderr.write(f"lit-compute: error: {compact_parser_error(message)} (options: {prog} --help)\n")
        raise SystemExit(2)


def _configuration_error(err: BaseException) -> str | None:
    """A refusal of the configuration by Lightning itself (an unknown strategy or accelerator name, bad devices, a
    section of the wrong shape), as one line; None for anything else."""
    tb, last = err.__traceback__, ""
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    last = last.replace("\\", "/")
    if isinstance(err, (ValueError, TypeError)) and any(
            part in last for part in ("/trainer/connectors/", "/accelerators/", "/lightning/pytorch/cli.py")):
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "not a mapping" in text:
            text = f"a section of the config is not a mapping of arguments ({text})"
        return text
    if type(err).__name__ == "MisconfigurationException":
        return str(err).splitlines()[0]
    return None


class LitComputeCLI(LightningCLI):
    """LightningCLI with lit_compute's defaults (ImageClassifier on TorchvisionImageDataModule).

    Any LightningModule or LightningDataModule class path works from YAML (``model.class_path`` /
    ``data.class_path``). A component whose arguments lit_compute refuses (a value out of range, a refused
    precision) ends the command before training with that one message (exit code 2), not a traceback.
    """

    def __init__(self, args: Sequence[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_class", _OneLineParser)
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
            ours = constructor_error(err) or _configuration_error(err)
            if ours is None:
                raise
            sys.stderr.write(f"lit-compute: error: {ours}\n")
            raise SystemExit(2) from None


def run(args: Sequence[str] | None) -> None:
    """Run a LightningCLI subcommand (``args=None``: from ``sys.argv``, without Lightning's args warning). A
    component's refusal of its input before training (a data folder that does not exist, a corpus too small) ends
    the command in one line with exit code 2, not a traceback."""
    quiet_lightning()
    try:
        LitComputeCLI(args=args)
    except (ValueError, TypeError, ModuleNotFoundError) as err:
        ours = constructor_error(err) or _configuration_error(err)
        if ours is None or _training_started(err):
            raise
        sys.stderr.write(f"lit-compute: error: {ours}\n")
        raise SystemExit(2) from None


def _training_started(err: BaseException) -> bool:
    """True when the error was raised from inside a training, validation or test step (a bug to see whole)."""
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in ("training_step", "validation_step", "test_step", "predict_step"):
            return True
        tb = tb.tb_next
    return False


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
