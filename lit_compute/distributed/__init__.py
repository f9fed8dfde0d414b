"""Distributed training on Lightning's DDP: validated NCCL settings, tuned DDP, collective benchmarks."""

from lit_compute.distributed.comm_benchmark import AllReduceResult, CommBenchmark, allreduce_sweep
from lit_compute.distributed.nccl_settings import NCCLSettings
from lit_compute.distributed.tuned_ddp import TunedDDPStrategy

__all__ = ["AllReduceResult", "CommBenchmark", "NCCLSettings", "TunedDDPStrategy", "allreduce_sweep"]
