"""The live-storage tracker: the peak memory of a piece of code and what the peak is made of, on any device and on
fake tensors.

:class:`StorageTracker` is a ``TorchDispatchMode``: every tensor an op returns whose storage it has not seen is an
allocation of ``storage.nbytes()`` bytes, freed when the storage's Python object is collected (torch keeps one
Python object per storage alive as long as the storage). It keeps an event log (allocation and free, in order),
so the peak and the storages live at the peak are found after the run in one pass, whatever the number of
allocations. Each storage gets one of the parts of :data:`PARTS` when the run ends:

- ``parameters``: the storages of the parameters registered with :meth:`StorageTracker.register` (and buffers);
- ``gradients``: the storages of the parameters' ``.grad`` (DDP's gradient buckets too, where registered);
- ``optimizer``: the storages of the optimizer's state (``optimizer.state``: Adam's moments, momentum buffers);
- ``activations``: storages autograd saved for backward (``torch.autograd.graph.saved_tensors_hooks``);
- ``other``: everything else (temporaries, the batch, kernel outputs freed soon after).

The same code on fake tensors (``FakeTensorMode``: shapes, dtypes and devices, no memory) gives the same log, which
is how :mod:`lit_compute.planning.estimate` predicts a step's peak before any real step. Memory a kernel allocates
for itself without a tensor (a convolution's workspace) is not seen unless ``workspaces`` measures it
(:mod:`lit_compute.memory.workspaces`, as the estimate does).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from lit_compute import _compat
from lit_compute._compat import TorchDispatchMode, tree_leaves
from lit_compute.memory.fake_shapes import fake_fallback

__all__ = ["PARTS", "MemoryBreakdown", "StorageTracker"]

PARTS = ("parameters", "gradients", "optimizer", "activations", "other")


@dataclass
class MemoryBreakdown:
    """The peak of a run in bytes and its parts (each storage counted once, in one part).

    Attributes:
        peak: Bytes live at the peak (the sum of the parts).
        parts: ``{part: bytes}`` for every part of :data:`PARTS`.
        at: Where the peak was: ``"forward"``, ``"backward"``, ``"optimizer"`` or the label given to
            :meth:`StorageTracker.phase`.
        baseline: Bytes live when tracking began (parameters, gradients and optimizer state kept between steps).
    """

    peak: int = 0
    parts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PARTS, 0))
    at: str = ""
    baseline: int = 0
    reserved: int | None = None  # a CUDA caching allocator's reserved peak, where modelled

    def as_dict(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak, **{f"{p}_bytes": self.parts[p] for p in PARTS}, "at": self.at}


def _has_dtensor(args: Any, kwargs: Any) -> bool:
    import sys

    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return dtensor is not None and any(isinstance(t, dtensor) for t in tree_leaves((args, kwargs)))


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    t = _compat.held_tensor(t)  # a DTensor holds its local shard
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse and nested layouts have no single storage
        return None


class _ResizeWatch:
    """``UntypedStorage.resize_`` patched once for every tracker inside it, whatever order they leave in: FSDP2 frees
    a gathered parameter by resizing its storage to 0 bytes and gathers into it again, which no dispatch mode sees.
    The method is put back as it was when the last tracker leaves (trackers that each patched over the one before
    and restored what they found left a stale patch behind when an outer one left first)."""

    def __init__(self) -> None:
        self.trackers: list[StorageTracker] = []
        self._own: tuple[Any] | None = None  # the class's own resize_ (None: inherited) before the first tracker

    def add(self, tracker: StorageTracker) -> None:
        if not self.trackers:
            resize = torch.UntypedStorage.resize_
            watch = self

            def tracked_resize(st: torch.UntypedStorage, size: int) -> Any:
                out = resize(st, size)
                for each in list(watch.trackers):
                    each._resized(st)
                return out

            self._own = (torch.UntypedStorage.__dict__.get("resize_"),)
            setattr(torch.UntypedStorage, "resize_", tracked_resize)  # noqa: B010 - put back by remove()
        self.trackers.append(tracker)

    def remove(self, tracker: StorageTracker) -> None:
        self.trackers = [t for t in self.trackers if t is not tracker]
        if self.trackers or self._own is None:
            return
        (own,) = self._own
        self._own = None
        if own is None:
            delattr(torch.UntypedStorage, "resize_")  # the inherited method again
        else:
            setattr(torch.UntypedStorage, "resize_", own)  # noqa: B010 - what was there before


#: the one patch of ``UntypedStorage.resize_`` every tracker inside it shares
_RESIZES = _ResizeWatch()


class StorageTracker(TorchDispatchMode):
    """Track every storage ops allocate while the mode is on (see the module docstring).

    Example:
        >>> model = torch.nn.Linear(64, 64)
        >>> tracker = StorageTracker()
        >>> tracker.register(model.parameters(), "parameters")
        >>> with tracker:
        ...     model(torch.randn(8, 64)).sum().backward()
        >>> tracker.breakdown(gradients=[p.grad for p in model.parameters()]).parts["gradients"]
        16640
    """

    def __init__(self, workspaces: Any = None) -> None:
        """``workspaces``: ``workspaces(func, args, kwargs)`` -> bytes the op allocates for itself beyond its outputs
        (:class:`~lit_compute.memory.workspaces.KernelWorkspaces`), counted as ``other`` while the op runs."""
        super().__init__()
        self.workspaces = workspaces
        self._log: list[tuple[int, int]] = []  # (+record or -record - 1, ...) as (kind, record) pairs
        self._records: list[list[Any]] = []  # [nbytes, phase, storage weakref]
        self._live: dict[int, int] = {}  # id(storage) -> record
        self._saved: set[int] = set()  # records autograd saved for backward
        self._fixed: dict[int, str] = {}  # record -> part, for registered storages
        self._phase = "forward"
        self._current = 0  # bytes live now
        self._hooks: Any = None
        self._watched = False  # inside :data:`_RESIZES` (between enter and exit)
        self._in_dtensor = False

    # -- recording ----------------------------------------------------------------------------------
    def _note(self, st: torch.UntypedStorage, part: str | None = None, nbytes: int = 0) -> int:
        """The record of ``st``, made when it is new: its bytes (at least ``nbytes``: what a buffer holds that its
        fake kernel returned empty), live until the storage is freed."""
        key = id(st)
        record = self._live.get(key)
        if record is not None:
            if part is not None:
                self._fixed.setdefault(record, part)
            return record
        record = len(self._records)
        self._records.append([max(int(st.nbytes()), nbytes), self._phase, None])
        try:  # noqa: SIM105 - once per saved tensor: a try is free, a context manager is not
            self._records[record][2] = weakref.ref(st, functools.partial(self._on_freed, key, record))
        except TypeError:  # not weak-referenceable: counted as live until the end
            pass
        self._live[key] = record
        self._log.append((1, record))
        self._current += self._records[record][0]
        if part is not None:
            self._fixed[record] = part
        return record

    def _on_freed(self, key: int, record: int, _ref: Any) -> None:
        self._free(key, record)

    def _free(self, key: int, record: int) -> None:
        if self._live.get(key) == record:
            del self._live[key]
            self._log.append((-1, record))
            self._current -= self._records[record][0]

    def register(self, tensors: Iterable[Any], part: str) -> None:
        """Count storages that exist before tracking (parameters, buffers, kept gradients, optimizer state) in
        ``part``; they are live from the start."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                st = _storage(t)
                if st is not None:
                    self._note(st, part)

    def register_bytes(self, nbytes: int, part: str) -> None:
        """Count ``nbytes`` that no tensor of the step shows (DDP's gradient buckets) in ``part``, live from the
        start."""
        if nbytes > 0:
            record = len(self._records)
            self._records.append([int(nbytes), self._phase, None])
            self._log.append((1, record))
            self._current += int(nbytes)
            self._fixed[record] = part

    def phase(self, label: str) -> None:
        """Label what runs from now on (``"backward"``, ``"optimizer"``): the peak says where it happened."""
        self._phase = label

    def _resized(self, st: torch.UntypedStorage) -> None:
        """``st`` was resized in place (FSDP2 frees a gathered parameter's storage by resizing it to 0 bytes and
        gathers into it again later): its old size is freed, its new size allocated, in the same part."""
        key = id(st)
        old = self._live.get(key)
        if old is not None:
            self._free(key, old)
        if st.nbytes() > 0:
            record = self._note(st, self._fixed.get(old) if old is not None else None)
            if old in self._saved:
                self._saved.add(record)

    def __enter__(self) -> StorageTracker:
        tracker = self
        _RESIZES.add(self)
        self._watched = True

        def pack(t: torch.Tensor) -> torch.Tensor:
            st = _storage(t) if isinstance(t, torch.Tensor) else None
            if st is not None:
                tracker._saved.add(tracker._note(st))
            return t

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            if self._watched:
                _RESIZES.remove(self)
                self._watched = False
            if self._hooks is not None:
                self._hooks.__exit__(*exc)
                self._hooks = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _has_dtensor(args, kwargs):  # DTensor runs it on the local shards: through this mode, so they are seen
            if self._in_dtensor:
                return NotImplemented
            self._in_dtensor = True
            try:
                with self:
                    return func(*args, **kwargs)
            finally:
                self._in_dtensor = False
        out = fake_fallback(func, args, kwargs)  # on fake tensors, an op whose meta kernel is stricter than the CPU's
        if out is None:
            out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = _storage(t)
                if st is not None and st.nbytes() > 0:
                    self._note(st)
        if self.workspaces is not None:
            for t, nbytes in getattr(self.workspaces, "held", lambda *a: [])(func, args, kwargs, out):
                st = _storage(t)
                if st is not None:
                    self._note(st, nbytes=nbytes)
            self._transient(self.workspaces(func, args, kwargs))
        return out

    def _transient(self, nbytes: int) -> None:
        """``nbytes`` allocated beside the op's outputs and freed as it returns (a kernel's workspace)."""
        if nbytes > 0:
            record = len(self._records)
            self._records.append([int(nbytes), self._phase, None])
            self._log.append((1, record))
            self._log.append((-1, record))

    # -- reading ------------------------------------------------------------------------------------
    @property
    def current(self) -> int:
        """Bytes live now (storages tracked and alive, registered bytes included)."""
        return self._current

    def _walk(self) -> Iterator[tuple[int, int]]:
        """(log index, bytes live after it) through the log."""
        live = 0
        for i, (kind, record) in enumerate(self._log):
            live += kind * self._records[record][0]
            yield i, live

    def events(self) -> Iterator[tuple[int, int, int]]:
        """The log as ``(kind, record, nbytes)``: kind +1 an allocation, -1 a free, in order."""
        for kind, record in self._log:
            yield kind, record, self._records[record][0]

    def breakdown(self, gradients: Iterable[Any] = (), optimizer: Iterable[Any] = ()) -> MemoryBreakdown:
        """The peak and its parts. ``gradients`` and ``optimizer`` are the tensors that are gradients and optimizer
        state *now* (after the run); storages registered with a part keep it."""
        parts: dict[int, str] = dict(self._fixed)
        for part, tensors in (("gradients", gradients), ("optimizer", optimizer)):
            for t in tensors:
                st = _storage(t) if isinstance(t, torch.Tensor) else None
                record = self._live.get(id(st)) if st is not None else None
                if record is not None:
                    parts.setdefault(record, part)
        peak_at, peak = -1, 0
        baseline = sum(self._records[r][0] for r in self._fixed)  # registered: live from the start
        for i, live in self._walk():
            if live > peak:
                peak_at, peak = i, live
        result = MemoryBreakdown(baseline=baseline)
        if peak_at < 0:
            return result
        live_records: set[int] = set()
        for kind, record in self._log[: peak_at + 1]:
            if kind > 0:
                live_records.add(record)
            else:
                live_records.discard(record)
        for record in live_records:
            part = parts.get(record) or ("activations" if record in self._saved else "other")
            result.parts[part] += self._records[record][0]
        result.peak = sum(result.parts.values())
        result.at = self._records[self._log[peak_at][1]][1]
        return result
