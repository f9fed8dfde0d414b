"""Memory a kernel allocates for itself, without a tensor: measured once per op shape, then added to a trace.

A convolution on a CPU (oneDNN) reorders its output and gradients through buffers as large as them; on a GPU cuDNN
takes the workspace of the algorithm it picks. No tensor holds these buffers, so
:class:`~lit_compute.memory.StorageTracker` cannot see them, yet they are in the step's peak (a 3-conv CNN at 64 px
was 25% over its tensors' bytes on a CPU). :class:`KernelWorkspaces` measures them: for each convolution shape a
trace meets (forward and backward), it runs the op for real on the trace's device at micro-batch 1 and 2 (small
tensors, a few milliseconds) and takes how much more than its outputs the allocator held at the op's peak; the
workspace is then the line through the two, at the traced micro-batch. A CPU is measured with the profiler's
allocator events, a GPU with the caching allocator's peak. A device that is not here (a GPU config estimated on a
CPU machine) is not measured: :attr:`KernelWorkspaces.unmeasured` names it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["PROBED", "KernelWorkspaces"]

aten = torch.ops.aten

#: op -> the positions of its arguments whose first dimension is the batch
PROBED: dict[Any, tuple[int, ...]] = {
    aten.convolution.default: (0,),
    aten.convolution_backward.default: (0, 1),
}


def _cpu_peak_above_outputs(run: Callable[[], Any]) -> int:
    """Bytes the CPU allocator held at ``run``'s peak beyond what ``run`` returned (its profiler memory events)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    from torch.utils._pytree import tree_leaves

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = run()
    changes = []
    for root in prof.profiler.kineto_results.experimental_event_tree():
        stack = [root]
        while stack:
            event = stack.pop()
            stack.extend(event.children)
            if event.typed[0] == _EventType.Allocation and event.typed[1].device.type == "cpu":
                changes.append((event.start_time_ns, int(event.typed[1].alloc_size)))
    live = peak = 0
    for _, change in sorted(changes):
        live += change
        peak = max(peak, live)
    kept = sum(t.untyped_storage().nbytes() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
    return max(0, peak - kept)


def _cuda_peak_above_outputs(run: Callable[[], Any], device: torch.device) -> int:
    """Bytes the caching allocator held at ``run``'s peak beyond what it held before and what ``run`` returned."""
    from torch.utils._pytree import tree_leaves

    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = run()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    kept = sum(t.untyped_storage().nbytes() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
    return max(0, peak - kept)


class KernelWorkspaces:
    """``workspaces(func, args, kwargs)``: the bytes ``func`` allocates beyond its outputs at these shapes (0 for an op
    that is not in :data:`PROBED`), measured as the module docstring says and kept per shape."""

    def __init__(self) -> None:
        self._lines: dict[tuple, tuple[float, float]] = {}
        self.unmeasured: set[str] = set()  # device types that are not here
        self.failed: list[str] = []  # ops whose measurement failed (counted as 0)

    def __call__(self, func: Any, args: tuple, kwargs: dict) -> int:
        batched = PROBED.get(func)
        if batched is None:
            return 0
        first = args[batched[0]]
        if not isinstance(first, torch.Tensor) or first.dim() == 0:
            return 0
        device = first.device
        if device.type not in ("cpu", "cuda") or (device.type == "cuda" and not torch.cuda.is_available()):
            self.unmeasured.add(device.type)
            return 0
        key = (func, device.type, tuple(_signature(a, i in batched) for i, a in enumerate(args)),
               tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
        if key not in self._lines:
            try:
                one, two = (self._measure(func, args, kwargs, batched, n, device) for n in (1, 2))
            except Exception as err:  # noqa: BLE001 - a probe that cannot run counts nothing, and says so
                self.failed.append(f"{func}: {type(err).__name__}")
                one = two = 0
            self._lines[key] = (one - (two - one), two - one)  # workspace(n) = a + b n through n = 1, 2
        a, b = self._lines[key]
        return max(0, int(a + b * first.shape[0]))

    def _measure(self, func: Any, args: tuple, kwargs: dict, batched: tuple[int, ...], n: int,
                 device: torch.device) -> int:
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes(), torch.no_grad():  # real tensors, outside the trace's fake and tracking modes
            real = [_real(a, n if i in batched else None, device) for i, a in enumerate(args)]

            def run() -> Any:
                return func(*real, **kwargs)

            run()  # the first call may set up kernels (oneDNN primitives, cuDNN's search)
            if device.type == "cuda":
                return _cuda_peak_above_outputs(run, device)
            return _cpu_peak_above_outputs(run)


def _signature(a: Any, batched: bool) -> Any:
    if isinstance(a, torch.Tensor):
        shape = tuple(a.shape[1:]) if batched else tuple(a.shape)
        return ("tensor", shape, a.dtype, a.is_contiguous(memory_format=torch.channels_last) and a.dim() == 4)
    return repr(a)


def _real(a: Any, n: int | None, device: torch.device) -> Any:
    """A real tensor shaped as ``a`` (its batch dimension ``n`` when given), in its memory format; other values as
    they are."""
    if not isinstance(a, torch.Tensor):
        return a
    shape = (n, *a.shape[1:]) if n is not None else tuple(a.shape)
    fmt = torch.channels_last if a.dim() == 4 and a.is_contiguous(memory_format=torch.channels_last) and \
        not a.is_contiguous() else torch.contiguous_format
    return torch.zeros(shape, dtype=a.dtype, device=device).contiguous(memory_format=fmt)
