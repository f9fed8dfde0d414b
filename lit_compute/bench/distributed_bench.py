"""``lit-compute bench allreduce|ddp --nprocs N``: collective bandwidth and DDP tuning, measured side by side."""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric import Fabric
from torch import nn

from lit_compute.bench._common import StepTimer, emit, machine_line, markdown, median
from lit_compute.distributed.comm_benchmark import allreduce_sweep, default_sizes, results_table


def _accelerator(nprocs: int) -> str:
    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= nprocs else "cpu"


def _sweep(fabric: Fabric, max_mb: float, seconds: float) -> list[Any]:
    import torch.distributed as dist

    results = allreduce_sweep(fabric.device, default_sizes(max_mb), seconds)
    # Tear the group down explicitly: gloo's threads destroyed during interpreter exit can abort the process.
    dist.barrier()
    dist.destroy_process_group()
    return results


def allreduce_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lit-compute bench allreduce", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--nprocs", type=int, default=2, help="processes (gloo on CPU, NCCL on GPUs)")
    parser.add_argument("--max-mb", type=float, default=64.0, help="largest message (MiB)")
    parser.add_argument("--seconds", type=float, default=30.0, help="time budget of the sweep")
    args = parser.parse_args(argv)
    accelerator = _accelerator(args.nprocs)
    backend = "nccl" if accelerator == "cuda" else "gloo"
    fabric = Fabric(accelerator=accelerator, devices=args.nprocs, strategy="ddp_spawn")
    results = fabric.launch(functools.partial(_sweep, max_mb=args.max_mb, seconds=args.seconds))
    emit(
        f"# bench allreduce: {args.nprocs} processes, backend {backend}, float32 sum, busbw = algbw x 2(n-1)/n\n"
        f"# {machine_line()}\n"
    )
    emit(results_table(results))
    return 0


class _ManySmall(pl.LightningModule):
    """Many small parameter tensors: where bucket sizes and hooks matter."""

    def __init__(self, blocks: int = 48, width: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(
            *[nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()) for _ in range(blocks)],
            nn.Linear(width, 10),
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _DumpTimes(StepTimer):
    def __init__(self, path: str) -> None:
        super().__init__(skip=3)
        self.path = path

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_rank == 0:
            Path(self.path).write_text(json.dumps(self.times))


CONFIGS: dict[str, dict[str, Any]] = {
    "default (bucket 25 MiB, no hook)": {},
    "bucket_cap_mb=1": {"bucket_cap_mb": 1},
    "bucket_cap_mb=100": {"bucket_cap_mb": 100},
    "comm_hook=fp16": {"comm_hook": "fp16"},
    "comm_hook=powersgd (rank 1)": {"comm_hook": "powersgd", "powersgd_start_iter": 2},
}


def ddp_main(argv: list[str]) -> int:
    from lit_compute.distributed import TunedDDPStrategy

    parser = argparse.ArgumentParser(
        prog="lit-compute bench ddp", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--nprocs", type=int, default=2, help="processes (gloo on CPU, NCCL on GPUs)")
    parser.add_argument("--steps", type=int, default=40, help="training steps per configuration and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, configurations alternating")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per batch and process")
    args = parser.parse_args(argv)
    accelerator = _accelerator(args.nprocs)
    g = torch.Generator().manual_seed(0)
    n = args.batch_size * args.steps * args.nprocs
    data = torch.utils.data.TensorDataset(torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size)
    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            names = list(CONFIGS) if r % 2 == 0 else list(reversed(CONFIGS))
            for i, name in enumerate(names):
                path = os.path.join(tmp, f"{r}_{i}.json")
                os.environ.pop("MASTER_PORT", None)
                trainer = pl.Trainer(
                    accelerator=accelerator,
                    devices=args.nprocs,
                    max_steps=args.steps,
                    logger=False,
                    enable_checkpointing=False,
                    enable_progress_bar=False,
                    enable_model_summary=False,
                    strategy=TunedDDPStrategy(start_method="spawn", **CONFIGS[name]),
                    callbacks=[_DumpTimes(path)],
                )
                trainer.fit(_ManySmall(), train_dataloaders=loader)
                times[name] += json.loads(Path(path).read_text())
    base = median(times["default (bucket 25 MiB, no hook)"])
    n_params = sum(1 for _ in _ManySmall().parameters())
    emit(
        f"# bench ddp: {n_params} parameter tensors, {args.nprocs} processes on {accelerator} "
        f"({'nccl' if accelerator == 'cuda' else 'gloo'}), batch {args.batch_size} per process, {args.rounds} "
        f"interleaved rounds x {args.steps} steps\n# {machine_line()}\n"
    )
    rows = [[name, len(v), round(median(v) * 1e3, 2), f"{median(v) / base:.3f}"] for name, v in times.items()]
    emit(markdown(["configuration", "steps timed", "median step ms", "ratio to default"], rows))
    return 0


def main(argv: list[str]) -> int:  # pragma: no cover - dispatched by name below
    raise SystemExit("use lit-compute bench allreduce|ddp")
