"""Building a config's pieces as ``lit-compute fit`` would, the LightningModule on fake tensors: its trainer, one real
batch of its training data (reshaped to any micro-batch), and the model built on the CPU within a budget when
the meta device is not enough."""

from __future__ import annotations

import contextlib
import io
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lit_compute import _compat
from lit_compute.formatting import first_line, typed_line
from lit_compute.memory.tracker import StorageTracker
from lit_compute.memory.workspaces import KernelWorkspaces
from lit_compute.planning.estimate.plan import EstimateError, gb
from lit_compute.speedup.channels_last import ChannelsLast


@dataclass
class Pieces:
    model: Any
    batch: Any
    batch_size: int
    trainer: Any
    fake_mode: Any
    built: str = ""  # how the model was built when the meta device was not enough (a note for the plan)
    workspaces: KernelWorkspaces = field(default_factory=KernelWorkspaces)
    cuda_workspaces: int = 0  # cuBLAS workspaces the caching allocator keeps (a CUDA device here: measured)
    loader: Any = None  # the training loader, in this process (no workers)
    loader_workers: int | None = None  # the config's loader's worker processes


def converted(model: Any, trainer: Any) -> Any:
    """``model`` converted on the meta device as the run converts it before its first step (a fake parameter cannot
    be swapped for another): the precision plugin's ``convert_module`` (bf16-true, 16-true), and ``ChannelsLast``'s
    layout, which the run's callback applies at setup (the traced convolutions then run channels-last, as the run's)."""
    model = trainer.precision_plugin.convert_module(model)
    for callback in trainer.callbacks:
        if isinstance(callback, ChannelsLast):
            model = callback.convert_module(model)
    return model


def build(config: str | Path, overrides: list[str]) -> Pieces:
    """The config's model (on fake tensors), trainer and one real batch of its training data."""
    from lightning.pytorch import LightningModule

    from lit_compute._lightning_cli import LitComputeCLI, quiet_lightning, refusal

    quiet_lightning()
    import logging

    for name in ("lightning.pytorch", "lightning.fabric"):  # seed, accelerator and summary lines: not the estimate's
        logging.getLogger(name).setLevel(logging.WARNING)
    from lit_compute.packaged_configs import resolve_config, unknown_config_message

    path = Path(resolve_config(str(config)))  # a packaged config's name, as lit-compute fit takes it
    if not path.is_file():
        raise EstimateError(unknown_config_message(str(config)) or f"--config {config}: no such file")
    fake_mode = _compat.fake_tensor_mode()
    built: list[str] = []

    class FakeModelCLI(LitComputeCLI):
        """The config's classes as ``fit`` builds them, the LightningModule on fake tensors (no memory)."""

        def before_instantiate_classes(self) -> None:
            super().before_instantiate_classes()

            def on_fake_tensors(class_type: type, *args: Any, **kwargs: Any) -> Any:
                return build_module(class_type, args, kwargs, built)

            self.parser.add_instantiator(on_fake_tensors, LightningModule, subclasses=True, prepend=True)

    args = ["--config", str(path), "--trainer.logger=false", "--trainer.enable_progress_bar=false", *overrides]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            cli = FakeModelCLI(args=args, run=False)
    except (ValueError, TypeError, ModuleNotFoundError) as err:  # a component refusing its arguments: one line
        ours = refusal(err)
        if ours is None:
            raise
        raise EstimateError(ours) from None
    model, trainer, datamodule = cli.model, cli.trainer, cli.datamodule
    model = converted(model, trainer)
    fake_tensors(model, fake_mode, trainer.strategy.root_device)
    workers: list[int] = []
    try:
        loader = train_loader(model, datamodule, workers)
        batch = next(iter(loader))
    except (ValueError, TypeError, OSError, ModuleNotFoundError) as err:  # a data folder or file that is not there
        raise EstimateError(f"the config's training data cannot be read: {first_line(err, 1000)}") from None
    size = first_dimension(batch)
    if size is None:
        raise EstimateError(
            "the training batch has no tensor with a batch dimension; lit-compute estimate reshapes "
            "the batch's first dimension"
        )
    pieces = Pieces(
        model,
        batch,
        size,
        trainer,
        fake_mode,
        built[0] if built else "",
        loader=loader,
        loader_workers=workers[0] if workers else None,
    )
    if trainer.strategy.root_device.type == "cuda":
        from lit_compute.memory.workspaces import blas_workspaces

        pieces.cuda_workspaces = blas_workspaces(trainer.strategy.root_device) or 0
    return pieces


class _Unbuildable(TypeError):
    """The model's constructor failed on the meta device and on the CPU: the message names the class and the call
    (LitComputeCLI prints it as its one line for a constructor that fails, and exits 2)."""


#: a model built on the CPU (its constructor reads tensor values) may take at most this share of the free memory
#: and this many seconds; beyond either, the estimate stops with one line instead
BUILD_MEMORY_SHARE = 0.5
BUILD_SECONDS = 300.0
_clock = time.monotonic


class _OverBudget(RuntimeError):
    pass


class _BuildBudget(StorageTracker):
    """Follows what a constructor allocates on the CPU and stops it (:class:`_OverBudget`) past ``max_bytes`` or
    ``max_seconds``."""

    def __init__(self, max_bytes: int, max_seconds: float) -> None:
        super().__init__()
        self.max_bytes, self.max_seconds = max_bytes, max_seconds
        self.start = _clock()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.current > self.max_bytes:
            raise _OverBudget(
                f"it had allocated {gb(self.current)}, more than {BUILD_MEMORY_SHARE:.0%} of this "
                f"machine's free memory ({gb(self.max_bytes)})"
            )
        if _clock() - self.start > self.max_seconds:
            raise _OverBudget(f"it ran for more than {self.max_seconds:.0f} s")
        return out


