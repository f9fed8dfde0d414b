"""Memory a kernel allocates for itself, without a tensor: measured once per op shape, then added to a trace.

A convolution on a CPU (oneDNN) reorders its output and gradients through buffers as large as them; on a GPU cuDNN
takes the workspace of the algorithm it picks. No tensor holds these buffers, so
:class:`~lit_compute.memory.StorageTracker` cannot see them, yet they are in the step's peak (a 3-conv CNN at 64 px
was 25% over its tensors' bytes on a CPU). :class:`KernelWorkspaces` measures them: for each convolution shape a
trace meets (forward and backward), it runs the op once for real on the trace's device at the traced micro-batch
(within a memory budget; beyond it, at two smaller sizes and along the line through them) and takes how much more
than its outputs the allocator held at the op's peak. A CPU is measured with the profiler's allocator events, a GPU
with the caching allocator's peak. A device that is not here (a GPU config estimated on a
CPU machine) is not measured: :attr:`KernelWorkspaces.unmeasured` names it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lit_compute import _compat
from lit_compute._compat import tree_leaves

__all__ = ["HELD", "PROBED", "KernelWorkspaces", "blas_workspaces"]

aten = torch.ops.aten

#: op -> {position of an argument whose size follows the batch: its batch dimension}
PROBED: dict[Any, dict[int, int]] = {
    aten.convolution.default: {0: 0},
    aten.convolution_backward.default: {0: 0, 1: 0},
}
#: oneDNN's LSTM layer (CPU): its forward's scratch beyond its outputs, and its backward's (measured with the forward's
#: workspace made at the same batch, :func:`_rnn_backward_scratch`)
PROBED[aten.mkldnn_rnn_layer.default] = {0: 1, 5: 0, 6: 0}
PROBED[aten.mkldnn_rnn_layer_backward.default] = {0: 1, 5: 0, 6: 0, 7: 1, 8: 0, 9: 0, 10: 1}
#: ops whose output at a position holds a buffer that the op's fake (meta) kernel returns empty: oneDNN's recurrent
#: workspace (an LSTM layer's gates and states, kept for its backward), with the op's batched arguments (the input is
#: time-major: its batch is dimension 1; the initial states' dimension 0)
HELD: dict[Any, tuple[int, dict[int, int]]] = {
    aten.mkldnn_rnn_layer.default: (3, {0: 1, 5: 0, 6: 0}),
}


def _cpu_peak_above_outputs(run: Callable[[], Any]) -> int:
    """Bytes the CPU allocator held at ``run``'s peak beyond what ``run`` returned (its profiler memory events)."""
    from torch.profiler import ProfilerActivity, profile

    allocation = _compat.profiler_allocation_kind()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = run()
    changes = []
    for root in prof.profiler.kineto_results.experimental_event_tree():
        stack = [root]
        while stack:
            event = stack.pop()
            stack.extend(event.children)
            if event.typed[0] == allocation and event.typed[1].device.type == "cpu":
                changes.append((event.start_time_ns, int(event.typed[1].alloc_size), int(event.typed[1].ptr)))
    live = peak = 0
    allocated: set[int] = set()  # a free counts only for a block allocated here (the allocator reports frees of
    for _, change, ptr in sorted(changes, key=lambda c: c[0]):  # blocks from earlier profiles, at stale sizes)
        if change > 0:
            allocated.add(ptr)
        elif ptr in allocated:
            allocated.discard(ptr)
        else:
            continue
        live += change
        peak = max(peak, live)
    kept = sum(t.untyped_storage().nbytes() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
    return max(0, peak - kept)


def _cuda_peak_above_outputs(run: Callable[[], Any], device: torch.device) -> int:
    """Bytes the caching allocator held at ``run``'s peak beyond what it held before and what ``run`` returned."""
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
    that is not in :data:`PROBED`), measured as the module docstring says and kept per shape.

    Args:
        budget: The most bytes one measurement's real tensors may take (default: a tenth of this machine's free
            memory, at most 1 GB). Within it the op runs at the traced micro-batch itself; beyond it, at the two
            largest halvings that fit, and the workspace is the line through them (kernels pick other algorithms at
            very small batches: a line through micro-batch 1 and 2 missed ResNet-50's by 4x).
    """

    def __init__(self, budget: int | None = None) -> None:
        self.budget = budget
        self._measured: dict[tuple, int] = {}
        self.unmeasured: set[str] = set()  # device types that are not here
        self.failed: list[str] = []  # ops whose measurement failed (counted as 0)

    def _budget(self) -> int:
        if self.budget is None:
            import psutil

            self.budget = min(10**9, psutil.virtual_memory().available // 10)
        return self.budget

    def __call__(self, func: Any, args: tuple, kwargs: dict) -> int:
        batched = PROBED.get(func)
        if batched is None:
            return 0
        measure = _rnn_backward_scratch if func == aten.mkldnn_rnn_layer_backward.default else self._measure
        return self._by_batch(func, args, kwargs, batched, measure)

    def held(self, func: Any, args: tuple, kwargs: dict, out: Any) -> list[tuple[torch.Tensor, int]]:
        """``(output, bytes)`` for an output of ``func`` that holds a buffer its fake kernel returned empty
        (:data:`HELD`: oneDNN's LSTM workspace), measured by running the op for real at these shapes (the line through
        two smaller batches beyond the budget); nothing for a real output, which holds its own bytes."""
        found = HELD.get(func)
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        if found is None or len(outputs) <= found[0]:
            return []
        position, batched = found
        held = outputs[position]
        if not isinstance(held, torch.Tensor) or held.untyped_storage().nbytes() > 0:
            return []

        def measure(func: Any, args: tuple, kwargs: dict, batched: dict[int, int], n: int, device: torch.device) -> int:
            with _compat.disable_dispatch_modes(), torch.enable_grad():
                real = [_real(a, n if i in batched else None, device, batched.get(i, 0)) for i, a in enumerate(args)]
                made = func(*real, **kwargs)
                return int(made[position].untyped_storage().nbytes()) if made[position] is not None else 0

        nbytes = self._by_batch(func, args, kwargs, batched, measure)
        return [(held, nbytes)] if nbytes > 0 else []

    def _by_batch(
        self,
        func: Any,
        args: tuple,
        kwargs: dict,
        batched: dict[int, int],
        measure: Callable[[Any, tuple, dict, dict[int, int], int, torch.device], int],
    ) -> int:
        """``measure`` at the traced batch, or along the line through the two largest powers of two within the
        budget; 0 (and said in :attr:`failed`) when it cannot run; 0 on a device that is not here."""
        index, dim = next(iter(batched.items()))
        first = args[index]
        if not isinstance(first, torch.Tensor) or first.dim() <= dim or first.shape[dim] < 1:
            return 0
        device = first.device
        if device.type not in ("cpu", "cuda") or (device.type == "cuda" and not torch.cuda.is_available()):
            self.unmeasured.add(device.type)
            return 0
        key = (
            func,
            device.type,
            tuple(_signature(a, batched.get(i)) for i, a in enumerate(args)),
            tuple(sorted((k, repr(v)) for k, v in kwargs.items())),
        )
        n = int(first.shape[dim])
        per_sample = sum(
            _nbytes(a) // max(1, int(a.shape[batched[i]]))
            for i, a in enumerate(args)
            if i in batched and isinstance(a, torch.Tensor)
        )
        fixed = sum(_nbytes(a) for i, a in enumerate(args) if i not in batched and isinstance(a, torch.Tensor))
        largest = max(1, (self._budget() // 2 - fixed) // max(1, per_sample))  # inputs and about as much output

        def at(size: int) -> int:
            if (key, size) not in self._measured:
                self._measured[(key, size)] = measure(func, args, kwargs, batched, size, device)
            return self._measured[(key, size)]

        try:
            if n <= largest:
                return at(n)
            m = 1 << (largest.bit_length() - 1)  # the two largest powers of two that fit: the line through them
            if m < 2:
                return 0
            low, high = at(m // 2), at(m)
            return max(0, int(high + (high - low) / (m - m // 2) * (n - m)))
        except Exception as err:  # noqa: BLE001 - a measurement that cannot run counts nothing, and says so
            self.failed.append(f"{func}: {type(err).__name__}")
            return 0

    def _measure(
        self, func: Any, args: tuple, kwargs: dict, batched: dict[int, int], n: int, device: torch.device
    ) -> int:
        # real tensors, outside the trace's fake and tracking modes
        with _compat.disable_dispatch_modes(), torch.no_grad():
            real = [_real(a, n if i in batched else None, device, batched.get(i, 0)) for i, a in enumerate(args)]

            def run() -> Any:
                return func(*real, **kwargs)

            run()  # the first call may set up kernels (oneDNN primitives, cuDNN's search)
            if device.type == "cuda":
                return _cuda_peak_above_outputs(run, device)
            return _cpu_peak_above_outputs(run)


def _rnn_backward_scratch(
    func: Any, args: tuple, kwargs: dict, batched: dict[int, int], n: int, device: torch.device
) -> int:
    """oneDNN's LSTM backward at batch ``n``: what it holds beyond its outputs. Its workspace argument is its
    forward's, made here by running that forward at ``n`` on the same arguments (a buffer of any other size would be
    read past its end); the states and the output are the forward's too."""
    with _compat.disable_dispatch_modes(), torch.no_grad():
        real = [_real(a, n if i in batched else None, device, batched.get(i, 0)) for i, a in enumerate(args)]
        # the forward's arguments, from the backward's: the inputs and states, then reverse, batch_sizes, mode,
        # hidden_size, num_layers, has_biases, bidirectional, batch_first, train
        forward = [*real[:7], *(real[i] for i in (13, 20, 14, 15, 16, 17, 19, 21, 18))]
        real[7], real[8], real[9], real[22] = aten.mkldnn_rnn_layer.default(*forward)

        def run() -> Any:
            return func(*real, **kwargs)

        run()
        return _cpu_peak_above_outputs(run)


