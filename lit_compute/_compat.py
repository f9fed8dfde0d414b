"""The one place that touches private attributes of torch / Lightning (each use guarded), and facts about the
system this process runs on (CPU cores)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._prims_common import suggest_memory_format

# torch's private modules that hold public-looking names with no public path in every torch we support: its pytree,
# the dispatch-mode base class, and the norm layers' base classes. The rest of the package imports them from here.
from torch.nn.modules.batchnorm import _BatchNorm as BatchNormBase
from torch.nn.modules.batchnorm import _NormBase as NormBase
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map

__all__ = ["BatchNormBase", "NormBase", "TorchDispatchMode", "tree_flatten", "tree_leaves", "tree_map"]  # and below


# -- torch internals behind the counting and memory code ----------------------------------------------------------
def compiled_original(module: Any) -> nn.Module | None:
    """The module ``torch.compile(module)`` wrapped (``OptimizedModule._orig_mod``); None for any other object."""
    inner = getattr(module, "_orig_mod", None)
    return inner if isinstance(inner, nn.Module) else None


def compiled_in_place(module: nn.Module) -> bool:
    """Whether ``module.compile()`` compiled this module in place (its ``_compiled_call_impl`` is set)."""
    return getattr(module, "_compiled_call_impl", None) is not None


def trains_compiled(module: Any) -> bool:
    """Whether the LightningModule runs compiled: Lightning was given ``torch.compile(module)`` (it keeps the compile
    arguments in the module's ``_compiler_ctx``) or ``module.compile()`` compiled it in place."""
    return getattr(module, "_compiler_ctx", None) is not None or compiled_in_place(module)


def local_tensor(t: Any) -> torch.Tensor | None:
    """A DTensor's local shard (what this rank holds, ``DTensor._local_tensor``); None for any other tensor."""
    inner = getattr(t, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else None


def held_tensor(t: Any) -> Any:
    """What a tensor holds in this rank's memory: a DTensor's local shard, any other tensor (or value) itself."""
    inner = local_tensor(t)
    return inner if inner is not None else t


def in_backward() -> bool:
    """Whether autograd is running a backward pass in this thread (a graph task is under way)."""
    return bool(torch._C._current_graph_task_id() != -1)


def current_autograd_node() -> Any:
    """The autograd node executing now in this thread's backward (None outside one)."""
    return torch._C._current_autograd_node()


def autograd_node_sequence_nr(node: Any) -> int:
    """The sequence number autograd gave ``node`` when the forward op that made it ran."""
    return int(node._sequence_nr())


def last_autograd_sequence_nr() -> int:
    """The sequence number of the last autograd node this thread's forward created."""
    return int(torch._C._autograd._get_sequence_nr()) - 1


def nested_tensor_sizes(t: Any) -> list[list[int]] | None:
    """The ``(L_i, E)`` sizes of a strided nested tensor's sequences (``_nested_tensor_size``); None for a jagged
    one."""
    sizes = t._nested_tensor_size() if hasattr(t, "_nested_tensor_size") else None
    return None if sizes is None else [[int(v) for v in row] for row in sizes.tolist()]


def disable_dispatch_modes() -> contextlib.AbstractContextManager[Any]:
    """Leave every dispatch mode of the stack (fake tensors, tracers, counters) for the block."""
    return _disable_current_modes()


def profiler_allocation_kind() -> Any:
    """The kind of a profiler event that is an allocation (``torch._C._profiler._EventType.Allocation``)."""
    from torch._C._profiler import _EventType

    return _EventType.Allocation


def clear_cublas_workspaces() -> None:
    """Free the cuBLAS workspaces torch keeps per stream (a no-op where torch has no such call)."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def returns_only_views(op: Any) -> bool:
    """Whether an aten op's results all alias an operand without writing it (``aten.view``, ``aten.t``): such an op
    launches no kernel and moves no data. Read from the op's schema; False when it has none."""
    schema = getattr(op, "_schema", None)
    return bool(
        schema is not None
        and schema.returns
        and all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    )


def default_cache_dir() -> Path:
    """``$LIT_COMPUTE_CACHE`` or ``~/.cache/lit_compute``: datasets, token corpora, image checks, measured peaks."""
    return Path(os.environ.get("LIT_COMPUTE_CACHE", Path.home() / ".cache" / "lit_compute")).expanduser()


def available_cpu_cores() -> int:
    """CPU cores this process may run on (affinity-aware), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS / Windows
        return max(1, os.cpu_count() or 1)


def module_flags(model: nn.Module) -> tuple[tuple[int, ...], bytes, bytes, int]:
    """In one walk over ``model``'s modules: their ids, each module's ``training`` flag and each parameter's
    ``requires_grad`` flag (as bytes), and how many parameters require gradients. Reads each module's own
    parameter table (``_parameters``) instead of ``parameters()``, which walks the modules a second time."""
    modules = list(model.modules())
    grads = [p.requires_grad for m in modules for p in getattr(m, "_parameters", {}).values() if p is not None]
    return tuple(map(id, modules)), bytes([m.training for m in modules]), bytes(grads), sum(grads)


def seed_module_names(tracker: Any, root: nn.Module, prefix: str) -> bool:
    """Name ``root``'s submodules by their real paths in torch's ``ModuleTracker`` (``prefix.path``).

    ``ModuleTracker`` names modules by the class name of the first module it sees, so the same layer is
    ``ResNet.layer1`` or ``DistributedDataParallel.module._forward_module.net.layer1`` depending on how the
    forward was entered. Seeding its name table gives stable paths. Returns False when the private table
    is not there (another torch version); names then fall back to torch's own.
    """
    known = getattr(tracker, "_known_modules", None)
    seen = getattr(tracker, "_seen_modules", None)
    if known is None or seen is None:
        return False
    for path, module in root.named_modules():
        known[module] = f"{prefix}.{path}" if path else prefix
        seen.add(module)
    return True


@contextlib.contextmanager
def eager_compiled_code() -> Iterator[None]:
    """Run ``torch.compile``d code eagerly (so dispatch-mode counting sees every op), where torch allows."""
    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    if set_stance is None:  # torch < 2.6
        yield
        return
    with set_stance("force_eager"):
        yield


def grad_scaler_scale_tensor(scaler: Any) -> torch.Tensor | None:
    """The GradScaler's current scale as a device tensor (reading it as a number would force a sync)."""
    scale = getattr(scaler, "_scale", None)
    return scale if isinstance(scale, torch.Tensor) else None


def start_profiler_at_step(profiler: Any, step: int) -> None:
    """Start a scheduled ``torch.profiler.profile`` whose step counter begins at ``step`` (a global step), so
    its ``ProfilerStep#N`` ranges carry the trainer's step numbers."""
    profiler.step_num = step
    profiler.current_action = profiler.schedule(step)
    if hasattr(profiler, "_prev_schedule_action"):
        profiler._prev_schedule_action = profiler.current_action
    profiler.start()


# -- the training loop's notion of a step (read by lit_compute.timeline) -----------------------------------
def batches_that_stepped(trainer: Any) -> int:
    """The step number Lightning's own ``self.log`` writes at: the fit loop's ``_batches_that_stepped`` (optimizer
    steps under automatic optimization, training batches under manual optimization). Falls back to
    ``global_step`` where a Lightning version lacks it."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    value = getattr(loop, "_batches_that_stepped", None)
    return int(value) if isinstance(value, int) else int(trainer.global_step)


def _should_accumulate(trainer: Any) -> bool | None:
    """Lightning's ``_should_accumulate()`` of the running epoch loop (valid from ``on_train_batch_start`` of a batch
    to its end: the batch is already counted ready); None where this Lightning's internals are not there."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    should_accumulate = getattr(loop, "_should_accumulate", None)
    if callable(should_accumulate):
        try:
            return bool(should_accumulate())
        except Exception:  # noqa: BLE001 - another Lightning version's internals
            return None
    return None


def _manual(trainer: Any) -> bool:
    module = getattr(trainer, "lightning_module", None)
    return module is not None and not getattr(module, "automatic_optimization", True)


def batch_completes_step(trainer: Any, global_step_at_batch_start: int) -> bool:
    """Whether the training batch now ending completes a step (Lightning's ``not _should_accumulate()``: always
    under manual optimization, at the accumulation boundary or the epoch's last batch otherwise)."""
    accumulating = _should_accumulate(trainer)
    if accumulating is not None:
        return not accumulating
    if _manual(trainer):
        return True
    return trainer.global_step > global_step_at_batch_start


def batch_will_step(trainer: Any) -> bool:
    """At a training batch's start: whether the optimizer steps in this batch (Lightning's ``not
    _should_accumulate()``). True under manual optimization (the user steps where they like), without accumulation,
    and where this Lightning's internals are not there."""
    if _manual(trainer) or int(getattr(trainer, "accumulate_grad_batches", 1) or 1) <= 1:
        return True
    return not _should_accumulate(trainer)


def compile_activity() -> tuple[int, float] | None:
    """A mark that changes whenever ``torch.compile`` compiles (frames compiled, seconds spent); None when
    dynamo was never imported (nothing compiled)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    try:
        frames = int(utils.counters["frames"]["total"])
        seconds = float(sum(utils.compilation_time_metrics.get("_compile.compile_inner", [])))
        return frames, seconds
    except Exception:  # noqa: BLE001 - another torch version's internals
        return None


def mark_checkpoint_saving(trainer: Any, timeline: Any) -> None:
    """Make ``trainer.save_checkpoint`` a labelled ``checkpoint`` interval of the timeline (an instance attribute
    wrapping the bound method; every ``ModelCheckpoint`` save goes through it)."""
    original = getattr(trainer, "save_checkpoint", None)
    if original is None or getattr(original, "_lit_compute_marked", False):
        return

    @functools.wraps(original)
    def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        with timeline.interval("checkpoint", "save_checkpoint"):
            return original(*args, **kwargs)

    save_checkpoint._lit_compute_marked = True  # type: ignore[attr-defined]
    with contextlib.suppress(AttributeError):  # pragma: no cover - a trainer class with __slots__
        trainer.save_checkpoint = save_checkpoint


def is_last_training_step(trainer: Any) -> bool:
    """Whether the step now ending is the run's last (``max_steps``, the last batch of the last epoch, or a stop
    request); False when it cannot be told."""
    try:
        if trainer.should_stop or trainer.fit_loop.done:
            return True
        epoch_loop = trainer.fit_loop.epoch_loop
        max_epochs = trainer.max_epochs
        return bool(
            epoch_loop._num_ready_batches_reached()
            and max_epochs is not None
            and max_epochs >= 0
            and trainer.current_epoch + 1 >= max_epochs
        )
    except Exception:  # noqa: BLE001 - another Lightning version's internals
        return False


def add_initial_hparam(pl_module: Any, key: str, value: Any) -> None:
    """Add ``key`` to the hyperparameters Lightning logs at fit start (``hparams_initial``), so it reaches
    TensorBoard's HParams tab and ``hparams.yaml`` in Lightning's one ``log_hyperparams`` call."""
    from lightning.fabric.utilities.data import AttributeDict

    initial = getattr(pl_module, "_hparams_initial", None)
    if initial is None:
        initial = AttributeDict()
        pl_module._hparams_initial = initial
    initial[key] = value


@dataclass(frozen=True)
class ParallelLayout:
    """How a run's ranks divide the work: ``data_parallel`` replicas (each its own batch) x ``tensor_parallel``
    peers (sharing one batch, each executing a share of every sharded op), on ``nodes`` x ``devices_per_node``."""

    data_parallel: int = 1
    tensor_parallel: int = 1
    nodes: int = 1
    devices_per_node: int = 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    def describe(self) -> str:
        return f"data parallel {self.data_parallel} x tensor parallel {self.tensor_parallel}"


_TENSOR_PARALLEL_DIMS = ("tensor_parallel", "tp")


def device_mesh(trainer: Any) -> tuple[Any, tuple[str, ...]]:
    """The strategy's device mesh (Lightning's ``ModelParallelStrategy`` keeps it in ``_device_mesh``) and its
    dimension names; ``(None, ())`` for strategies without one."""
    mesh = getattr(getattr(trainer, "strategy", None), "_device_mesh", None)
    return mesh, tuple(getattr(mesh, "mesh_dim_names", None) or ())


def parallel_layout(trainer: Any) -> ParallelLayout:
    """The run's :class:`ParallelLayout`, read from the strategy's device mesh (Lightning's
    ``ModelParallelStrategy`` names its dimensions ``data_parallel`` and ``tensor_parallel``); every other strategy
    (DDP, FSDP, one device) is data parallel over all ranks. The same on every rank."""
    world = max(1, int(getattr(trainer, "world_size", 1) or 1))
    nodes = max(1, int(getattr(trainer, "num_nodes", 1) or 1))
    devices = max(1, world // nodes)
    tensor = 1
    mesh, names = device_mesh(trainer)
    for dim in _TENSOR_PARALLEL_DIMS:
        if dim in names:
            with contextlib.suppress(Exception):
                tensor = max(1, int(mesh[dim].size()))
            break
    return ParallelLayout(
        data_parallel=max(1, world // tensor), tensor_parallel=tensor, nodes=nodes, devices_per_node=devices
    )


def claim_tensorboard_version(logger: Any) -> int | None:
    """Give a ``TensorBoardLogger`` without a fixed version the next free ``version_N`` folder, created at once.

    Lightning picks the next version by listing the folders and creates it only when it first writes, so two runs
    started together (two ``make demo`` in two terminals) both took ``version_0`` and wrote one folder. ``mkdir`` is
    atomic: the run that loses a folder takes the next. Returns the version, or None where the logger's version was
    already fixed, its folder is not local, or this Lightning lacks the attribute."""
    if getattr(logger, "_version", 0) is not None or "://" in str(getattr(logger, "root_dir", "://")):
        return None
    try:
        version = int(logger._get_next_version())
    except Exception:  # noqa: BLE001 - leave the version to Lightning
        return None
    while True:
        try:
            os.makedirs(os.path.join(logger.root_dir, f"version_{version}"))
        except FileExistsError:
            version += 1
            continue
        except OSError:
            return None
        logger._version = version
        return version


def forget_keyboard_interrupt() -> None:
    """Call after catching a KeyboardInterrupt in a command that then exits with its own status (``tune``: 130).

    CPython (3.11 here) marks a KeyboardInterrupt raised inside ``exec`` of a string - which is how ``dataclasses``
    and ``namedtuple`` build their methods, so any import under way when Ctrl-C lands - as unhandled even once it is
    caught, and at exit kills the process with SIGINT instead of returning the status (``python -m`` and console
    scripts alike: the tune test saw -2 for 130 on a loaded machine). Every string ``exec`` resets that mark first."""
    exec("pass")  # a constant: resets the interpreter's unhandled-KeyboardInterrupt mark


def ddp_bucket_bytes(model: Any) -> int:
    """Bytes of DDP's gradient buckets when they are allocated apart from the gradients (torch's default,
    ``gradient_as_bucket_view=False``: every gradient also has a copy in a bucket); 0 for a model that is not DDP,
    or whose gradients are views of its buckets (then the gradients are the buckets)."""
    import re

    if type(model).__name__ != "DistributedDataParallel" or not hasattr(model, "_get_ddp_logging_data"):
        return 0
    try:
        data = model._get_ddp_logging_data()
    except Exception:  # noqa: BLE001 - a torch without the logging data: the buckets are not counted
        return 0
    if data.get("gradient_as_bucket_view"):
        return 0
    return sum(int(n) for n in re.findall(r"\d+", str(data.get("bucket_sizes", ""))))


def model_parallel_sizes(strategy: Any) -> tuple[int, int] | None:
    """``(data parallel, tensor parallel)`` sizes of Lightning's ``ModelParallelStrategy`` before it set up its mesh
    (``"auto"`` as Lightning resolves it: nodes x processes per node); None for any other strategy."""
    if type(strategy).__name__ != "ModelParallelStrategy":
        return None
    nodes, processes = int(getattr(strategy, "num_nodes", 1) or 1), int(getattr(strategy, "num_processes", 1) or 1)
    dp, tp = getattr(strategy, "_data_parallel_size", "auto"), getattr(strategy, "_tensor_parallel_size", "auto")
    return (nodes if dp == "auto" else int(dp)), (processes if tp == "auto" else int(tp))


@contextlib.contextmanager
def simulated_rank(rank: int, world_size: int) -> Iterator[None]:
    """This process plays ``rank`` of ``world_size`` in a fake process group (torch's ``fake`` backend: every
    collective returns at once and moves nothing), so a sharded model can be built and traced rank by rank in one
    process, without launching the job. torch 2.6 and later register the backend themselves; older ones only when
    their test helper is imported."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process; simulate ranks in a fresh one")
    if "fake" not in dist.Backend.backend_list:  # pragma: no cover - torch < 2.6
        from torch.testing._internal.distributed import fake_pg  # noqa: F401 - registers the "fake" backend
    from torch._C._distributed_c10d import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


