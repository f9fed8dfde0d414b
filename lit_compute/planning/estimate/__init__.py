"""``lit-compute estimate`` and :func:`estimate`: will this config fit, with what micro-batch, before any real step.

The config's model is built on fake tensors (``FakeTensorMode``: shapes, dtypes and devices; no memory, no
arithmetic), one real batch is read from its datamodule and reshaped to each micro-batch size, and one whole
training step - ``training_step``, backward, the optimizer's step, under the config's precision plugin - runs
under :class:`~lit_compute.memory.StorageTracker`: the same tracker :class:`~lit_compute.MemoryMonitor` runs on a
real step, so the prediction has the same parts. What no tensor holds is added: each convolution's workspace,
measured once per shape on the device (:mod:`lit_compute.memory.workspaces`), and on CUDA the caching allocator's
rounding, blocks and segments, replayed through its model after the cuBLAS workspaces it keeps
(:mod:`lit_compute.memory.caching_allocator`): the allocated and the reserved peak. The step is traced twice (the first
creates the optimizer's state, as a real run's first step does) and the larger peak is the prediction. Per rank: under
DDP its gradient buckets are added (every rank holds the whole model).

The largest micro-batch that fits ``--memory`` (or the ``--device``'s capacity) is found by tracing: peak memory
grows linearly with the micro-batch, so two traces give the line, and the sizes around its crossing are traced to
confirm. When it does not fit, the blocks whose activations to recompute (``torch.utils.checkpoint``) are named,
largest saving first, each with its recompute cost in hardware FLOPs.

Its modules: :mod:`.plan` (the answer's types), :mod:`.pieces` (the config built on fake tensors), :mod:`.trace` (one
step under the tracker), :mod:`.search` (the largest micro-batch that fits) and :mod:`.estimator` (:func:`estimate`).
"""

from __future__ import annotations

from lit_compute.planning.estimate.estimator import estimate, predicted_peak
from lit_compute.planning.estimate.pieces import build_pieces, fake_tensors, resized
from lit_compute.planning.estimate.plan import EstimateError, EstimateRow, Plan
from lit_compute.planning.estimate.trace import trace_step, untraceable_module

__all__ = [
    "EstimateError",
    "EstimateRow",
    "Plan",
    "build_pieces",
    "estimate",
    "fake_tensors",
    "predicted_peak",
    "resized",
    "trace_step",
    "untraceable_module",
]
