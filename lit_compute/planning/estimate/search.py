"""The largest micro-batch that fits: sizes doubled until one does not, the boundary bisected, each traced once; a
real step never run at a size this machine could not hold; the notes that say what was found."""

from __future__ import annotations

from typing import Any

from lit_compute.memory.tracker import MemoryBreakdown
from lit_compute.planning.estimate.pieces import Pieces
from lit_compute.planning.estimate.plan import EstimateRow, Plan, gb, row


class TooLarge(Exception):
    """A real step (the fallback for a model fake tensors cannot run) that this machine could not hold."""

    def __init__(self, size: int, why: str) -> None:
        super().__init__(why)
        self.size, self.why = size, why


def affordable(size: int, measured: dict[int, MemoryBreakdown], share: float = 0.5) -> None:
    """Raise :class:`TooLarge` when a real step of ``size`` would need more than ``share`` of this machine's free
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
        raise TooLarge(
            size,
            f"a real step of it would need about {gb(int(needed))}, more than half of this machine's "
            f"free memory ({gb(int(free))}); the model cannot be traced on fake tensors, so larger "
            "sizes are measured on real steps only",
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
    plan.largest_fitting, plan.next_size, limited = largest_fitting(peak_at, capacity)
    if plan.largest_fitting is not None and plan.next_size is not None:
        plan.notes.append(
            f"largest micro-batch that fits: {plan.largest_fitting} (traced: "
            f"{gb(peak_at(plan.largest_fitting).peak)}; {plan.next_size.micro_batch} needs "
            f"{gb(plan.next_size.peak_bytes)})"
        )
    elif plan.largest_fitting is not None and limited:
        plan.notes.append(
            f"micro-batch {plan.largest_fitting} fits ({gb(peak_at(plan.largest_fitting).peak)}); larger "
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
                f"need {gb(kept)} of {gb(capacity)}; shard them (FSDP2: ModelParallelStrategy), train in "
                "bf16-true, or use an optimizer with less state - recomputing activations cannot help"
            )
            plan.checkpointing_useless = True
        else:
            plan.notes.append(f"does not fit even at micro-batch 1 ({gb(one.peak_bytes)} of {gb(capacity)})")


def largest_fitting(peak_at: Any, capacity: int) -> tuple[int | None, EstimateRow | None, bool]:
    """The largest micro-batch whose peak fits ``capacity``, the next size's row, and whether this machine's memory
    stopped the search (real steps only: :func:`affordable`). The peak grows with the micro-batch (not always at
    once: the optimizer's step can hold it at small sizes), so sizes double until one does not fit, then the boundary
    is bisected; each size is traced once."""
    one = peak_at(1)
    if one.peak > capacity:
        return None, row(1, one, capacity), False
    top = SEARCH_LIMIT
    fits, over = 1, None
    while over is None and fits < top:
        size = min(top, fits * 2)
        try:
            found = peak_at(size)
        except TooLarge:
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
    return fits, row(over, peak_at(over), capacity), False
