"""On 2 gloo ranks, in one launch (Lightning starts the second rank by re-running this script):

- one MLP under three parallel layouts (DDP, FSDP2 2x1, tensor parallel 1x2), the same global batch of 32 each
  time, with FlopsLogger and StepTimeMonitor on; each rank writes what it counted;
- a straggler: DDP where rank 1's loader takes 40 ms per sample on a driven clock (no sleeping); and a spike: the
  same for one batch of twelve, logging every step;
- stragglers under FSDP2 and tensor parallelism, where the other rank waits inside the forward's collectives: rank 1
  sleeps 200 ms per batch in its loader (data) or before its forward (compute), on the real clock (a sleep is what
  a slow rank looks like to the others); and FSDP2 where each collective completes 150 ms late on rank 1 (a slow
  link: every rank ends up waiting alike);
- FSDP2 with CommBenchmark (all three collectives, world and mesh groups) and a profiler window;
- FSDP2 where the ranks' batch shapes differ (each new one counted on its own rank);
- FSDP2 with ``fully_shard_fp32_norms``: each rank writes the dtypes seen inside forward;
- the README's GradNormMonitor example under DDP: each rank writes its own norms.

Usage: python parallel_layouts.py OUT_DIR   (Lightning launches the second rank by re-running this script)
"""

import json
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_compute import (
    CommBenchmark,
    FlopsLogger,
    ProfilerWindow,
    StepTimeMonitor,
    fully_shard_fp32_norms,
    timeline_for,
)

GLOBAL_BATCH = 32


class Clock:
    """The timeline's clock: advanced by the code below, never by real time."""

    t = 0.0

    def __call__(self):
        return self.t


CLOCK = Clock()


class Samples(torch.utils.data.Dataset):
    """Each sample takes 1 ms to load on the driven clock, 40 ms on ``slow_rank`` (only in its batch number
    ``spike_batch`` of ``batch_size`` samples, where given)."""

    def __init__(
        self,
        rank: int,
        slow_rank: int | None,
        sleep_s: float = 0.0,
        spike_batch: int | None = None,
        batch_size: int = 16,
    ):
        self.slow = rank == slow_rank
        self.sleep_s = sleep_s if self.slow else 0.0
        self.spike_batch, self.batch_size, self.loaded = spike_batch, batch_size, 0
        self.x = torch.randn(12 * GLOBAL_BATCH, 256, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        batch, first = divmod(self.loaded, self.batch_size)
        self.loaded += 1
        if self.sleep_s:  # real time, once per batch this rank loads (not by index: a sampler interleaves ranks)
            if first == 0:
                time.sleep(self.sleep_s)
        else:
            slow = self.slow and (self.spike_batch is None or batch == self.spike_batch)
            CLOCK.t += 0.040 if slow else 0.001
        return (self.x[i],)


class DrivenClock(pl.Callback):
    def setup(self, trainer, pl_module, stage):
        timeline_for(trainer).clock = CLOCK

    def on_before_backward(self, trainer, pl_module, loss):
        CLOCK.t += 0.010  # forward: the same on both ranks

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        CLOCK.t += 0.020  # backward and optimizer


class MLP(pl.LightningModule):
    def __init__(self, sleep_s: float = 0.0):
        super().__init__()
        self.sleep_s = sleep_s  # before each forward (rank 1 only, set by run())
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))

    def configure_model(self):
        mesh = getattr(self, "_device_mesh", None)
        if mesh is None:
            return
        if mesh["tensor_parallel"].size() > 1:
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            parallelize_module(self.net, mesh["tensor_parallel"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        if mesh["data_parallel"].size() > 1:
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.net, mesh=mesh["data_parallel"])

    def training_step(self, batch, batch_idx):
        (x,) = batch
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.net(x).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run(
    out: Path,
    name: str,
    strategy,
    data_parallel: int,
    slow_rank: int | None = None,
    max_steps: int = 4,
    callbacks=(),
    slow: str | None = None,
    spike_batch: int | None = None,
    log_every_n_steps: int = 2,
) -> None:
    """``slow``: None (the driven clock), ``"data"`` or ``"compute"``: rank 1 sleeps 200 ms per batch there;
    ``"comm"``: rank 1 sleeps 150 ms in each collective's wait."""
    driven = [] if slow else [DrivenClock()]
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=max_steps,
        log_every_n_steps=log_every_n_steps,
        logger=pl.loggers.TensorBoardLogger(str(out), name=name),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*driven, FlopsLogger(), StepTimeMonitor(), *callbacks],
    )
    rank = trainer.global_rank
    loader = DataLoader(
        Samples(
            rank,
            1 if slow == "data" else slow_rank,
            0.2 if slow == "data" else 0.0,
            spike_batch,
            GLOBAL_BATCH // data_parallel,
        ),
        batch_size=GLOBAL_BATCH // data_parallel,
    )
    work = torch.distributed.distributed_c10d.Work
    real_wait = work.wait
    # a slow link on rank 1: each of its collectives completes 150 ms late there (long beside a step even on a busy
    # machine: at 50 ms the share blocked fell under comm_fraction once, in a full suite on two busy cores)
    if slow == "comm" and rank == 1:

        def slow_wait(self, *args, **kwargs):
            time.sleep(0.15)
            return real_wait(self, *args, **kwargs)

        work.wait = slow_wait
    try:
        trainer.fit(MLP(0.2 if slow == "compute" and rank == 1 else 0.0), train_dataloaders=loader)
    finally:
        work.wait = real_wait


