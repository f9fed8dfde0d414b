"""MemoryMonitor: the peak memory of every training step per device, what it is made of, and the headroom left."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any

import torch
from typing_extensions import override

from lit_compute import _batch, _compat
from lit_compute._compat import tree_leaves
from lit_compute._validate import Check, validated
from lit_compute.callback import MeasuringCallback, guarded
from lit_compute.memory.tracker import PARTS, MemoryBreakdown, StorageTracker
from lit_compute.model_state import ModelState
from lit_compute.timeline import LogEvent, StepRecord

if TYPE_CHECKING:
    import lightning.pytorch as pl

GB = 1e9


def local(t: Any) -> Any:
    """A DTensor's shard on this device (what it holds in memory); any other tensor as it is."""
    return _compat.held_tensor(t)


def state_tensors(pl_module: Any, optimizers: list[Any]) -> dict[str, list[torch.Tensor]]:
    """The tensors a training step keeps between steps, by part: parameters (and buffers), gradients, optimizer
    state; DTensors by their local shards."""
    params = [local(p) for p in pl_module.parameters()] + [local(b) for b in pl_module.buffers()]
    grads = [local(p.grad) for p in pl_module.parameters() if p.grad is not None]
    state = [
        local(t)
        for opt in optimizers
        for s in getattr(opt, "state", {}).values()
        for t in (s.values() if isinstance(s, dict) else ())
        if isinstance(t, torch.Tensor)
    ]
    return {"parameters": params, "gradients": grads, "optimizer": state}


