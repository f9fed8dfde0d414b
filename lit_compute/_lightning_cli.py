"""LitComputeCLI: LightningCLI with lit_compute's defaults and one-line errors for bad component arguments."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import lightning.pytorch.cli as lightning_cli
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger

import lit_compute
import lit_compute.distributed  # registers the ddp_tuned* strategy names for `strategy: ddp_tuned`
from lit_compute import _compat, agreement
from lit_compute.formatting import first_line

_PACKAGE = str(Path(__file__).resolve().parent)
_DEFAULT_MODEL = "lit_compute.models.ImageClassifier"
_DEFAULT_DATA = "lit_compute.data.TorchvisionImageDataModule"
_DEFAULT_CLASSES = {"model": _DEFAULT_MODEL, "data": _DEFAULT_DATA}


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
            for follow in lines[i + 1 :]:
                if follow.startswith("- "):
                    break
                detail.append(follow.rstrip(":"))
            return f"{head}: {problem.group(1)}: {' '.join(detail) or 'refused'}"
    if any(line.startswith("Does not validate against any of the Union subtypes") for line in lines):
        given = next((line for line in lines if line.startswith("Given value:")), "")
        expected = [line[2:] for line in lines if line.startswith("- Expected")]
        return f"{head}: {given or 'a value'} is none of: {'; '.join(expected)}"[:600]
    return " ".join(lines)[:600]


_SECTIONS = ("trainer", "model", "data", "optimizer", "lr_scheduler", "seed_everything", "ckpt_path", "config")


def _close(word: str, choices: Any) -> str:
    import difflib

    match = difflib.get_close_matches(word, [c for c in choices if isinstance(c, str)], n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


def _parameters(class_path: str) -> Any:
    """The constructor parameters of the class at ``class_path`` (an empty mapping when it cannot be imported)."""
    import importlib
    import inspect

    module, _, name = class_path.rpartition(".")
    try:
        return inspect.signature(getattr(importlib.import_module(module), name)).parameters
    except Exception:  # noqa: BLE001 - a suggestion is a nicety
        return {}


def _suggestion(message: str) -> str:
    """A close match for a misspelt option, section, Trainer argument or class name, or the type and default of a
    value of the wrong type, in a parser error ('' if none)."""
    import importlib
    import inspect

    option = re.search(r"class_path '([\w.]+)'.*?Option '(\w+)' is not accepted", message, re.S)
    if option:
        return _close(option.group(2), _parameters(option.group(1)))
    literal = re.search(r"Parser key \"(\w+)\":?\s+Expected a typing\.Literal\[([^\]]*)\]\. Got value: (\S+)", message)
    if literal:  # a misspelt choice: the close one, else the choices
        key, choices, got = literal.group(1), re.findall(r"'([^']*)'", literal.group(2)), literal.group(3)
        return _close(got, choices) or f"; {key} takes one of {', '.join(choices)}"
    wrong = re.search(r"class_path '([\w.]+)'.*?Parser key \"(\w+)\":?\s+Expected a <class '(\w+)'>", message, re.S)
    if wrong:
        class_path, key, kind = wrong.groups()
        param = _parameters(class_path).get(key)
        default = param.default if param is not None else None
        example = (
            f", e.g. {key}: {default}"
            if isinstance(default, (int, float, str)) and not isinstance(default, bool) and default != ""
            else ""
        )
        return f"; {class_path.rpartition('.')[2]}'s {key} takes {'an' if kind[0] in 'aeiou' else 'a'} {kind}{example}"
    missing = re.search(r"module '([\w.]+)' has no attribute '(\w+)'", message)
    if missing:
        try:
            return _close(missing.group(2), dir(importlib.import_module(missing.group(1))))
        except Exception:  # noqa: BLE001 - a suggestion only: the original error still stands
            return ""
    unknown = re.search(r"does not accept option '([\w.]+)'", message)
    if unknown:
        section, _, key = unknown.group(1).partition(".")
        if section not in _SECTIONS:
            return _close(section, _SECTIONS)
        if section == "trainer" and key:
            import lightning.pytorch as pl

            return _close(key.split(".")[0], inspect.signature(pl.Trainer).parameters)
    return ""


class _OneLineParser(LightningArgumentParser):
    """LightningCLI's parser, whose errors are one line (``lit-compute: error: ...``, exit code 2) instead of the usage
    text and a nested Union report, and whose default model and datamodule are class paths only.

    jsonargparse carries a default class's arguments into any other class a config names, wherever that class
    accepts the same name (its documented behaviour when a ``class_path`` changes): with ``ImageClassifier`` as
    the default model, a user's own ``MyModel(num_classes=5, lr=0.5)`` named in a YAML would train with
    ImageClassifier's ``num_classes=10`` and ``lr=0.001``. The defaults of ``model:`` and ``data:`` are therefore
    given without their arguments: a class named in the config gets its own defaults, always, and
    ``--print_config`` shows exactly what will run. :meth:`class_defaults` has them with their arguments.
    """

    def get_defaults(self, skip_validation: bool = False, **kwargs: Any) -> Any:
        defaults = super().get_defaults(skip_validation, **kwargs)
        for key in _DEFAULT_CLASSES:
            value = defaults.get(key)
            if value is not None and "class_path" in value and "init_args" in value:
                del value["init_args"]
        return defaults

    def class_defaults(self) -> Any:
        """The defaults with the default classes' own arguments filled in."""
        return super().get_defaults()

    def without_unasked_data(self, cfg: Any) -> Any:
        """The default datamodule belongs to the default model: a config that names another model and no ``data:``
        trains on that model's own loaders, as plain LightningCLI does (not on synthetic images it never asked
        for). ``cfg`` with ``data`` set to None in that case (a copy), else ``cfg`` itself."""
        model, data = cfg.get("model"), cfg.get("data")
        if model is None or data is None or "class_path" not in model:
            return cfg
        if str(model.class_path).rpartition(".")[2] == _DEFAULT_MODEL.rpartition(".")[2]:
            return cfg  # (jsonargparse shortens class paths: lit_compute.ImageClassifier)
        try:
            unasked = data == self.class_defaults().get("data")
        except Exception:  # noqa: BLE001 - without defaults to compare with, keep the data as configured
            return cfg
        if not unasked:
            return cfg
        cfg = cfg.clone()
        cfg["data"] = None
        return cfg

    def dump(self, cfg: Any, *args: Any, **kwargs: Any) -> str:
        """jsonargparse's dump (``--print_config``, the saved ``config.yaml``) of the configuration that runs."""
        if "model" in cfg and "data" in cfg:
            cfg = self.without_unasked_data(cfg)
        return super().dump(cfg, *args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:
            super().error(message, ex)
        prog = (getattr(ex, "subcommand_parser", None) or self).prog.replace(" [options]", "")
        sys.stderr.write(
            f"lit-compute: error: {compact_parser_error(message)}{_suggestion(message)} (options: {prog} --help)\n"
        )
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
        part in last for part in ("/trainer/connectors/", "/accelerators/", "/lightning/pytorch/cli.py")
    ):
        text = first_line(err, None)
        if "not a mapping" in text:
            text = f"a section of the config is not a mapping of arguments ({text})"
        return text
    if type(err).__name__ == "MisconfigurationException":
        return first_line(err, None)
    return None