def _nbytes(a: Any) -> int:
    return a.numel() * a.element_size() if isinstance(a, torch.Tensor) else 0


def _signature(a: Any, dim: int | None) -> Any:
    """An argument as a cache key: a tensor's shape without its batch dimension ``dim`` (None: not batched)."""
    if isinstance(a, torch.Tensor):
        shape = tuple(s for d, s in enumerate(a.shape) if d != dim)
        return ("tensor", shape, a.dtype, a.is_contiguous(memory_format=torch.channels_last) and a.dim() == 4)
    if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
        return tuple(_signature(x, None) for x in a)
    return repr(a)


def _real(a: Any, n: int | None, device: torch.device, dim: int = 0) -> Any:
    """A real tensor shaped as ``a`` (its batch dimension ``dim`` ``n`` long when given), in its memory format; a
    list of tensors (an RNN's weights) each made real; other values as they are."""
    if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
        return type(a)(_real(x, None, device) for x in a)
    if not isinstance(a, torch.Tensor):
        return a
    shape = tuple(n if d == dim and n is not None else s for d, s in enumerate(a.shape))
    fmt = (
        torch.channels_last
        if a.dim() == 4 and a.is_contiguous(memory_format=torch.channels_last) and not a.is_contiguous()
        else torch.contiguous_format
    )
    return torch.zeros(shape, dtype=a.dtype, device=device).contiguous(memory_format=fmt)