def device_capacity(device: torch.device) -> int | None:
    """Bytes a device holds: a GPU's total memory; for a CPU, the memory of this machine (or of its cgroup)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import psutil

    total = int(psutil.virtual_memory().total)
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


class MemoryMonitor(MeasuringCallback):
    """The peak memory of each training step on this device and its parts: parameters, gradients, optimizer state,
    activations saved for backward, and the rest; the headroom against the device's capacity; the largest rank.

    **How.** On CUDA the caching allocator's peak, reset at each step's start, is the step's total (one reset and
    one read per step: no synchronisation). The parts come from
    :class:`~lit_compute.memory.tracker.StorageTracker`, a dispatch mode that follows every storage the step
    allocates and frees, run over the whole step (every micro-batch, the backward and the optimizer step) the first
    first two times a batch signature (paths, shapes, dtypes) and model state occurs (the first step creates the
    optimizer's state, the second starts with it), the larger kept and reused for later steps like them; tracked
    steps are left out of every time figure. On CUDA whatever the allocator holds beyond the tracked parts is
    ``other``; on a CPU the tracked peak is the total of tensors (a kernel's own workspace, which
    ``lit-compute estimate`` measures, is not in it). Under FSDP2 and tensor parallelism each device's shards at
    their local size (DTensors by their local tensors), gathered parameters and buffers as the collectives
    allocate them. DDP's gradient buckets (allocated at wrap time) count as gradients.

    Logged metrics (each logging step; sizes in GB = 1e9 bytes):
        - ``memory/peak_gb``: this device's largest step peak since the last log.
        - ``memory/parameters_gb``, ``memory/gradients_gb``, ``memory/optimizer_gb``, ``memory/activations_gb``,
          ``memory/other_gb``: what was live at that peak; they sum to ``memory/peak_gb``.
        - ``memory/capacity_gb``: the device's memory (``capacity_gb`` when given); ``memory/headroom_gb``:
          capacity minus peak.
        - ``memory/peak_gb_rank_max``, ``memory/largest_rank`` (more than one rank, from the logging event's one
          all-reduce): the largest peak of any rank and which rank had it.

    Args:
        log_every_n_steps: Log every n steps (default: the trainer's ``log_every_n_steps``).
        capacity_gb: The memory to measure headroom against (default: the device's own; a CPU's: the machine's).

    Example:
        >>> import lightning.pytorch as pl
        >>> trainer = pl.Trainer(callbacks=[MemoryMonitor()], max_steps=1, accelerator="cpu")
    """

    @validated
    def __init__(
        self,
        log_every_n_steps: Annotated[int | None, Check(ge=1)] = None,
        capacity_gb: Annotated[float | None, Check(gt=0, hint="GB of the device")] = None,
    ) -> None:
        super().__init__()
        self.log_every_n_steps = log_every_n_steps
        self.capacity_gb = capacity_gb
        self.reduce_keys = {"train": ("peak",)}
        self.breakdowns: dict[tuple, MemoryBreakdown] = {}
        self._tracked: dict[tuple, tuple[int, bool]] = {}  # structure -> (elements of its largest batch, had state)
        self._tracking_facts: tuple[int, bool] = (0, False)
        self._model_state = ModelState()
        self._reset()

    def _reset(self) -> None:
        self._tracker: StorageTracker | None = None
        self._tracking_key: tuple | None = None  # the step being tracked (the key of its first micro-batch)
        self._step_key: tuple | None = None
        self._step_best: MemoryBreakdown | None = None
        self._window: tuple[int, MemoryBreakdown | None] | None = None  # (peak bytes, its parts) since the last log
        self._capacity: int | None = None
        self._cuda: torch.device | None = None

    @override
    def _setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        world = trainer.world_size
        self.reduce_keys = {"train": ("peak", *(f"peak_{r}" for r in range(world) if world > 1))}

    @override
    def _train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()
        device = trainer.strategy.root_device
        self._cuda = device if device.type == "cuda" else None
        self._capacity = int(self.capacity_gb * GB) if self.capacity_gb else device_capacity(device)

    # -- each batch -----------------------------------------------------------------------------------
    @override
    def _batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        current = self.timeline.current
        first = current is None or current.batches == 0  # the step's first micro-batch
        if first:
            if self._cuda is not None:
                torch.cuda.reset_peak_memory_stats(self._cuda)
            leaves = _batch.signature("train", batch)[1]
            # the model's dtypes and devices too: after model.to(torch.float64) or a device move its memory differs
            self._step_key = (
                tuple((path, dtype) for path, _, dtype in leaves),
                self._model_state.key(pl_module),
                self._model_state.placement(pl_module),
            )
            self._step_best = None
            size = sum(math.prod(shape) for _, shape, _ in leaves)
            with_state = any(getattr(o, "state", None) for o in trainer.optimizers)
            largest = self._tracked.get(self._step_key)
            # the largest batch of a structure sets its peak: track a larger one, and the first again once the
            # optimizer's state exists (its first step allocated it after the forward's peak)
            wanted = largest is None or size > largest[0] or (size == largest[0] and with_state and not largest[1])
            self._tracking_key = self._step_key if wanted else None
            self._tracking_facts = (size, with_state)
        if self._tracking_key is None:
            return
        tracker = StorageTracker()
        for part, tensors in state_tensors(pl_module, trainer.optimizers).items():
            tracker.register(tensors, part)
        tracker.register_bytes(_compat.ddp_bucket_bytes(trainer.strategy.model), "gradients")
        tracker.register(tree_leaves(batch), "other")  # the batch is in memory through the step
        self._tracker = tracker
        # exited at the batch's end mark, innermost first; a tracker whose exit raises turns this callback off
        self.timeline.enter_for_batch(
            tracker,
            on_error=lambda err: self.disable(
                f"the memory tracker failed as it left the step ({type(err).__name__}: {err})"
            ),
        )
        self.timeline.taint("memory_track")

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
        super().on_before_backward(trainer, pl_module, loss)  # the timeline's mark, always
        self._phase("backward")

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        self._phase("optimizer")

    @guarded
    def _phase(self, label: str) -> None:
        if self._tracker is not None:
            self._tracker.phase(label)

    @override
    def _batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, record: StepRecord | None
    ) -> None:
        tracker, self._tracker = self._tracker, None
        if tracker is not None:
            kept = state_tensors(pl_module, trainer.optimizers)
            found = tracker.breakdown(gradients=kept["gradients"], optimizer=kept["optimizer"])
            if self._step_best is None or found.peak > self._step_best.peak:
                self._step_best = found
        if record is None:  # gradients still accumulate: the step goes on
            return
        if self._tracking_key is not None and self._step_best is not None:
            key, found = self._tracking_key, self._step_best
            self._tracked[key] = self._tracking_facts
            if key not in self.breakdowns or found.peak > self.breakdowns[key].peak:
                self.breakdowns[key] = found
        self._tracking_key = None
        parts = self.breakdowns.get(self._step_key) if self._step_key is not None else None
        peak = (
            torch.cuda.max_memory_allocated(self._cuda)
            if self._cuda is not None
            else (parts.peak if parts is not None else None)
        )
        if peak is not None and (self._window is None or peak > self._window[0]):
            self._window = (int(peak), parts)

    # -- the logging event ----------------------------------------------------------------------------
    @override
    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, event: LogEvent) -> None:
        window, self._window = self._window, None
        world, rank = trainer.world_size, trainer.global_rank
        peak = float(window[0]) if window is not None else math.nan
        if window is not None:
            event.log(self.metrics(window[0], window[1]))
        values = {"peak": peak}
        if world > 1:  # this rank's slot holds its peak (NaN when unknown), every other slot 0
            values.update({f"peak_{r}": peak if r == rank else 0.0 for r in range(world)})

        def finish(sums: dict[str, float]) -> dict[str, float]:
            per_rank = [sums.get(f"peak_{r}", math.nan) for r in range(world)]
            known = [(v, r) for r, v in enumerate(per_rank) if math.isfinite(v)]
            if world <= 1 or not known:
                return {}
            largest, which = max(known)
            return {"memory/peak_gb_rank_max": largest / GB, "memory/largest_rank": float(which)}

        event.contribute(self, values, finish)

    def metrics(self, peak: int, parts: MemoryBreakdown | None) -> dict[str, float]:
        """The logged figures of a step peak of ``peak`` bytes whose tracked parts are ``parts`` (the allocator's
        bytes beyond the tracked parts are ``other``: the parts always sum to the peak)."""
        out = {"memory/peak_gb": peak / GB}
        if parts is not None:
            named: dict[str, float] = {p: parts.parts[p] for p in PARTS if p != "other"}
            if sum(named.values()) > peak:  # the allocator's peak below the tracked one: scale to it
                scale = peak / sum(named.values())
                named = {p: v * scale for p, v in named.items()}
            named["other"] = max(0, peak - sum(named.values()))
            out.update({f"memory/{p}_gb": v / GB for p, v in named.items()})
        if self._capacity:
            out.update({"memory/capacity_gb": self._capacity / GB, "memory/headroom_gb": (self._capacity - peak) / GB})
        return out

    @override
    def _teardown(self) -> None:
        self._tracker = None  # its mode leaves the stack at the batch's end mark (or the exception's clean-up)