class _SaveConfigToRun(SaveConfigCallback):
    """Lightning's SaveConfigCallback, saving the resolved ``config.yaml`` into the run's log folder only: a run
    without a logger has no run folder, and Lightning would write (with ``overwrite``, replace) ``config.yaml`` in
    the current directory - a user's own file, or a stray copy at a repository's root."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if trainer.logger is None:
            return
        super().setup(trainer, pl_module, stage)


class LitComputeCLI(LightningCLI):
    """LightningCLI with lit_compute's defaults (ImageClassifier on TorchvisionImageDataModule).

    Any LightningModule or LightningDataModule class path works from YAML (``model.class_path`` /
    ``data.class_path``). A component whose arguments lit_compute refuses (a value out of range, a refused
    precision) ends the command before training with that one message (exit code 2), not a traceback.
    """

    def __init__(self, args: Sequence[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("save_config_callback", _SaveConfigToRun)
        kwargs.setdefault("parser_class", _OneLineParser)
        kwargs.setdefault("auto_configure_optimizers", False)
        super().__init__(
            LightningModule,
            None,  # any LightningDataModule, and optional: a model may bring its own loaders
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=None if args is None else list(args),
            run=run,
            **kwargs,
        )

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.set_defaults({key: {"class_path": path} for key, path in _DEFAULT_CLASSES.items()})

    def before_instantiate_classes(self) -> None:
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        parser = self._parser(self.subcommand) if self.subcommand else self.parser
        if config is not None and isinstance(parser, _OneLineParser):
            config["data"] = parser.without_unasked_data(config).get("data")

    def _claim_versions(self) -> None:
        """Rank 0 creates its TensorBoard version folder before the run starts: two runs started together in one
        folder each get their own (:func:`~lit_compute._compat.claim_tensorboard_version`). The resolved config is
        what the ranks compare at set-up (:func:`lit_compute.agreement.register_config`)."""
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        if config is not None:
            resolved = config.as_dict()
            resolved.pop("config", None)  # the config files' own paths may differ between nodes
            agreement.register_config(self.trainer, resolved)
        if self.trainer.is_global_zero:
            for logger in self.trainer.loggers:
                if isinstance(logger, TensorBoardLogger):
                    version = _compat.claim_tensorboard_version(logger)
                    if version is not None:
                        _CLAIMED.append(Path(logger.root_dir) / f"version_{version}")

    def before_validate(self) -> None:
        self._claim_versions()

    def before_test(self) -> None:
        self._claim_versions()

    def before_predict(self) -> None:
        self._claim_versions()

    def before_fit(self) -> None:
        """Claim this run's version folder, then, with ``$LIT_COMPUTE_RUN_FILE`` set, write it there before training
        (rank 0), so a script (``make demo``) reports the run it started, not whichever run wrote an event file
        last, nor one started beside it."""
        self._claim_versions()
        path = os.environ.get("LIT_COMPUTE_RUN_FILE")
        if not path or not self.trainer.is_global_zero:
            return
        for logger in self.trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                Path(path).write_text(str(Path(logger.log_dir).resolve()) + "\n")  # the logger's own folder
                return

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as err:
            ours = constructor_error(err) or _configuration_error(err)
            if ours is None:
                raise
            sys.stderr.write(f"lit-compute: error: {ours}\n")
            raise SystemExit(2) from None


_CLAIMED: list[Path] = []  # the version folders this process created (LitComputeCLI._claim_versions)


def _is_empty_run(folder: Path) -> bool:
    """True when ``folder`` holds nothing but TensorBoard event files without a single value in them."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    files = [f for f in folder.rglob("*") if f.is_file()]
    if any(not f.name.startswith("events.out.tfevents") for f in files):
        return False
    try:
        return not any(
            e.WhichOneof("what") not in (None, "file_version") for f in files for e in EventFileLoader(str(f)).Load()
        )
    except Exception:  # noqa: BLE001 - unreadable: keep it
        return False