# -- what a convolution hands cuDNN ----------------------------------------------------------------------------------
def suggests_channels_last(t: torch.Tensor) -> bool:
    """Whether ``t.suggest_memory_format()`` is channels-last: the layout PyTorch hands cuDNN a convolution in when
    the input's or the weight's says so, read from the strides (an ambiguous N x C x 1 x 1 tensor by how it was made;
    ``torch._prims_common``'s Python twin of the C++ rule, which fake tensors reach too)."""
    return t.dim() == 4 and suggest_memory_format(t) == torch.channels_last


# -- what lit-compute estimate reaches: fake tensors, Lightning's optimizer set-up, a strategy's settings ----------
@contextlib.contextmanager
def on_real_tensors() -> Iterator[None]:
    """Run a measurement of this machine on real tensors whatever its caller runs under: no dispatch mode (an
    estimate's ``FakeTensorMode`` and memory tracer, a FLOP counter) sees or fakes its ops, no saved-tensors hook (the
    tracer's activations) sees what its backward saves, autocast is off and gradients are on. A measurement first
    asked for inside a traced step would otherwise time fake tensors (and be cached) and count its own tensors as
    the model's."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_disable_current_modes())
        stack.enter_context(_without_saved_tensors_hooks())
        stack.enter_context(torch.autocast("cpu", enabled=False))
        if torch.cuda.is_available():
            stack.enter_context(torch.autocast("cuda", enabled=False))
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
        yield


@contextlib.contextmanager
def _without_saved_tensors_hooks() -> Iterator[None]:
    """The saved-tensors default hooks taken off autograd's stack for the block and put back after, in order (torch
    without ``_top_saved_tensors_default_hooks``: left as they are)."""
    autograd = torch._C._autograd
    top = getattr(autograd, "_top_saved_tensors_default_hooks", None)
    taken: list[tuple[Any, Any]] = []
    if top is not None:
        with contextlib.suppress(TypeError, RuntimeError):
            while (hooks := top(False)) is not None:
                autograd._pop_saved_tensors_default_hooks()
                taken.append(hooks)
    try:
        yield
    finally:
        for pack, unpack in reversed(taken):
            autograd._push_saved_tensors_default_hooks(pack, unpack)


def fake_tensor_mode() -> Any:
    """A ``FakeTensorMode`` (shapes, dtypes and devices; no memory, no arithmetic) that accepts real inputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def is_fake_tensor(t: Any) -> bool:
    """Whether ``t`` is a fake tensor (``torch._subclasses.fake_tensor.FakeTensor``: shapes, no data)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def fake_tensor(fake_mode: Any, meta: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fake tensor of ``fake_mode`` with ``meta``'s shape and dtype on ``device``."""
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor(fake_mode, meta, device)


