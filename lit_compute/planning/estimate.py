"""``lit-compute estimate`` and :func:`estimate`: will this config fit, with what micro-batch, before any real step.

The config's model is built on fake tensors (``FakeTensorMode``: shapes, dtypes and devices; no memory, no
arithmetic), one real batch is read from its datamodule and reshaped to each micro-batch size, and one whole
training step - ``training_step``, backward, the optimizer's step, under the config's precision plugin - runs
under :class:`~lit_compute.memory.StorageTracker`: the same tracker :class:`~lit_compute.MemoryMonitor` runs on a
real step, so the prediction has the same parts. What no tensor holds is added: each convolution's workspace,
measured once per shape on the device (:mod:`lit_compute.memory.workspaces`), and on CUDA the caching allocator's
rounding, blocks and segments, replayed through its model after the cuBLAS workspaces it keeps
(:mod:`lit_compute.memory.caching_allocator`): the allocated and the reserved peak. The step is traced twice (the first
creates the optimizer's state, as a real run's first step does) and the larger peak is the prediction. Per rank: under
DDP its gradient buckets are added (every rank holds the whole model).

The largest micro-batch that fits ``--memory`` (or the ``--device``'s capacity) is found by tracing: peak memory
grows linearly with the micro-batch, so two traces give the line, and the sizes around its crossing are traced to
confirm. When it does not fit, the blocks whose activations to recompute (``torch.utils.checkpoint``) are named,
largest saving first, each with its recompute cost in hardware FLOPs.
"""

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
from lit_compute.memory.tracker import PARTS, MemoryBreakdown, StorageTracker
from lit_compute.memory.workspaces import KernelWorkspaces
from lit_compute.planning.capacity import capacity_of
from lit_compute.planning.checkpoint_advice import Checkpointing, checkpoint_candidates
from lit_compute.speedup.channels_last import ChannelsLast

__all__ = ["EstimateError", "EstimateRow", "Plan", "estimate", "trace_step"]


class EstimateError(ValueError):
    """An estimate that cannot be made (bad config, unknown device): the message names what and the fix."""


@dataclass
class EstimateRow:
    """The predicted peak of one training step per device at one micro-batch size."""

    micro_batch: int
    peak_bytes: int
    parts: dict[str, int]
    fits: bool | None
    rank: int = 0
    at: str = ""
    method: str = "traced on fake tensors"
    reserved_bytes: int | None = None  # CUDA: the caching allocator's reserved peak (model)

    def as_json(self) -> dict[str, Any]:
        return {
            "micro_batch": self.micro_batch,
            "peak_bytes": self.peak_bytes,
            **{f"{p}_bytes": self.parts.get(p, 0) for p in PARTS},
            "fits": self.fits,
            "rank": self.rank,
            "reserved_bytes": self.reserved_bytes,
        }


@dataclass
class Plan:
    """What :func:`estimate` found."""

    rows: list[EstimateRow]
    capacity_bytes: int | None
    capacity_source: str
    largest_fitting: int | None = None
    next_size: EstimateRow | None = None  # the next size up, predicted over the capacity
    checkpointing: list[Checkpointing] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checkpointing_useless: bool = False  # the state alone does not fit: recomputing activations cannot help
    largest_fitting_reserved: int | None = None  # CUDA: the largest whose modelled reserved peak fits

    def summary_json(self) -> dict[str, Any]:
        """What the plan found beyond its rows, for ``--json``'s last line."""
        return {
            "largest_fitting_micro_batch": self.largest_fitting,
            "largest_fitting_micro_batch_reserved": self.largest_fitting_reserved,
            "capacity_bytes": self.capacity_bytes,
            "next_size": self.next_size.as_json() if self.next_size else None,
            "notes": self.notes,
        }


# -- building the config's pieces -------------------------------------------------------------------------------
@dataclass
class _Pieces:
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


def _converted(model: Any, trainer: Any) -> Any:
    """``model`` converted on the meta device as the run converts it before its first step (a fake parameter cannot
    be swapped for another): the precision plugin's ``convert_module`` (bf16-true, 16-true), and ``ChannelsLast``'s
    layout, which the run's callback applies at setup (the traced convolutions then run channels-last, as the run's)."""
    model = trainer.precision_plugin.convert_module(model)
    for callback in trainer.callbacks:
        if isinstance(callback, ChannelsLast):
            model = callback.convert_module(model)
    return model