def build_pieces(config: str | Path, overrides: list[str]) -> Pieces:
    """:func:`build` for a caller that is not the command line (whatif's recount and loader timing): the one line
    the CLI writes before it exits (jsonargparse's ``error: Parser key "model": ...``) raised as an
    :class:`EstimateError`, with what to do when a class path does not import from here."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed):
            return build(config, overrides)
    except SystemExit as stop:
        lines = [line.strip() for line in printed.getvalue().splitlines() if line.strip()]
        text = lines[-1].split("error: ", 1)[-1] if lines else f"the command line stopped (exit {stop.code})"
        text = re.sub(r" \(options: [^)]*\)", "", text)  # the command line's own hint, not this caller's
        if "No module named" in text:
            text += (
                "; run lit-compute from the folder the config's class paths import from (the one lit-compute "
                "fit ran in)"
            )
        raise EstimateError(text) from None


def build_module(class_type: type, args: tuple, kwargs: dict, built: list[str]) -> Any:
    """The LightningModule built on the meta device (no memory; its tensors become fake ones on the config's device).
    A constructor that reads tensor values back (RegNet's block widths, a ``torch.linspace(...).tolist()`` drop-path
    schedule) cannot run there: it is built on the CPU instead, within a memory and time budget
    (:data:`BUILD_MEMORY_SHARE` of the free memory, :data:`BUILD_SECONDS`), its parameters then turned into fake
    tensors (their memory freed), and ``built`` says so. A model that cannot be built either way is one line naming
    the class."""
    import psutil

    try:
        with torch.device("meta"):
            return class_type(*args, **kwargs)
    except Exception as meta_err:  # noqa: BLE001 - any constructor failure on meta: tried once more on the CPU
        why = typed_line(meta_err)
    budget = _BuildBudget(int(BUILD_MEMORY_SHARE * psutil.virtual_memory().available), BUILD_SECONDS)
    try:
        with torch.device("cpu"), budget:
            module = class_type(*args, **kwargs)
    except _OverBudget as err:
        raise _Unbuildable(
            f"{class_type.__name__}(...) cannot be built on the meta device ({why}), and on the CPU "
            f"{err}: stopped. Give the model a constructor that does not read tensor values, or "
            "estimate on a machine with more memory"
        ) from None
    except Exception as cpu_err:  # noqa: BLE001 - the user's constructor: its failure in one line
        cpu_why = typed_line(cpu_err)
        if cpu_why == why:  # the arguments themselves, whatever the device: said once
            raise _Unbuildable(f"{class_type.__name__}(...) cannot be built: {why}") from None
        raise _Unbuildable(
            f"{class_type.__name__}(...) cannot be built: on the meta device {why}; on the CPU {cpu_why}"
        ) from None
    built.append(
        f"{class_type.__name__} was built on the CPU (its constructor reads tensor values, which the meta "
        f"device has not: {why}; {gb(budget.current)} for {_clock() - budget.start:.1f} s), then traced on "
        "fake tensors"
    )
    return module


def fake_tensors(module: nn.Module, fake_mode: Any, device: torch.device) -> nn.Module:
    """Give every parameter and buffer of ``module`` (built on the meta device) a fake tensor on ``device``, in
    place; tied parameters stay tied."""
    memo: dict[int, torch.Tensor] = {}  # id of the original parameter or buffer (kept alive: ids stay unique)
    originals: list[torch.Tensor] = []

    def fake(t: torch.Tensor, parameter: bool) -> torch.Tensor:
        if id(t) not in memo:
            originals.append(t)
            meta = t.detach() if t.device.type == "meta" else t.detach().to("meta")
            made = _compat.fake_tensor(fake_mode, meta, device)
            memo[id(t)] = nn.Parameter(made, requires_grad=t.requires_grad) if parameter else made
        return memo[id(t)]

    _compat.replace_module_tensors(module, fake)
    return module


def train_loader(model: Any, datamodule: Any, workers: list[int] | None = None) -> Any:
    """The training loader, without worker processes (one batch is read); ``workers`` gets the loader's own count."""
    source = datamodule if datamodule is not None else model
    if datamodule is not None:
        datamodule.prepare_data()
        datamodule.setup("fit")
    loader = source.train_dataloader()
    if workers is not None and hasattr(loader, "num_workers"):
        workers.append(int(loader.num_workers))
    if hasattr(loader, "num_workers") and loader.num_workers:  # one batch: no worker processes
        loader = torch.utils.data.DataLoader(
            loader.dataset, batch_size=loader.batch_size, collate_fn=loader.collate_fn, num_workers=0
        )
    return loader


def first_dimension(batch: Any) -> int | None:
    from lit_compute._batch import batch_size

    return batch_size(batch)


def resized(batch: Any, old: int, new: int, fake_mode: Any) -> Any:
    """``batch`` with every tensor whose first dimension is the batch size made ``new`` long, as fake tensors."""
    from lightning.fabric.utilities.apply_func import apply_to_collection
    from lightning.pytorch.utilities import move_data_to_device  # noqa: F401 - Lightning's collections

    def convert(t: torch.Tensor) -> torch.Tensor:
        with fake_mode:
            if t.dim() > 0 and t.shape[0] == old:
                return torch.empty((new, *t.shape[1:]), dtype=t.dtype, device=t.device)
            return torch.empty_like(t)

    return apply_to_collection(batch, torch.Tensor, convert)
