"""FlopsLogger's once-per-count outputs, written on rank 0: the per-module table with the forward GFLOPs per sample
(scalar, hparam and a log line), and the op-class table ``lit-compute whatif`` reads back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lit_compute import _compat
from lit_compute.flops.counting import FlopCount
from lit_compute.flops.tables import module_table, op_class_figures, op_class_table
from lit_compute.formatting import human
from lit_compute.writer import log_scalars, log_text, save_hparam, say, write_run_record

if TYPE_CHECKING:
    import lightning.pytorch as pl


def per_sample_flops(trainer: pl.Trainer | Any, flops: float, samples: int) -> float:
    """FLOPs per sample from this device's FLOPs: tensor-parallel peers each execute their shards of the same samples
    (and, each of them, the work they all repeat), so the group's per-sample figure is the device's times the group's
    size."""
    return flops * _compat.parallel_layout(trainer).tensor_parallel / samples


def write_module_table(trainer: pl.Trainer, count: FlopCount, depth: int, samples: int | None) -> None:
    """``compute/flops_by_module`` and ``compute/forward_gflops_per_sample`` (also an hparam: without an
    ``example_input_array`` it is known only now), at step 0."""
    peers = _compat.parallel_layout(trainer).tensor_parallel
    share = f", this device's share of {peers} tensor-parallel devices" if peers > 1 else ""
    log_text(trainer, "compute/flops_by_module", module_table(count, depth, samples, share), step=0)
    if samples:
        per_sample = per_sample_flops(trainer, count.forward, samples) / 1e9
        log_scalars(trainer, {"compute/forward_gflops_per_sample": per_sample}, step=0)
        save_hparam(trainer, "compute/forward_gflops_per_sample", per_sample)
        say(
            trainer,
            f"FlopsLogger: forward {human(per_sample, 4)} GFLOPs per sample, {human(count.total / 1e9, 4)} "
            "GFLOPs per training batch (forward + backward, model FLOPs)",
        )


def write_op_classes(trainer: pl.Trainer, count: FlopCount, sig: tuple) -> None:
    """A counted training batch's FLOPs and bytes by op class: the table for people (``compute/op_classes``, at the
    step it ran in) and the figures with the run's facts in the run's record (what ``lit-compute whatif`` prices)."""
    samples = next((s[0] for _, s, _ in sig[1] if s), None)
    log_text(trainer, "compute/op_classes", op_class_table(count, samples), step=_compat.batches_that_stepped(trainer))
    write_run_record(trainer, op_class_figures(count, samples, _compat.op_class_facts(trainer)))
