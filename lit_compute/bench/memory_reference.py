"""The independent side of ``lit-compute bench memory``: what one real training step holds, measured by torch rather
than by lit_compute's tracker.

:class:`ProfiledStep` is a callback ``bench memory`` adds to a real ``lit-compute fit`` run. Over one steady-state
training step (the optimizer's state exists) it records, on this rank:

- ``timeline_peak``: the peak of torch's memory profiler timeline (or ``timeline_error``, what failed, when torch
  could not build it) (``torch.profiler`` with ``profile_memory``,
  ``record_shapes`` and ``with_stack``; ``torch.profiler._memory_profiler.MemoryProfileTimeline``): the storages
  the step's ops read that existed before it (parameters, gradients, optimizer state, the batch) plus every
  allocation and free the allocator reported during it, a tensor's or not (a oneDNN or cuDNN workspace counts);
- ``allocator_peak``: the allocator's live bytes through the step, from the profiler's memory events (every
  allocation and free it reported, a tensor's or not) over the bytes of the storages the step began with
  (parameters, buffers, gradients, optimizer state, the batch). The allocator reports no free of a block allocated
  before profiling began (the last step's gradients, freed by ``zero_grad(set_to_none=True)``): each such storage
  marks its free in the trace (a ``record_function`` from a weak reference's callback) with its size;
- ``max_memory_allocated`` and ``max_memory_reserved`` (CUDA): the caching allocator's peaks over the step (reset at
  its start).

Each rank writes ``rank{N}.json`` into ``out``. None of it uses :class:`~lit_compute.memory.StorageTracker`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lit_compute import _compat

__all__ = ["ProfiledStep", "allocator_peak", "allocator_walk", "state_bytes", "timeline_peak"]


def _storages(tensors: Any) -> dict[int, int]:
    found: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = _compat.held_tensor(t).untyped_storage()  # a DTensor's shard is what this rank holds
            found[st.data_ptr()] = st.nbytes()
    return found


def _state(module: torch.nn.Module, optimizers: list[Any], batch: Any) -> list[Any]:
    from lit_compute._compat import tree_leaves

    tensors: list[Any] = [*module.parameters(), *module.buffers()]
    tensors += [p.grad for p in module.parameters() if p.grad is not None]
    tensors += [v for opt in optimizers for s in opt.state.values() if isinstance(s, dict) for v in s.values()]
    return tensors + tree_leaves(batch)


def state_bytes(module: torch.nn.Module, optimizers: list[Any], batch: Any) -> int:
    """Bytes of the distinct storages a step starts with: parameters, buffers, gradients, optimizer state, the batch."""
    return sum(_storages(_state(module, optimizers, batch)).values())


FREED = "lit_compute::freed:"


def _mark_frees(tensors: list[Any]) -> list[Any]:
    """Weak references whose callbacks mark, in the running profile, the free of each storage (with its size)."""
    import weakref

    def freed(nbytes: int, _ref: Any) -> None:
        with torch.profiler.record_function(f"{FREED}{nbytes}"):
            pass

    refs, seen = [], set()
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = _compat.held_tensor(t).untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                refs.append(weakref.ref(st, functools.partial(freed, st.nbytes())))
    return refs


def allocator_peak(prof: Any, device: torch.device, before: int) -> int:
    """The largest number of bytes the allocator of ``device`` held during the profile: ``before`` (the storages
    live at its start), then every allocation and free it reported, and every marked free of a storage older than
    the profile (which it does not report)."""

    allocation = _compat.profiler_allocation_kind()
    changes: list[tuple[int, int, int | None]] = []
    for root in prof.profiler.kineto_results.experimental_event_tree():
        stack = [root]
        while stack:
            event = stack.pop()
            stack.extend(event.children)
            if event.typed[0] == allocation:
                fields = event.typed[1]
                if fields.device.type == device.type:
                    changes.append((event.start_time_ns, int(fields.alloc_size), int(fields.ptr)))
            elif event.name.startswith(FREED):
                changes.append((event.start_time_ns, -int(event.name[len(FREED) :]), None))
    return allocator_walk(changes, before)


def allocator_walk(changes: list[tuple[int, int, int | None]], before: int) -> int:
    """The peak of ``before`` plus ``(time, bytes, pointer)`` changes in time order. A free counts only for a block
    allocated in the profile (or a marked one, pointer None): the CPU allocator remembers blocks from earlier
    profiles and reports their frees, with sizes that may be stale, when their address is freed again."""
    live = peak = before
    allocated: set[int] = set()
    for _, change, ptr in sorted(changes, key=lambda c: c[0]):
        if ptr is not None and change > 0:
            allocated.add(ptr)
        elif ptr is not None:
            if ptr not in allocated:
                continue
            allocated.discard(ptr)
        live += change
        peak = max(peak, live)
    return peak


def timeline_peak(prof: Any, device: str) -> int:
    """The peak of torch's memory profiler timeline on ``device`` (the sum of every category, unknown included)."""
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(device)
    return max((sum(s) for s in sizes), default=0)


class ProfiledStep(pl.Callback):
    """Profile training step ``step`` (its first micro-batch to its last) and write what torch measured to
    ``out/rank{N}.json`` (see the module docstring)."""

    def __init__(self, out: str, step: int = 2) -> None:
        self.out, self.step = Path(out), step
        self._prof: Any = None
        self._before = 0
        self._refs: list[Any] = []

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if (
            trainer.global_step != self.step
            or self._prof is not None
            or (self.out / f"rank{trainer.global_rank}.json").exists()
        ):
            return
        from torch.profiler import ProfilerActivity, profile

        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        state = _state(pl_module, trainer.optimizers, batch)
        self._before = sum(_storages(state).values())
        self._refs = _mark_frees(state)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self._prof = profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True)
        self._prof.__enter__()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._prof is None or trainer.global_step == self.step:  # still accumulating: the step goes on
            return
        prof, self._prof = self._prof, None
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        prof.__exit__(None, None, None)
        found: dict[str, Any] = {"device": str(device), "state_bytes": self._before}
        name = "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"
        try:
            found["timeline_peak"] = timeline_peak(prof, name)
        except Exception as err:  # noqa: BLE001 - torch's timeline is a check beside the allocator's figure, not it
            # (torch's own DataFlowGraph has failed on an FSDP2 step: "AssertionError: version mismatch")
            found["timeline_error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:120]}"
        if device.type == "cuda":
            found["max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
            found["max_memory_reserved"] = torch.cuda.max_memory_reserved(device)
        found["allocator_peak"] = allocator_peak(prof, device, self._before)
        self._refs = []
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(found))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # every rank reaches the end of training, whatever it profiled: rank 0 (whose exit ends the command, and with
        # it, under some launchers, the other ranks) waits until each rank has written its file
        trainer.strategy.barrier("ProfiledStep")