def forget_empty_runs() -> list[Path]:
    """Remove the version folders this process created whose run ended before anything was logged (a config that
    failed at set-up): TensorBoard would list each as a run with no data. Returns what was removed."""
    import shutil

    removed = []
    while _CLAIMED:
        folder = _CLAIMED.pop()
        if folder.is_dir() and _is_empty_run(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def run(args: Sequence[str] | None) -> None:
    """Run a LightningCLI subcommand (``args=None``: from ``sys.argv``, without Lightning's args warning). A
    component's refusal of its input before training (a data folder that does not exist, a corpus too small) ends
    the command in one line with exit code 2, not a traceback, and leaves no empty run folder behind."""
    quiet_lightning()
    try:
        _run(args)
    except BaseException:
        forget_empty_runs()
        raise
    _CLAIMED.clear()


def _run(args: Sequence[str] | None) -> None:
    try:
        LitComputeCLI(args=args)
    except agreement.ConfigMismatchError as err:
        sys.stderr.write(f"lit-compute: error: {err}\n")
        raise SystemExit(2) from None
    except (ValueError, TypeError, ModuleNotFoundError) as err:
        ours = constructor_error(err) or _configuration_error(err)
        if ours is None or _training_started(err):
            raise
        sys.stderr.write(f"lit-compute: error: {ours}\n")
        raise SystemExit(2) from None


def refusal(err: BaseException) -> str | None:
    """A component's or Lightning's refusal of the configuration, as the one line ``fit`` prints for it (None: not a
    refusal, a bug to see whole)."""
    if _training_started(err):
        return None
    found = constructor_error(err)
    if isinstance(found, BaseException):
        return first_line(found, None)
    return found or _configuration_error(err)


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


__all__ = ["LitComputeCLI", "constructor_error", "lightning_cli", "refusal", "run"]