def blas_workspaces(device: torch.device) -> int | None:
    """Bytes the caching allocator keeps for cuBLAS and cuBLASLt workspaces once a training step has run matmuls
    on ``device`` (one per handle and stream: the forward's thread and autograd's backward thread each have a handle),
    measured by running float32 and bfloat16 matmuls forward and backward after clearing them; ``None`` when
    ``device`` is not a CUDA device that is here."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    from lit_compute.memory.caching_allocator import round_size

    with _compat.disable_dispatch_modes():
        torch.cuda.synchronize(device)
        _compat.clear_cublas_workspaces()
        before = torch.cuda.memory_allocated(device)
        kept = 0
        dtypes = [torch.float32] + ([torch.bfloat16] if torch.cuda.is_bf16_supported() else [])
        tensors = []
        for dtype in dtypes:
            a = torch.randn(256, 256, device=device, dtype=dtype, requires_grad=True)
            bias = torch.zeros(256, device=device, dtype=dtype, requires_grad=True)
            ((a @ a).sum() + torch.nn.functional.linear(a, a, bias).sum()).backward()
            tensors += [a, a.grad, bias, bias.grad]
        torch.cuda.synchronize(device)
        kept = sum(round_size(t.untyped_storage().nbytes()) for t in tensors if t is not None)
        held = torch.cuda.memory_allocated(device) - before - kept
        del tensors
    return max(0, int(held))