def replace_module_tensors(module: nn.Module, replace: Any) -> None:
    """Swap every parameter and buffer of ``module`` and its children in place for ``replace(tensor, is_parameter)``
    (``nn.Module._parameters`` and ``_buffers``: ``setattr`` would refuse a parameter that is a fake tensor)."""
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None:
                sub._parameters[name] = replace(param, True)
        for name, buf in list(sub._buffers.items()):
            if buf is not None:
                sub._buffers[name] = replace(buf, False)


def init_optimizers(model: Any) -> tuple[list[Any], list[Any]]:
    """The module's optimizers and learning-rate scheduler configs as Lightning builds them from
    ``configure_optimizers`` (the fit loop's own helper)."""
    from lightning.pytorch.core.optimizer import _init_optimizers_and_lr_schedulers

    optimizers, schedulers = _init_optimizers_and_lr_schedulers(model)
    return optimizers, schedulers


def ddp_gradient_as_bucket_view(strategy: Any) -> bool:
    """Whether a ``DDPStrategy`` was given ``gradient_as_bucket_view=True`` (then gradients live in the buckets)."""
    return bool(getattr(strategy, "_ddp_kwargs", {}).get("gradient_as_bucket_view"))


def set_device_mesh(model: Any, mesh: Any) -> None:
    """Give a LightningModule the device mesh ``ModelParallelStrategy`` would (``self.device_mesh`` reads it)."""
    model._device_mesh = mesh


