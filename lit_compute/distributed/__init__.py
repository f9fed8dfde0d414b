"""Distributed training on Lightning's DDP: validated NCCL settings, tuned DDP, collective benchmarks."""

from lit_compute.distributed.comm_benchmark import (
    AllReduceResult,
    CollectiveResult,
    CommBenchmark,
    allreduce_sweep,
    collective_sweep,
)
from lit_compute.distributed.nccl_settings import NCCLSettings
from lit_compute.distributed.tuned_ddp import TunedDDPStrategy

__all__ = [
    "AllReduceResult",
    "CollectiveResult",
    "CommBenchmark",
    "NCCLSettings",
    "TunedDDPStrategy",
    "allreduce_sweep",
    "collective_sweep",
]