def _build(config: str | Path, overrides: list[str]) -> _Pieces:
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
                return _build_module(class_type, args, kwargs, built)

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
    model = _converted(model, trainer)
    fake_tensors(model, fake_mode, trainer.strategy.root_device)
    workers: list[int] = []
    try:
        loader = _train_loader(model, datamodule, workers)
        batch = next(iter(loader))
    except (ValueError, TypeError, OSError, ModuleNotFoundError) as err:  # a data folder or file that is not there
        raise EstimateError(f"the config's training data cannot be read: {first_line(err, 1000)}") from None
    size = _batch_size(batch)
    if size is None:
        raise EstimateError(
            "the training batch has no tensor with a batch dimension; lit-compute estimate reshapes "
            "the batch's first dimension"
        )
    pieces = _Pieces(
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
                f"it had allocated {_gb(self.current)}, more than {BUILD_MEMORY_SHARE:.0%} of this "
                f"machine's free memory ({_gb(self.max_bytes)})"
            )
        if _clock() - self.start > self.max_seconds:
            raise _OverBudget(f"it ran for more than {self.max_seconds:.0f} s")
        return out


def build_pieces(config: str | Path, overrides: list[str]) -> _Pieces:
    """:func:`_build` for a caller that is not the command line (whatif's recount and loader timing): the one line
    the CLI writes before it exits (jsonargparse's ``error: Parser key "model": ...``) raised as an
    :class:`EstimateError`, with what to do when a class path does not import from here."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed):
            return _build(config, overrides)
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


def _build_module(class_type: type, args: tuple, kwargs: dict, built: list[str]) -> Any:
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
        f"device has not: {why}; {_gb(budget.current)} for {_clock() - budget.start:.1f} s), then traced on "
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


def _train_loader(model: Any, datamodule: Any, workers: list[int] | None = None) -> Any:
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


def _batch_size(batch: Any) -> int | None:
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


# -- one step ---------------------------------------------------------------------------------------------------
def _attach(model: Any, trainer: Any) -> None:
    """Give the module its trainer (``configure_optimizers`` and steps may read it) and make ``self.log`` a no-op:
    no loop collects results while a step is only traced (and a fake loss has no value to log)."""
    model.trainer = trainer
    model.log = lambda *args, **kwargs: None
    model.log_dict = lambda *args, **kwargs: None


def _optimizers(model: Any) -> list[torch.optim.Optimizer]:
    """The module's optimizers as Lightning builds them, given to its trainer (``self.trainer.optimizers``, and its
    schedulers: ``self.lr_schedulers()`` under manual optimization)."""
    optimizers, schedulers = _compat.init_optimizers(model)
    model.trainer.strategy.connect(model)
    model.trainer.optimizers = optimizers
    model.trainer.strategy.lr_scheduler_configs = schedulers
    return optimizers


def trace_step(
    model: Any,
    batch: Any,
    optimizers: list[torch.optim.Optimizer],
    precision: Any,
    extra_gradient_bytes: int = 0,
    workspaces: Any = None,
    caching_allocator: int | None = None,
) -> MemoryBreakdown:
    """Run one training step of ``model`` on ``batch`` as Lightning's automatic optimization does (``training_step``,
    ``zero_grad``, backward, every optimizer's step) under the precision plugin's context and a :class:`StorageTracker`;
    the step's peak and its parts. Manual optimization runs as the module wrote it (``manual_backward`` is a plain
    backward, ``optimizers()`` the built optimizers). The batch counts as ``other`` (it is in memory through the step);
    ``workspaces`` adds what kernels allocate for themselves (:class:`~lit_compute.memory.workspaces.KernelWorkspaces`).
    ``caching_allocator`` (a CUDA device: the bytes of cuBLAS workspaces it keeps) replays the step through the model
    of the CUDA caching allocator (:mod:`lit_compute.memory.caching_allocator`): the peak is then what
    ``max_memory_allocated`` would read (rounding and whole blocks beyond the tensors in ``other``) and ``reserved``
    what ``max_memory_reserved`` would."""
    from lit_compute._compat import tree_leaves
    from lit_compute.memory.memory_monitor import state_tensors

    tracker = StorageTracker(workspaces)
    for part, tensors in state_tensors(model, optimizers).items():
        tracker.register(tensors, part)
    tracker.register(tree_leaves(batch), "other")
    tracker.register_bytes(extra_gradient_bytes, "gradients")
    manual = not model.automatic_optimization
    if manual:

        def manual_backward(loss: torch.Tensor, *a: Any, **k: Any) -> None:
            tracker.phase("backward")
            loss.backward(*a, **k)

        model.manual_backward = manual_backward
        model.optimizers = lambda use_pl_optimizer=True: optimizers[0] if len(optimizers) == 1 else optimizers
    with tracker, precision.forward_context():
        out = model.training_step(batch, 0)
        loss = out.get("loss") if isinstance(out, dict) else out
        if not manual:
            if not isinstance(loss, torch.Tensor):
                raise EstimateError(
                    f"{type(model).__name__}.training_step returned {type(loss).__name__}, not a loss tensor"
                )
            for optimizer in optimizers:  # as Lightning's closure: the last step's gradients live through forward
                optimizer.zero_grad(set_to_none=True)
            tracker.phase("backward")
            loss.backward()
            tracker.phase("optimizer")
            for optimizer in optimizers:
                optimizer.step()
    kept = state_tensors(model, optimizers)
    found = tracker.breakdown(gradients=kept["gradients"], optimizer=kept["optimizer"])
    if caching_allocator is not None:
        from lit_compute.memory.caching_allocator import simulate

        persistent = [(1, -1, caching_allocator)] if caching_allocator else []
        peaks = simulate([*persistent, *tracker.events()])
        found.parts["other"] += max(0, peaks.allocated - found.peak)
        found.peak, found.reserved = max(found.peak, peaks.allocated), peaks.reserved
    return found


def _predict(pieces: _Pieces, optimizers: list[Any], micro_batch: int, bucket_bytes: int) -> MemoryBreakdown:
    batch = resized(pieces.batch, pieces.batch_size, micro_batch, pieces.fake_mode)
    precision = pieces.trainer.precision_plugin
    caching = pieces.cuda_workspaces if pieces.trainer.strategy.root_device.type == "cuda" else None
    with pieces.fake_mode:
        first = trace_step(pieces.model, batch, optimizers, precision, bucket_bytes, pieces.workspaces, caching)
        second = trace_step(pieces.model, batch, optimizers, precision, bucket_bytes, pieces.workspaces, caching)
    return max(first, second, key=lambda b: b.peak)


def untraceable_module(err: BaseException, model: nn.Module) -> str:
    """The innermost module whose ``forward`` was running when tracing failed (its path in the model)."""
    names = {id(m): n or type(model).__name__ for n, m in model.named_modules()}
    found = type(model).__name__
    tb = err.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in names and tb.tb_frame.f_code.co_name == "forward":
            found = names[id(owner)]
        tb = tb.tb_next
    return found


def _measure(config: str | Path, overrides: list[str], micro_batch: int, bucket_bytes: int) -> MemoryBreakdown:
    """The fallback for a model fake tensors cannot run (data-dependent shapes, custom C++ ops): two real steps on
    the real model at ``micro_batch`` (the real batch repeated to that size), under the same tracker."""
    from lit_compute._lightning_cli import LitComputeCLI

    args = ["--config", str(config), "--trainer.logger=false", "--trainer.enable_progress_bar=false", *overrides]
    with contextlib.redirect_stdout(io.StringIO()):
        cli = LitComputeCLI(args=args, run=False)
    model, trainer = cli.model, cli.trainer
    batch = next(iter(_train_loader(model, cli.datamodule)))
    size = _batch_size(batch) or 1

    def repeat(t: torch.Tensor) -> torch.Tensor:
        if t.dim() > 0 and t.shape[0] == size:
            return torch.cat([t] * (micro_batch // size + 1))[:micro_batch]
        return t

    from lightning.fabric.utilities.apply_func import apply_to_collection

    batch = apply_to_collection(batch, torch.Tensor, repeat)
    model = _converted(model, trainer)
    model.train()
    _attach(model, trainer)
    optimizers = _optimizers(model)
    first = trace_step(model, batch, optimizers, trainer.precision_plugin, bucket_bytes)
    second = trace_step(model, batch, optimizers, trainer.precision_plugin, bucket_bytes)
    return max(first, second, key=lambda b: b.peak)


def _bucket_bytes(pieces: _Pieces) -> int:
    """DDP's gradient buckets (a copy of every trainable parameter's gradient) when the strategy is DDP."""
    from lightning.pytorch.strategies import DDPStrategy

    strategy = pieces.trainer.strategy
    if not isinstance(strategy, DDPStrategy) or _compat.ddp_gradient_as_bucket_view(strategy):
        return 0
    return sum(p.numel() * p.element_size() for p in pieces.model.parameters() if p.requires_grad)


# -- the plan ---------------------------------------------------------------------------------------------------
def _prepare(pieces: _Pieces) -> list[Any]:
    """The model as the strategy sets it up before a step (precision conversion, training mode, its trainer) and
    its optimizers."""
    with pieces.fake_mode:  # the precision's conversion ran on the meta module (_build): fake tensors cannot be swapped
        pieces.model.train()
        _attach(pieces.model, pieces.trainer)
        return _optimizers(pieces.model)


def _shard(pieces: _Pieces, data_parallel: int, tensor_parallel: int) -> None:
    """What ``ModelParallelStrategy`` does before the first step: the device mesh, then the module's own
    ``configure_model`` (FSDP2, tensor parallelism) on it."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(
        pieces.trainer.strategy.root_device.type,
        (data_parallel, tensor_parallel),
        mesh_dim_names=("data_parallel", "tensor_parallel"),
    )
    _compat.set_device_mesh(pieces.model, mesh)
    with pieces.fake_mode:
        pieces.model.configure_model()


