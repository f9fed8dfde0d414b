"""One training step traced under the tracker: on fake tensors (the prediction), or, for a model fake tensors cannot
run, a real step of the real model; the model prepared (and sharded) as its strategy does first."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lit_compute import _compat
from lit_compute.memory.tracker import MemoryBreakdown, StorageTracker
from lit_compute.planning.estimate.compiled import compiled_layout
from lit_compute.planning.estimate.pieces import Pieces, converted, first_dimension, resized, train_loader
from lit_compute.planning.estimate.plan import EstimateError


def attach(model: Any, trainer: Any) -> None:
    """Give the module its trainer (``configure_optimizers`` and steps may read it) and make ``self.log`` a no-op:
    no loop collects results while a step is only traced (and a fake loss has no value to log)."""
    model.trainer = trainer
    model.log = lambda *args, **kwargs: None
    model.log_dict = lambda *args, **kwargs: None


def built_optimizers(model: Any) -> list[torch.optim.Optimizer]:
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


def predict_peak(pieces: Pieces, optimizers: list[Any], micro_batch: int, bucket_bytes: int) -> MemoryBreakdown:
    batch = resized(pieces.batch, pieces.batch_size, micro_batch, pieces.fake_mode)
    precision = pieces.trainer.precision_plugin
    caching = pieces.cuda_workspaces if pieces.trainer.strategy.root_device.type == "cuda" else None
    with pieces.fake_mode, compiled_layout(pieces):
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


def measure(config: str | Path, overrides: list[str], micro_batch: int, bucket_bytes: int) -> MemoryBreakdown:
    """The fallback for a model fake tensors cannot run (data-dependent shapes, custom C++ ops): two real steps on
    the real model at ``micro_batch`` (the real batch repeated to that size), under the same tracker."""
    from lit_compute._lightning_cli import LitComputeCLI

    args = ["--config", str(config), "--trainer.logger=false", "--trainer.enable_progress_bar=false", *overrides]
    with contextlib.redirect_stdout(io.StringIO()):
        cli = LitComputeCLI(args=args, run=False)
    model, trainer = cli.model, cli.trainer
    batch = next(iter(train_loader(model, cli.datamodule)))
    size = first_dimension(batch) or 1

    def repeat(t: torch.Tensor) -> torch.Tensor:
        if t.dim() > 0 and t.shape[0] == size:
            return torch.cat([t] * (micro_batch // size + 1))[:micro_batch]
        return t

    from lightning.fabric.utilities.apply_func import apply_to_collection

    batch = apply_to_collection(batch, torch.Tensor, repeat)
    model = converted(model, trainer)
    model.train()
    attach(model, trainer)
    optimizers = built_optimizers(model)
    first = trace_step(model, batch, optimizers, trainer.precision_plugin, bucket_bytes)
    second = trace_step(model, batch, optimizers, trainer.precision_plugin, bucket_bytes)
    return max(first, second, key=lambda b: b.peak)


def bucket_bytes(pieces: Pieces) -> int:
    """DDP's gradient buckets (a copy of every trainable parameter's gradient) when the strategy is DDP."""
    from lightning.pytorch.strategies import DDPStrategy

    strategy = pieces.trainer.strategy
    if not isinstance(strategy, DDPStrategy) or _compat.ddp_gradient_as_bucket_view(strategy):
        return 0
    return sum(p.numel() * p.element_size() for p in pieces.model.parameters() if p.requires_grad)


def prepare(pieces: Pieces) -> list[Any]:
    """The model as the strategy sets it up before a step (precision conversion, training mode, its trainer) and
    its optimizers."""
    with pieces.fake_mode:  # the precision's conversion ran on the meta module (build): fake tensors cannot be swapped
        pieces.model.train()
        attach(pieces.model, pieces.trainer)
        return built_optimizers(pieces.model)


def shard(pieces: Pieces, data_parallel: int, tensor_parallel: int) -> None:
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
