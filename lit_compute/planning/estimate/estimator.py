""":func:`estimate`: the config's pieces built, each micro-batch traced (each rank of a model-parallel layout), the
largest that fits searched, the blocks to recompute named."""

from __future__ import annotations

from pathlib import Path

from lit_compute import _compat
from lit_compute.formatting import first_line, typed_line
from lit_compute.memory.tracker import MemoryBreakdown
from lit_compute.planning.capacity import capacity_of
from lit_compute.planning.checkpoint_advice import checkpoint_candidates
from lit_compute.planning.estimate import trace
from lit_compute.planning.estimate.pieces import build, resized
from lit_compute.planning.estimate.plan import EstimateError, EstimateRow, Plan, gb, row
from lit_compute.planning.estimate.search import TooLarge, affordable, device_notes, fit_plan, out_of_memory
from lit_compute.planning.estimate.trace import bucket_bytes, predict_peak, prepare, shard, untraceable_module


def estimate(
    config: str | Path,
    micro_batches: list[int] | None = None,
    device: str | None = None,
    memory: str | float | None = None,
    overrides: list[str] | None = None,
    checkpoint_advice: bool = True,
) -> Plan:
    """Predict the peak memory per device of one training step of ``config`` at each micro-batch size.

    Under Lightning's ``ModelParallelStrategy`` (FSDP2, tensor parallelism) each rank is simulated in this process
    with a fake process group (every collective returns at once): the model is built, the module's
    ``configure_model`` shards it over the same mesh, and the rank's step is traced with its local shards and the
    buffers its collectives allocate; a row per rank.

    Args:
        config: A ``lit-compute fit`` YAML.
        micro_batches: Sizes to predict (default: the config's batch size, half and twice it).
        device: A device name of :data:`~lit_compute.hardware.CHIPS` (a table key or a device name) whose capacity to
            fit into.
        memory: A capacity (``"80GB"``, ``"24GiB"`` or bytes); overrides ``device``.
        overrides: More ``lit-compute fit`` arguments (``--trainer.precision=bf16-mixed``).
        checkpoint_advice: Name the blocks to recompute when a size does not fit.

    Returns:
        A :class:`Plan`: a row per size (and rank), the largest size that fits, the blocks to checkpoint.

    Raises:
        EstimateError: a bad argument, an unknown device, a config whose batch has no batch dimension.
    """
    capacity, source = capacity_of(device, memory)
    overrides = list(overrides or [])
    pieces = build(config, overrides)
    sizes = sorted(set(micro_batches or [max(1, pieces.batch_size // 2), pieces.batch_size, 2 * pieces.batch_size]))
    if any(s < 1 for s in sizes):
        raise EstimateError(f"--micro-batch {','.join(map(str, sizes))}: sizes must be >= 1")
    layout = _compat.model_parallel_sizes(pieces.trainer.strategy)
    if layout is not None:
        return estimate_ranks(config, overrides, sizes, layout, capacity, source)
    optimizers = prepare(pieces)
    buckets = bucket_bytes(pieces)
    notes = [pieces.built] if pieces.built else []
    if buckets:
        notes.append(f"DDP: each rank holds the whole model and {buckets / 1e9:.3g} GB of gradient buckets")
    traced: dict[int, MemoryBreakdown] = {}
    method = ["traced on fake tensors"]

    def peak_at(size: int) -> MemoryBreakdown:
        if size not in traced:
            if method[0] == "traced on fake tensors":
                try:
                    traced[size] = predict_peak(pieces, optimizers, size, buckets)
                    return traced[size]
                except EstimateError:
                    raise
                except Exception as err:  # noqa: BLE001 - data-dependent shapes, custom ops: measure instead
                    where = untraceable_module(err, pieces.model)
                    if traced:  # other sizes traced: this size's own failure, never a real step of it
                        raise EstimateError(
                            f"tracing micro-batch {size} failed in {where} ({type(err).__name__}: "
                            f"{str(err).strip()[:200]})"
                        ) from None
                    notes.append(
                        f"the model cannot be traced on fake tensors ({where}: {type(err).__name__}: "
                        f"{first_line(err, 200)}); each size is measured on a real step instead"
                    )
                    method[0] = "measured on a real step"
            if size > pieces.batch_size and pieces.batch_size not in traced:
                peak_at(pieces.batch_size)  # the config's own batch first: fit trains it, and it gives a scale
            affordable(size, traced)
            try:
                traced[size] = trace.measure(config, overrides, size, buckets)
            except Exception as err:  # noqa: BLE001 - the user's step itself fails: say so in one line
                if traced and out_of_memory(err):  # the search ends at the last size that ran, and says so
                    why = f"a real step of it ran out of memory here ({typed_line(err)[:200]})"
                    raise TooLarge(size, why) from None
                raise EstimateError(
                    f"a real training step of micro-batch {size} failed too ({typed_line(err)[:250]}"
                    f"); `lit-compute fit --config {config}` must train first"
                ) from None
        return traced[size]

    try:
        rows = [row(size, peak_at(size), capacity, method[0]) for size in sizes]
    except TooLarge as err:
        raise EstimateError(f"micro-batch {err.size} is not measured: {err.why}") from None
    plan = Plan(rows=rows, capacity_bytes=capacity, capacity_source=source, notes=notes)
    plan.notes += device_notes(pieces)
    fit_plan(plan, peak_at, capacity)
    if (
        capacity is not None
        and checkpoint_advice
        and any(r.fits is False for r in rows)
        and method[0] == "traced on fake tensors"
        and not plan.checkpointing_useless
    ):
        biggest = max((r for r in rows if r.fits is False), key=lambda r: r.micro_batch)
        batch = resized(pieces.batch, pieces.batch_size, biggest.micro_batch, pieces.fake_mode)
        plan.checkpointing = checkpoint_candidates(
            pieces.model, batch, pieces.fake_mode, pieces.trainer.precision_plugin.forward_context
        )
    return plan


def estimate_ranks(
    config: str | Path,
    overrides: list[str],
    sizes: list[int],
    layout: tuple[int, int],
    capacity: int | None,
    source: str,
) -> Plan:
    """Each rank of a ``ModelParallelStrategy`` job simulated in this process (see :func:`estimate`)."""
    data_parallel, tensor_parallel = layout
    world = data_parallel * tensor_parallel
    ranks = list(range(world)) if world <= 8 else [0, world - 1]
    rows: list[EstimateRow] = []
    first_rank: dict[int, MemoryBreakdown] = {}
    plan = Plan(
        rows=rows,
        capacity_bytes=capacity,
        capacity_source=source,
        notes=[
            f"ModelParallelStrategy: data parallel {data_parallel} x tensor parallel {tensor_parallel}; "
            f"each rank traced with a fake process group (local shards, collective buffers)"
        ],
    )
    for rank in ranks:
        with _compat.simulated_rank(rank, world):
            pieces = build(config, overrides)
            try:
                shard(pieces, data_parallel, tensor_parallel)
                optimizers = prepare(pieces)
                for size in sizes:
                    found = predict_peak(pieces, optimizers, size, 0)
                    rows.append(row(size, found, capacity))
                    rows[-1].rank = rank
                    if rank == ranks[0]:
                        first_rank[size] = found
            except EstimateError:
                raise
            except Exception as err:  # noqa: BLE001 - one line naming where
                raise EstimateError(
                    f"rank {rank} of the {data_parallel} x {tensor_parallel} layout cannot be traced "
                    f"({untraceable_module(err, pieces.model)}: {type(err).__name__}: "
                    f"{str(err).strip()[:200]})"
                ) from None
    if capacity is not None:
        over = [r for r in rows if r.fits is False]
        plan.notes.append(
            f"every rank fits {gb(capacity)}"
            if not over
            else f"ranks {sorted({r.rank for r in over})} do not fit at micro-batch "
            f"{sorted({r.micro_batch for r in over})}"
        )
        # the largest micro-batch that fits every rank: searched on the rank with the largest peak
        largest = max(rows, key=lambda r: (r.micro_batch, r.peak_bytes)).rank
        with _compat.simulated_rank(largest, world):
            pieces = build(config, overrides)
            shard(pieces, data_parallel, tensor_parallel)
            optimizers = prepare(pieces)
            traced: dict[int, MemoryBreakdown] = {}

            def peak_at(size: int) -> MemoryBreakdown:
                if size not in traced:
                    traced[size] = predict_peak(pieces, optimizers, size, 0)
                return traced[size]

            fit_plan(plan, peak_at, capacity)
        if plan.notes[-1].startswith(("largest micro-batch", "every micro-batch", "does not fit")):
            plan.notes[-1] += f" (rank {largest}, the largest)"
    return plan


def predicted_peak(config: str | Path, overrides: list[str] | None = None) -> MemoryBreakdown:
    """The predicted peak of one training step of ``config`` at its own micro-batch, traced on fake tensors only
    (no real step: a model that cannot be traced raises :class:`EstimateError`). ``lit-compute tune
    --device-memory`` asks this before starting a trial."""
    pieces = build(config, list(overrides or []))
    optimizers = prepare(pieces)
    try:
        return predict_peak(pieces, optimizers, pieces.batch_size, bucket_bytes(pieces))
    except EstimateError:
        raise
    except Exception as err:  # noqa: BLE001 - one line naming the module
        raise EstimateError(
            f"cannot be traced on fake tensors ({untraceable_module(err, pieces.model)}: {type(err).__name__})"
        ) from None
