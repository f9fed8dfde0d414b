"""``lit_compute.whatif``: the step time, throughput, MFU, memory fit and cost of a measured run on other hardware,
node counts and networks.

The run brings what a FLOP ratio lacks (:class:`RunFacts`, read from its TensorBoard folder): the FLOPs, bytes and
kernels of one training batch by op class (FlopsLogger's ``compute/op_classes``), the step split into data wait
and compute (StepTimeMonitor), the collectives' share and overlap (ProfilerWindow), the measured all-reduce
bandwidth (CommBenchmark) and the memory's parts (MemoryMonitor). A target step is then priced part by part:

- **compute**: per op class, the larger of its FLOPs over the chip's peak and its bytes over the chip's memory
  bandwidth (a roofline), at efficiencies (fractions of those peaks) plus a launch cost per kernel; an op on tensor
  cores also spends its FLOPs' worth of the SMs' own work (addresses, loads, the epilogue) at the chip's SMs x clock,
  in series, which a higher tensor rate per SM does not shorten (:func:`sm_rate`). On the run's own
  hardware the efficiency is *measured*: the one factor that makes the roofline of the run equal its measured
  compute time. Elsewhere it is :data:`DEFAULT_EFFICIENCY` (docs/whatif.md names the results it was set on). The
  micro-batch scales every class but the optimizer's step (and the matmuls' weight traffic), and an accumulated
  step runs every class once a micro-batch but the optimizer's, which steps once; the precision scales
  the bytes (two per value in bf16/fp16) and picks the peak of the compute dtype.
- **input**: the host's work for each batch, which a faster chip does not shorten. A loader in the training process
  (no workers) costs Lightning's fetch (fixed per batch) plus the loader's own cost per batch and per sample, timed
  apart from the run at two batch sizes (:mod:`lit_compute.planning.loader_cost`); a fixed cost is not multiplied
  by the micro-batch. On an accelerator the host fetches the next batch while the device runs the queued kernels,
  so the step is the longer of the two (the output says when the host is the bottleneck); on a CPU they add. A
  loader with workers prefetches, and the rate it fed at when the run waited for it is a ceiling on the throughput.
- **communication**: the gradients' all-reduce (DDP: ``2(N-1)/N`` of the gradient bytes per rank, ring) or FSDP2's
  gathers and reduce-scatter (``(N-1)/N`` of twice the parameters and once the gradients) over the slowest link
  (the chip's own within a node, the network across nodes), less the overlap with compute the run measured (none
  assumed when it measured none).
- **memory**: MemoryMonitor's parts scaled by precision, sharding and micro-batch against the chip's capacity.

The package: :mod:`.facts` (what a run says, what a prediction targets, :class:`OpCost`), :mod:`.calibration` (the
efficiencies and where they came from), :mod:`.parts` (one pure ``price(run, scenario, calibration)`` per effect)
and :mod:`.predict` (their composition). Everything a user imported from ``lit_compute.planning.whatif`` before it
was a package is importable from here still.
"""

from lit_compute.planning.whatif.calibration import (
    CHECKED_FILE,
    DEFAULT_EFFICIENCY,
    TENSOR_CORE_CLASSES,
    Calibration,
    checked_on,
    default_calibration,
    precision_class,
)
from lit_compute.planning.whatif.facts import (
    NO_COST,
    ChannelsFirst,
    OpCost,
    RunFacts,
    Scenario,
    WhatifError,
    read_run,
    with_loader_cost,
)
from lit_compute.planning.whatif.parts.comm import host_contention, messages
from lit_compute.planning.whatif.parts.compute import calibrate, conv_setup_seconds, pays_transposes, sm_rate
from lit_compute.planning.whatif.predict import Prediction, predict

__all__ = [
    "CHECKED_FILE",
    "DEFAULT_EFFICIENCY",
    "NO_COST",
    "TENSOR_CORE_CLASSES",
    "Calibration",
    "ChannelsFirst",
    "OpCost",
    "Prediction",
    "RunFacts",
    "Scenario",
    "WhatifError",
    "calibrate",
    "checked_on",
    "conv_setup_seconds",
    "default_calibration",
    "host_contention",
    "messages",
    "pays_transposes",
    "precision_class",
    "predict",
    "read_run",
    "sm_rate",
    "with_loader_cost",
]