def train_loader_workers(trainer: Any) -> str:
    """The training DataLoader's worker processes as the fit loop holds them (0: loading runs in the training
    process); ``n/a`` when unknown."""
    loader = getattr(getattr(trainer, "fit_loop", None), "_combined_loader", None)
    workers = [
        w for d in (getattr(loader, "flattened", None) or []) if isinstance(w := getattr(d, "num_workers", None), int)
    ]
    return str(max(workers)) if workers else "n/a"


def op_class_facts(trainer: Any) -> dict[str, Any]:
    """The run's parameters (all, trainable, bytes), precision, accumulation and :func:`communication_facts`: what
    ``compute/op_classes`` carries beside the counts for ``lit-compute whatif``."""
    module = trainer.lightning_module
    params = list(module.parameters()) if module is not None else []
    return {
        "parameters": sum(p.numel() for p in params),
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
        "precision": str(trainer.precision),
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        **communication_facts(trainer, module),
    }


def communication_facts(trainer: Any, module: Any) -> dict[str, Any]:
    """What decides a step's collectives: DDP's bucket cap (MB), FSDP2's units (each gathers its parameters and
    reduce-scatters its gradients once)."""
    facts: dict[str, Any] = {}
    kwargs = getattr(trainer.strategy, "_ddp_kwargs", None)
    if isinstance(kwargs, dict):
        facts["ddp_bucket_cap_mb"] = float(kwargs.get("bucket_cap_mb") or 25.0)
    fsdp_module = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
    if fsdp_module is not None and module is not None:
        units = sum(1 for m in module.modules() if isinstance(m, fsdp_module))
        if units:
            facts["fsdp_units"] = units
    return facts


def inductor_layout_optimization() -> tuple[bool, bool]:
    """Inductor's ``layout_optimization`` and ``force_layout_optimization`` settings (``torch._inductor.config``;
    ``TORCHINDUCTOR_LAYOUT_OPTIMIZATION`` and ``TORCHINDUCTOR_FORCE_LAYOUT_OPT`` set them): whether a compiled graph
    may put its convolutions in channels-last, and whether it always does; (True, False), torch's defaults, when this
    torch has no such settings."""
    try:
        from torch._inductor import config
    except ImportError:  # pragma: no cover - a torch without inductor
        return True, False
    return bool(getattr(config, "layout_optimization", True)), bool(getattr(config, "force_layout_optimization", False))