class HeadedMLP(MLP):
    """The MLP's two sharded layers and an unsharded head beside them, which both tensor-parallel peers run whole."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(256, 10)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.head(self.net(x)).square().mean()


def _counted(model: nn.Module, x: torch.Tensor) -> int:
    """torch's own FlopCounterMode over a forward and backward of a plain (non-DTensor) model."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(x).square().mean().backward()
    return counter.get_total_flops()


def tp_head(out: Path) -> None:
    """Tensor parallel 1 x 2 with an unsharded head: each rank writes what torch's FlopCounterMode counts on a plain
    copy of what it executes (its shards at their local shapes and the whole head) and on the unsharded model."""
    x = torch.randn(8 * GLOBAL_BATCH, 256, generator=torch.Generator().manual_seed(0))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        max_steps=3,
        log_every_n_steps=1,
        strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2),
        logger=pl.loggers.TensorBoardLogger(str(out), name="tp_head"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[FlopsLogger(peak="none"), StepTimeMonitor()],
    )
    trainer.fit(HeadedMLP(), train_dataloaders=DataLoader(TensorDataset(x), batch_size=GLOBAL_BATCH))
    batch = x[:GLOBAL_BATCH]
    local = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256), nn.Linear(256, 10))
    whole = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256), nn.Linear(256, 10))
    (out / f"tp_head_rank{trainer.global_rank}.json").write_text(
        json.dumps({"local_replica": _counted(local, batch), "unsharded": _counted(whole, batch)})
    )


def uneven_shapes(out: Path) -> None:
    """FSDP2 where rank 1 sees a batch shape rank 0 never sees (counted on rank 1 alone): no rank waits forever."""
    g = torch.Generator().manual_seed(1)
    # DistributedSampler (no shuffle) gives rank r the batches r, r + 2, ...: rank 1 alternates 16 and 12 rows
    batches = [(torch.randn(12 if i % 4 == 3 else 16, 256, generator=g),) for i in range(16)]
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        max_steps=6,
        log_every_n_steps=1,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        logger=pl.loggers.TensorBoardLogger(str(out), name="uneven"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[FlopsLogger(), StepTimeMonitor()],
    )
    trainer.fit(MLP(), train_dataloaders=DataLoader(batches, batch_size=None))


class NormNet(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(64, 64), nn.LayerNorm(64), nn.Linear(64, 64), nn.BatchNorm1d(64), nn.Linear(64, 8)
        )
        self.seen = {}
        for i, m in enumerate(self.net):
            m.register_forward_hook(self._see(i))

    def _see(self, i):
        def hook(module, args, output):
            self.seen[str(i)] = [type(module).__name__, str(args[0].dtype), str(module.weight.dtype)]

        return hook

    def configure_model(self):
        fully_shard_fp32_norms(self.net, self.device_mesh["data_parallel"], param_dtype=torch.bfloat16)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).float().square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_end(self):
        (OUT / f"norms_rank{self.global_rank}.json").write_text(json.dumps(self.seen))


def fp32_norms() -> None:
    x = torch.randn(4 * GLOBAL_BATCH, 64, generator=torch.Generator().manual_seed(0))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(NormNet(), train_dataloaders=DataLoader(TensorDataset(x), batch_size=GLOBAL_BATCH // 2))


def grad_norms(out: Path) -> None:
    """The README's GradNormMonitor example (a user's own MeasuringCallback) under DDP: its norm rides the one
    logging all-reduce; each rank writes its own norms."""
    import lit_compute

    sys.path.insert(0, str(Path(lit_compute.__file__).resolve().parents[1] / "examples"))  # the repository's
    from grad_norm_monitor import GradNormMonitor
    from lightning.pytorch.demos.boring_classes import BoringModel

    class Recording(GradNormMonitor):
        def on_train_end(self, trainer, pl_module):
            (out / f"gradnorm_rank{trainer.global_rank}.json").write_text(json.dumps(self.local))

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=8,
        log_every_n_steps=2,
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=pl.loggers.TensorBoardLogger(str(out), name="gradnorm"),
        callbacks=[Recording(), FlopsLogger(peak_flops=1e11), StepTimeMonitor()],
    )
    trainer.fit(BoringModel())


if __name__ == "__main__":
    OUT = Path(sys.argv[1])
    run(OUT, "ddp", DDPStrategy(process_group_backend="gloo"), 2)
    run(OUT, "fsdp2", ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), 2)
    run(OUT, "tp", ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2), 1)
    # a straggler is named over a full window (StepTimeMonitor's straggler_window, 8 logging steps): logging every
    # step, the first (the epoch's first batch) left out
    run(OUT, "straggler", DDPStrategy(process_group_backend="gloo"), 2, slow_rank=1, max_steps=10, log_every_n_steps=1)
    spike = {"slow_rank": 1, "spike_batch": 5, "max_steps": 12, "log_every_n_steps": 1}
    run(OUT, "spike", DDPStrategy(process_group_backend="gloo"), 2, **spike)
    for layout, dp, tp in (("fsdp2", 2, 1), ("tp", 1, 2)):
        for cause in ("data", "compute"):
            run(
                OUT,
                f"{layout}_slow_{cause}",
                ModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=tp),
                dp,
                max_steps=10,
                slow=cause,
                log_every_n_steps=1,
            )
    run(
        OUT,
        "fsdp2_slow_comm",
        ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        2,
        max_steps=7,
        slow="comm",
    )
    run(
        OUT,
        "fsdp2_comm",
        ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        2,
        max_steps=5,
        callbacks=[CommBenchmark(max_mb=0.1, seconds=3), ProfilerWindow(start_step=1, warmup=0, active=2)],
    )
    tp_head(OUT)
    uneven_shapes(OUT)
    fp32_norms()
    grad_norms(OUT)
