"""Where a rank waits for the others: the host time it spends blocked in ``torch.distributed``'s collectives.

Under tensor parallelism and FSDP2 the collectives run *inside* the forward (FSDP2's all-gathers, the all-reduces
of row-parallel layers), so a slow rank makes the others wait there, and every rank's forward lasts as long as the
slowest one's. Subtracting the time each rank spent blocked in a collective gives its own work back, on every
layout. The blocking points are the ones every layout ends in:

- ``Work.wait`` of ``torch.distributed`` (every collective issued through its Python API waits there, synchronous
  ones included: FSDP2's all-gathers and reduce-scatters, ``self.log(..., sync_dist=True)``, DDP's buffer
  broadcast through ``torch.distributed._broadcast_coalesced``, wrapped too);
- ``wait_tensor`` of ``torch.distributed._functional_collectives`` (DTensor's collectives: tensor parallelism).

While at least one watcher is registered these entry points are wrapped (the class attribute ``Work.wait`` and two
module functions, looked up by their callers at each call); the last watcher to go puts the originals back. Only
calls on the thread that registered a watcher are reported to it (the training loop's thread). DDP's gradient
all-reduce waits inside its C++ reducer and is never seen: under DDP a rank's forward holds no gradient
synchronisation, so nothing is missing there. On NCCL a wait returns on the host once the current stream is made
to wait for the collective: the host sees no waiting. A watcher's clock may return any mark, so the timeline's
records a CUDA event on the current stream at each end as well: under NCCL the span between the two events is the
stream's stall in the collective, the time the device waited for it (and for the other ranks).

Floor 0: imports nothing of lit_compute's.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from collections.abc import Callable
from typing import Any

Watcher = Callable[[Any, Any], None]  # (start, end) marks of the watcher's own clock (seconds, or what it returns)

_lock = threading.Lock()
_watchers: dict[int, tuple[int, Watcher, Callable[[], Any]]] = {}  # id -> (thread id, callback, clock)
_originals: list[tuple[Any, str, Any]] = []
_depth = threading.local()
_handles = itertools.count(1)


def _targets() -> list[tuple[Any, str]]:
    import torch.distributed as dist

    targets: list[tuple[Any, str]] = [(dist.distributed_c10d.Work, "wait")]
    if hasattr(dist, "_broadcast_coalesced"):
        targets.append((dist, "_broadcast_coalesced"))
    try:
        import torch.distributed._functional_collectives as funcol

        targets.append((funcol, "wait_tensor"))
    except ImportError:  # pragma: no cover - a torch without functional collectives
        pass
    return targets


_FAILED = object()


def _read(clock: Callable[[], Any]) -> Any:
    """A watcher's clock read at a wait's start; :data:`_FAILED` when it raised (that watcher skips the call: a clock
    must never break a collective)."""
    try:
        return clock()
    except Exception:  # noqa: BLE001 - a watcher's clock (a CUDA event) failing leaves the collective alone
        return _FAILED


def _timed(original: Any) -> Any:
    import torch

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # traced by torch.compile: the collective itself, nothing of ours
            return original(*args, **kwargs)
        me = threading.get_ident()
        watching = [(cb, clock) for thread, cb, clock in list(_watchers.values()) if thread == me]
        if not watching or getattr(_depth, "inside", False):  # nobody on this thread, or nested in a timed call
            return original(*args, **kwargs)
        starts = [_read(clock) for _, clock in watching]
        _depth.inside = True
        try:
            return original(*args, **kwargs)
        finally:
            _depth.inside = False
            for (cb, clock), start in zip(watching, starts):
                if start is _FAILED:
                    continue
                with contextlib.suppress(Exception):  # a watcher must never break a collective
                    cb(start, clock())

    wrapper.__lit_compute_original__ = original  # type: ignore[attr-defined]
    return wrapper


def watch(callback: Watcher, clock: Callable[[], Any]) -> int:
    """Report ``(start, end)`` (read from ``clock``: seconds, or any mark it returns) of every collective wait on the
    calling thread to ``callback`` until :func:`unwatch` is called with the returned handle. Wraps the entry points
    for the first watcher. A clock or a callback that raises skips its watcher for that call, never the collective."""
    with _lock:
        if not _watchers:
            for owner, name in _targets():
                original = getattr(owner, name)
                _originals.append((owner, name, original))
                setattr(owner, name, _timed(original))
        handle = next(_handles)
        _watchers[handle] = (threading.get_ident(), callback, clock)
        return handle


def unwatch(handle: int | None) -> None:
    """Forget a watcher (nothing when ``handle`` is None or already gone); the last one restores the originals."""
    with _lock:
        if handle is None or _watchers.pop(handle, None) is None or _watchers:
            return
        while _originals:
            owner, name, original = _originals.pop()
            setattr(owner, name, original)


def watching() -> bool:
    """True while any watcher is registered (the entry points are wrapped)."""
    return bool(_watchers)