def estimate(
    config: str | Path,
    micro_batches: list[int] | None = None,
    device: str | None = None,
    memory: str | float | None = None,
    overrides: list[str] | None = None,
    checkpoint_advice: bool = True,
) -> Plan:
    """Predict the peak memory per device of one training step of ``config`` at each micro-batch size.

    Under Lightning's ``ModelParallelStrategy`` (FSDP2, tensor parallelism) each rank is simulated in this process
    with a fake process group (every collective returns at once): the model is built, the module's
    ``configure_model`` shards it over the same mesh, and the rank's step is traced with its local shards and the
    buffers its collectives allocate; a row per rank.

    Args:
        config: A ``lit-compute fit`` YAML.
        micro_batches: Sizes to predict (default: the config's batch size, half and twice it).
        device: A device name of :data:`~lit_compute.hardware.CHIPS` (a table key or a device name) whose capacity to
            fit into.
        memory: A capacity (``"80GB"``, ``"24GiB"`` or bytes); overrides ``device``.
        overrides: More ``lit-compute fit`` arguments (``--trainer.precision=bf16-mixed``).
        checkpoint_advice: Name the blocks to recompute when a size does not fit.

    Returns:
        A :class:`Plan`: a row per size (and rank), the largest size that fits, the blocks to checkpoint.

    Raises:
        EstimateError: a bad argument, an unknown device, a config whose batch has no batch dimension.
    """
    capacity, source = capacity_of(device, memory)
    overrides = list(overrides or [])
    pieces = _build(config, overrides)
    sizes = sorted(set(micro_batches or [max(1, pieces.batch_size // 2), pieces.batch_size, 2 * pieces.batch_size]))
    if any(s < 1 for s in sizes):
        raise EstimateError(f"--micro-batch {','.join(map(str, sizes))}: sizes must be >= 1")
    layout = _compat.model_parallel_sizes(pieces.trainer.strategy)
    if layout is not None:
        return _estimate_ranks(config, overrides, sizes, layout, capacity, source)
    optimizers = _prepare(pieces)
    buckets = _bucket_bytes(pieces)
    notes = [pieces.built] if pieces.built else []
    if buckets:
        notes.append(f"DDP: each rank holds the whole model and {buckets / 1e9:.3g} GB of gradient buckets")
    traced: dict[int, MemoryBreakdown] = {}
    method = ["traced on fake tensors"]

    def peak_at(size: int) -> MemoryBreakdown:
        if size not in traced:
            if method[0] == "traced on fake tensors":
                try:
                    traced[size] = _predict(pieces, optimizers, size, buckets)
                    return traced[size]
                except EstimateError:
                    raise
                except Exception as err:  # noqa: BLE001 - data-dependent shapes, custom ops: measure instead
                    where = untraceable_module(err, pieces.model)
                    if traced:  # other sizes traced: this size's own failure, never a real step of it
                        raise EstimateError(
                            f"tracing micro-batch {size} failed in {where} ({type(err).__name__}: "
                            f"{str(err).strip()[:200]})"
                        ) from None
                    notes.append(
                        f"the model cannot be traced on fake tensors ({where}: {type(err).__name__}: "
                        f"{first_line(err, 200)}); each size is measured on a real step instead"
                    )
                    method[0] = "measured on a real step"
            if size > pieces.batch_size and pieces.batch_size not in traced:
                peak_at(pieces.batch_size)  # the config's own batch first: fit trains it, and it gives a scale
            _affordable(size, traced)
            try:
                traced[size] = _measure(config, overrides, size, buckets)
            except Exception as err:  # noqa: BLE001 - the user's step itself fails: say so in one line
                raise EstimateError(
                    f"a real training step of micro-batch {size} failed too ({typed_line(err)[:250]}"
                    f"); `lit-compute fit --config {config}` must train first"
                ) from None
        return traced[size]

    try:
        rows = [_row(size, peak_at(size), capacity, method[0]) for size in sizes]
    except _TooLarge as err:
        raise EstimateError(f"micro-batch {err.size} is not measured: {err.why}") from None
    plan = Plan(rows=rows, capacity_bytes=capacity, capacity_source=source, notes=notes)
    plan.notes += _device_notes(pieces)
    _fit(plan, peak_at, capacity)
    if (
        capacity is not None
        and checkpoint_advice
        and any(r.fits is False for r in rows)
        and method[0] == "traced on fake tensors"
        and not plan.checkpointing_useless
    ):
        biggest = max((r for r in rows if r.fits is False), key=lambda r: r.micro_batch)
        batch = resized(pieces.batch, pieces.batch_size, biggest.micro_batch, pieces.fake_mode)
        plan.checkpointing = checkpoint_candidates(
            pieces.model, batch, pieces.fake_mode, pieces.trainer.precision_plugin.forward_context
        )
    return plan


class _TooLarge(Exception):
    """A real step (the fallback for a model fake tensors cannot run) that this machine could not hold."""

    def __init__(self, size: int, why: str) -> None:
        super().__init__(why)
        self.size, self.why = size, why


def _affordable(size: int, measured: dict[int, MemoryBreakdown], share: float = 0.5) -> None:
    """Raise :class:`_TooLarge` when a real step of ``size`` would need more than ``share`` of this machine's free
    memory, on the line through the two largest sizes measured so far (a real step is never run at a size not known
    to fit here: an estimate for an 80 GB GPU must not take a laptop's memory)."""
    import psutil

    points = sorted((s, b.peak) for s, b in measured.items())
    if not points or size <= points[-1][0]:
        return
    (s1, b1) = points[-1]
    slope = (b1 - points[-2][1]) / (s1 - points[-2][0]) if len(points) > 1 else b1 / s1
    needed = b1 + max(0.0, slope) * (size - s1)
    free = psutil.virtual_memory().available
    if needed > share * free:
        raise _TooLarge(
            size,
            f"a real step of it would need about {_gb(int(needed))}, more than half of this machine's "
            f"free memory ({_gb(int(free))}); the model cannot be traced on fake tensors, so larger "
            "sizes are measured on real steps only",
        )


#: the largest micro-batch the search for the largest that fits traces (a model whose peak hardly grows with the
#: batch fits at any size a step could be given)
SEARCH_LIMIT = 2**24


def _device_notes(pieces: _Pieces) -> list[str]:
    """What the prediction adds for the device beyond tensors, and what it could not measure here."""
    notes = []
    device = pieces.trainer.strategy.root_device
    if device.type == "cuda":
        notes.append(
            f"CUDA: the caching allocator modelled (512-byte rounding, blocks handed out whole, 2 MiB and "
            f"20 MiB segments: the reserved column); {pieces.cuda_workspaces / 2**20:.0f} MiB of cuBLAS "
            "workspaces measured on this device"
        )
    if pieces.workspaces.unmeasured:
        notes.append(
            f"convolution workspaces on {', '.join(sorted(pieces.workspaces.unmeasured))} are not counted: "
            "that device is not here to measure them on"
        )
    if pieces.workspaces.failed:
        notes.append(f"workspaces not measured (counted as 0): {'; '.join(pieces.workspaces.failed[:3])}")
    return notes


def _fit(plan: Plan, peak_at: Any, capacity: int | None) -> None:
    """The largest micro-batch that fits, and a note saying so (or why there is none); on CUDA, also the largest
    whose modelled reserved peak fits (the allocator needs whole segments)."""
    if capacity is None:
        return
    if any(r.reserved_bytes is not None for r in plan.rows):

        def reserved_at(size: int) -> MemoryBreakdown:
            found = peak_at(size)
            return MemoryBreakdown(peak=found.reserved or found.peak, parts=found.parts, at=found.at)

        largest, _, _ = _largest_fitting(reserved_at, capacity)
        plan.largest_fitting_reserved = largest
        plan.notes.append(
            f"largest micro-batch whose reserved memory fits: {largest}"
            if largest is not None
            else "not even micro-batch 1 fits once the caching allocator's segments are counted"
        )
    plan.largest_fitting, plan.next_size, limited = _largest_fitting(peak_at, capacity)
    if plan.largest_fitting is not None and plan.next_size is not None:
        plan.notes.append(
            f"largest micro-batch that fits: {plan.largest_fitting} (traced: "
            f"{_gb(peak_at(plan.largest_fitting).peak)}; {plan.next_size.micro_batch} needs "
            f"{_gb(plan.next_size.peak_bytes)})"
        )
    elif plan.largest_fitting is not None and limited:
        plan.notes.append(
            f"micro-batch {plan.largest_fitting} fits ({_gb(peak_at(plan.largest_fitting).peak)}); larger "
            "ones are not measured: a real step beyond it would not fit this machine's free memory"
        )
    elif plan.largest_fitting is not None:
        plan.notes.append(
            f"every micro-batch up to {plan.largest_fitting:,} fits (the peak hardly grows with the "
            "batch: the optimizer's step holds it)"
        )
    elif plan.next_size is not None:
        one = plan.next_size
        kept = sum(one.parts.get(p, 0) for p in ("parameters", "gradients", "optimizer"))
        if kept > capacity:
            plan.notes.append(
                f"does not fit even at micro-batch 1: the parameters, gradients and optimizer state alone "
                f"need {_gb(kept)} of {_gb(capacity)}; shard them (FSDP2: ModelParallelStrategy), train in "
                "bf16-true, or use an optimizer with less state - recomputing activations cannot help"
            )
            plan.checkpointing_useless = True
        else:
            plan.notes.append(f"does not fit even at micro-batch 1 ({_gb(one.peak_bytes)} of {_gb(capacity)})")


def _largest_fitting(peak_at: Any, capacity: int) -> tuple[int | None, EstimateRow | None, bool]:
    """The largest micro-batch whose peak fits ``capacity``, the next size's row, and whether this machine's memory
    stopped the search (real steps only: :func:`_affordable`). The peak grows with the micro-batch (not always at
    once: the optimizer's step can hold it at small sizes), so sizes double until one does not fit, then the boundary
    is bisected; each size is traced once."""
    one = peak_at(1)
    if one.peak > capacity:
        return None, _row(1, one, capacity), False
    top = SEARCH_LIMIT
    fits, over = 1, None
    while over is None and fits < top:
        size = min(top, fits * 2)
        try:
            found = peak_at(size)
        except _TooLarge:
            return fits, None, True
        if found.peak <= capacity:
            fits = size
        else:
            over = size
    if over is None:
        return fits, None, False
    while over - fits > 1:
        middle = (fits + over) // 2
        if peak_at(middle).peak <= capacity:  # below a size already measured: affordable
            fits = middle
        else:
            over = middle
    return fits, _row(over, peak_at(over), capacity), False


def _estimate_ranks(
    config: str | Path,
    overrides: list[str],
    sizes: list[int],
    layout: tuple[int, int],
    capacity: int | None,
    source: str,
) -> Plan:
    """Each rank of a ``ModelParallelStrategy`` job simulated in this process (see :func:`estimate`)."""
    data_parallel, tensor_parallel = layout
    world = data_parallel * tensor_parallel
    ranks = list(range(world)) if world <= 8 else [0, world - 1]
    rows: list[EstimateRow] = []
    first_rank: dict[int, MemoryBreakdown] = {}
    plan = Plan(
        rows=rows,
        capacity_bytes=capacity,
        capacity_source=source,
        notes=[
            f"ModelParallelStrategy: data parallel {data_parallel} x tensor parallel {tensor_parallel}; "
            f"each rank traced with a fake process group (local shards, collective buffers)"
        ],
    )
    for rank in ranks:
        with _compat.simulated_rank(rank, world):
            pieces = _build(config, overrides)
            try:
                _shard(pieces, data_parallel, tensor_parallel)
                optimizers = _prepare(pieces)
                for size in sizes:
                    found = _predict(pieces, optimizers, size, 0)
                    rows.append(_row(size, found, capacity))
                    rows[-1].rank = rank
                    if rank == ranks[0]:
                        first_rank[size] = found
            except EstimateError:
                raise
            except Exception as err:  # noqa: BLE001 - one line naming where
                raise EstimateError(
                    f"rank {rank} of the {data_parallel} x {tensor_parallel} layout cannot be traced "
                    f"({untraceable_module(err, pieces.model)}: {type(err).__name__}: "
                    f"{str(err).strip()[:200]})"
                ) from None
    if capacity is not None:
        over = [r for r in rows if r.fits is False]
        plan.notes.append(
            f"every rank fits {_gb(capacity)}"
            if not over
            else f"ranks {sorted({r.rank for r in over})} do not fit at micro-batch "
            f"{sorted({r.micro_batch for r in over})}"
        )
        # the largest micro-batch that fits every rank: searched on the rank with the largest peak
        largest = max(rows, key=lambda r: (r.micro_batch, r.peak_bytes)).rank
        with _compat.simulated_rank(largest, world):
            pieces = _build(config, overrides)
            _shard(pieces, data_parallel, tensor_parallel)
            optimizers = _prepare(pieces)
            traced: dict[int, MemoryBreakdown] = {}

            def peak_at(size: int) -> MemoryBreakdown:
                if size not in traced:
                    traced[size] = _predict(pieces, optimizers, size, 0)
                return traced[size]

            _fit(plan, peak_at, capacity)
        if plan.notes[-1].startswith(("largest micro-batch", "every micro-batch", "does not fit")):
            plan.notes[-1] += f" (rank {largest}, the largest)"
    return plan


def _row(
    size: int, found: MemoryBreakdown, capacity: int | None, method: str = "traced on fake tensors"
) -> EstimateRow:
    return EstimateRow(
        micro_batch=size,
        peak_bytes=found.peak,
        parts=dict(found.parts),
        at=found.at,
        fits=None if capacity is None else found.peak <= capacity,
        method=method,
        reserved_bytes=found.reserved,
    )


def predicted_peak(config: str | Path, overrides: list[str] | None = None) -> MemoryBreakdown:
    """The predicted peak of one training step of ``config`` at its own micro-batch, traced on fake tensors only
    (no real step: a model that cannot be traced raises :class:`EstimateError`). ``lit-compute tune
    --device-memory`` asks this before starting a trial."""
    pieces = _build(config, list(overrides or []))
    optimizers = _prepare(pieces)
    try:
        return _predict(pieces, optimizers, pieces.batch_size, _bucket_bytes(pieces))
    except EstimateError:
        raise
    except Exception as err:  # noqa: BLE001 - one line naming the module
        raise EstimateError(
            f"cannot be traced on fake tensors ({untraceable_module(err, pieces.model)}: {type(err).__name__})"
        ) from None


def _gb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e9:.3g} GB"
