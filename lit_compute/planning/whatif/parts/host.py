"""The host part: the host's work for each batch that a faster chip does not shorten (a loader in the training
process, Lightning's fetch; the rate a loader with workers fed at as a ceiling) and, on an accelerator, the eager
dispatch of every kernel before the device can run it."""

from __future__ import annotations

from dataclasses import dataclass

from lit_compute.planning.whatif.calibration import Calibration
from lit_compute.planning.whatif.facts import RunFacts, Scenario
from lit_compute.planning.whatif.parts.compute import scaled_classes, step_kernels
from lit_compute.planning.whatif.parts.part import Part

__all__ = ["HostPart", "price"]


@dataclass(frozen=True)
class HostPart(Part):
    """The host's input work per optimizer step (``seconds``, hidden or not), its eager dispatch of the step's
    ``kernels`` (``dispatch_s``), whether the device runs while the host works (``overlaps``: an accelerator target
    other than the run's own chip) and the feed-rate ceiling of a loader with workers (``loader_rate``, samples/s)."""

    dispatch_s: float = 0.0
    kernels: float = 0.0
    overlaps: bool = False
    loader_rate: float | None = None
    measured: bool = False  # the input work comes from the run's measured wait (Lightning's fetch in it)

    @property
    def total_s(self) -> float:
        return self.seconds + self.dispatch_s

    def bottleneck_note(self, device_s: float, dispatch_each_s: float) -> str:
        """What to tell the user when the host is the bottleneck of an accelerator's step of ``device_s``."""
        dispatching = f"{self.dispatch_s * 1e3:.3g} ms dispatching {self.kernels:,.0f} eager kernels"
        parts = [f"{dispatching} ({dispatch_each_s * 1e6:.3g} us each)"] if self.dispatch_s else []
        loading = f"{self.seconds * 1e3:.3g} ms of loading" + (" and Lightning's own work" if self.measured else "")
        parts += [loading] if self.seconds else []
        return (
            f"the host is the bottleneck: {' and '.join(parts)} per step against {device_s * 1e3:.3g} ms on "
            "the device"
            + (
                "; fewer, larger kernels (torch.compile, CUDA graphs, a larger micro-batch) would shorten it"
                if self.dispatch_s > self.seconds
                else ""
            )
        )


def price(run: RunFacts, scenario: Scenario, cal: Calibration, kernels: float | None = None) -> HostPart:
    """The host's share of one optimizer step of ``run`` on ``scenario`` (``cal`` is not needed: the host's work
    comes from the run); ``kernels``: the step's kernels as the compute part counted them (counted here when None)."""
    notes: list[str] = []
    seconds, loader_rate = _host_input(run, scenario, notes)
    # on the run's own chip the measured wait is already the part of the host's work the device did not hide (and
    # its measured compute already holds any wait for the host's dispatch)
    overlaps = scenario.chip.kind != "cpu" and not run.runs_on(scenario.chip)
    # eager mode: the host runs Python, autograd and the dispatcher for every kernel before the device can run it
    if kernels is None:
        kernels = step_kernels(scaled_classes(run, scenario), run.accumulate)
    dispatch = kernels * scenario.host_dispatch_s if overlaps else 0.0
    bound_by = "input" if seconds >= dispatch else "host dispatch"
    measured = run.step_s is not None and run.wait_s is not None  # a run's wait holds Lightning's fetch too
    return HostPart(seconds, bound_by, tuple(notes), dispatch, kernels, overlaps, loader_rate, measured)


def _host_input(run: RunFacts, scenario: Scenario, notes: list[str]) -> tuple[float, float | None]:
    """(seconds of host input work per step, the feed-rate ceiling of a loader with workers or None).

    A loader without workers runs in the training process: the run's measured wait per batch is Lightning's fetch and
    hooks (fixed per batch) plus the loader's own cost, timed apart at two batch sizes (:mod:`loader_cost`): per
    batch and per sample. At the target's micro-batch: the fixed part, the loader's per-batch cost and its per-sample
    cost times the samples. Without the loader's timing the whole wait is priced per batch (a note says so). A loader
    with workers prefetches: when the run waited for it, the rate it fed at is a ceiling. Facts without a measured
    step (a config counted before any run) have only the loader's timing: in the process it is the host's time, with
    workers each worker loads whole batches at that cost, side by side (the ceiling)."""
    if run.wait_s is None or not run.step_s:
        if run.loader is None:
            return 0.0, None
        per_batch = run.loader.at(scenario.micro_batch)
        if run.loader_workers:
            return 0.0, run.loader_workers * scenario.micro_batch / per_batch if per_batch > 0 else None
        return per_batch * max(1, run.accumulate), None
    if run.loader_workers == 0:
        waited = run.wait_s / max(1, run.accumulate)  # per batch
        if run.loader is not None:
            fixed = max(0.0, waited - run.loader.at(run.samples))
            per_batch = fixed + run.loader.at(scenario.micro_batch)
        else:
            per_batch = waited
            if scenario.micro_batch != run.samples:
                notes.append(
                    "the loader's cost per sample is not known (its loader was not timed apart): the run's "
                    "data wait is priced per batch, at any micro-batch"
                )
        return per_batch * run.accumulate, None
    if run.wait_s > 0.05 * run.step_s:
        return 0.0, run.samples_per_step / run.step_s  # the run waited for it: the rate it fed at
    return 0.0, None
