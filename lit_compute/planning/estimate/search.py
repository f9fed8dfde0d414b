"""The largest micro-batch that fits: sizes doubled until one does not, the boundary bisected, each traced once; a
real step never run at a size this machine could not hold; the notes that say what was found."""

from __future__ import annotations

from typing import Any

from lit_compute.memory.tracker import MemoryBreakdown
from lit_compute.planning.estimate.compiled import keeps_weight_copies, runs_compiled
from lit_compute.planning.estimate.pieces import Pieces
from lit_compute.planning.estimate.plan import EstimateRow, Plan, gb, row


class TooLarge(Exception):
    """A real step (the fallback for a model fake tensors cannot run) that this machine could not hold."""

    def __init__(self, size: int, why: str) -> None:
        super().__init__(why)
        self.size, self.why = size, why


def headroom() -> tuple[int, str]:
    """The memory a real step may take in this process, and what sets it: the machine's free memory, the address
    space left under ``RLIMIT_AS`` (``ulimit -v``), or what the process's cgroup (a container's memory limit) has
    left, whichever is least."""
    import psutil

    limits = [(int(psutil.virtual_memory().available), "this machine's free memory")]
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft not in (resource.RLIM_INFINITY, -1):
            used = psutil.Process().memory_info().vms
            limits.append((max(0, int(soft) - int(used)), "the address space left under RLIMIT_AS (ulimit -v)"))
    except (ImportError, OSError, ValueError):  # no resource module (Windows), or no limit to read
        pass
    cgroup = _cgroup_left()
    if cgroup is not None:
        limits.append((cgroup, "what this process's cgroup memory limit leaves"))
    return min(limits)


def _cgroup_left(root: str = "/sys/fs/cgroup", proc: str = "/proc/self/cgroup") -> int | None:
    """Bytes the cgroup (v2) this process runs in may still take (``memory.max - memory.current``); None without a
    limit or a cgroup v2 to read."""
    from pathlib import Path

    try:
        lines = Path(proc).read_text().splitlines()
        path = next(line.split("::", 1)[1] for line in lines if line.startswith("0::"))
        folder = Path(root, path.lstrip("/"))
        limit = (folder / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((folder / "memory.current").read_text().strip()))
    except (OSError, StopIteration, ValueError):
        return None


def out_of_memory(err: BaseException) -> bool:
    """Whether a real step failed allocating: Python's ``MemoryError``, torch's CPU allocator (``DefaultCPUAllocator:
    can't allocate memory``, ``not enough memory``) or CUDA's (``torch.OutOfMemoryError``: out of memory)."""
    text = str(err).lower()
    return isinstance(err, MemoryError) or any(
        words in text for words in ("can't allocate memory", "not enough memory", "out of memory")
    )


def affordable(size: int, measured: dict[int, MemoryBreakdown], share: float = 0.5) -> None:
    """Raise :class:`TooLarge` when a real step of ``size`` would need more than ``share`` of the memory this process
    may take (:func:`headroom`), on the line through the two largest sizes measured so far (a real step is never run
    at a size not known to fit here: an estimate for an 80 GB GPU must not take a laptop's memory)."""
    points = sorted((s, b.peak) for s, b in measured.items())
    if not points or size <= points[-1][0]:
        return
    (s1, b1) = points[-1]
    slope = (b1 - points[-2][1]) / (s1 - points[-2][0]) if len(points) > 1 else b1 / s1
    needed = b1 + max(0.0, slope) * (size - s1)
    free, limit = headroom()
    if needed > share * free:
        raise TooLarge(
            size,
            f"a real step of it would need about {gb(int(needed))}, more than half of {limit} "
            f"({gb(int(free))}); the model cannot be traced on fake tensors, so larger sizes are measured on real "
            "steps only",
        )


#: the largest micro-batch the search for the largest that fits traces (a model whose peak hardly grows with the
#: batch fits at any size a step could be given)
SEARCH_LIMIT = 2**24


def device_notes(pieces: Pieces) -> list[str]:
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
    if runs_compiled(pieces):
        copies = keeps_weight_copies(pieces)
        notes.append(
            "the step runs under torch.compile: traced as the eager step"
            + (
                ", with the channels-last copy of each convolution's weight that inductor's graphs keep"
                if copies
                else ""
            )
            + " (docs/memory.md: what else a compiled graph changes holds less, not more)"
        )
    return notes


def fit_plan(plan: Plan, peak_at: Any, capacity: int | None) -> None:
    """The largest micro-batch that fits, and a note saying so (or why there is none); on CUDA, also the largest
    whose modelled reserved peak fits (the allocator needs whole segments)."""
    if capacity is None:
        return
    if any(r.reserved_bytes is not None for r in plan.rows):

        def reserved_at(size: int) -> MemoryBreakdown:
            found = peak_at(size)
            return MemoryBreakdown(peak=found.reserved or found.peak, parts=found.parts, at=found.at)

        largest, _, _ = largest_fitting(reserved_at, capacity)
        plan.largest_fitting_reserved = largest
        plan.notes.append(
            f"largest micro-batch whose reserved memory fits: {largest}"
            if largest is not None
            else "not even micro-batch 1 fits once the caching allocator's segments are counted"
        )
    plan.largest_fitting, plan.next_size, stopped = largest_fitting(peak_at, capacity)
    if plan.largest_fitting is not None and plan.next_size is not None:
        plan.notes.append(
            f"largest micro-batch that fits: {plan.largest_fitting} (traced: "
            f"{gb(peak_at(plan.largest_fitting).peak)}; {plan.next_size.micro_batch} needs "
            f"{gb(plan.next_size.peak_bytes)})"
        )
    elif plan.largest_fitting is not None and stopped:
        plan.notes.append(
            f"micro-batch {plan.largest_fitting} fits ({gb(peak_at(plan.largest_fitting).peak)}) and is the last size "
            f"that ran here; larger ones are not measured: micro-batch {stopped.size}: {stopped.why}"
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
                f"need {gb(kept)} of {gb(capacity)}; shard them (FSDP2: ModelParallelStrategy), train in "
                "bf16-true, or use an optimizer with less state - recomputing activations cannot help"
            )
            plan.checkpointing_useless = True
        else:
            plan.notes.append(f"does not fit even at micro-batch 1 ({gb(one.peak_bytes)} of {gb(capacity)})")


def largest_fitting(peak_at: Any, capacity: int) -> tuple[int | None, EstimateRow | None, TooLarge | None]:
    """The largest micro-batch whose peak fits ``capacity``, the next size's row, and what stopped the search when
    this machine did (real steps only: :func:`affordable` refused a size, or a real step ran out of memory). The peak
    grows with the micro-batch (not always at once: the optimizer's step can hold it at small sizes), so sizes double
    until one does not fit, then the boundary is bisected; each size is traced once."""
    one = peak_at(1)
    if one.peak > capacity:
        return None, row(1, one, capacity), None
    top = SEARCH_LIMIT
    fits, over = 1, None
    while over is None and fits < top:
        size = min(top, fits * 2)
        try:
            found = peak_at(size)
        except TooLarge as stopped:
            return fits, None, stopped
        if found.peak <= capacity:
            fits = size
        else:
            over = size
    if over is None:
        return fits, None, None
    while over - fits > 1:
        middle = (fits + over) // 2
        if peak_at(middle).peak <= capacity:  # below a size already measured: affordable
            fits = middle
        else:
            over = middle
    return fits, row(over, peak_at(over), capacity), None
