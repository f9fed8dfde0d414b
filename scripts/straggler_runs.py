"""#70 item 2's figure: tensor parallel 1 x 2 on gloo, on the real clock, logging every step, five runs of 12 steps
with even ranks and five with rank 1 sleeping 50 ms before each forward: which runs' StepTimeMonitor named a
straggler, and each run's per-step skew. Writes ``docs/figures/straggler_runs.md`` (the commit and machine in its
first line).

Each rank runs on a core of its own (``os.sched_setaffinity``), as each rank of a real job has its own device;
``--unpinned`` leaves both ranks, and their gloo threads, to share every core (on two cores one rank can then be
the slower at every step of a whole run: its work is even, its share of the cores is not).

    python scripts/straggler_runs.py [OUT.md] [--unpinned]   (Lightning starts the second rank by re-running it)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.backends.cpu import get_cpu_capability
from torch.utils.data import DataLoader, TensorDataset

from lit_compute import StepTimeMonitor
from lit_compute.figures import figure_header
from lit_compute.hardware.this_machine import machine_line

RUNS, STEPS, SLEEP_S = 5, 12, 0.05


class MLP(pl.LightningModule):
    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.sleep_s = sleep_s
        self.net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))

    def configure_model(self) -> None:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        parallelize_module(
            self.net, self.device_mesh["tensor_parallel"], {"0": ColwiseParallel(), "2": RowwiseParallel()}
        )

    def training_step(self, batch, batch_idx):
        if self.sleep_s and self.global_rank == 1:
            time.sleep(self.sleep_s)  # real time: what a slower device looks like to the other rank
        return self.net(batch[0]).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(out: Path, name: str, sleep_s: float) -> None:
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2),
        max_steps=STEPS,
        log_every_n_steps=1,
        logger=pl.loggers.TensorBoardLogger(str(out), name=name, version=0),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StepTimeMonitor()],
    )
    data = TensorDataset(torch.randn(STEPS * 32, 256, generator=torch.Generator().manual_seed(0)))
    trainer.fit(MLP(sleep_s), train_dataloaders=DataLoader(data, batch_size=32))


def row(out: Path, name: str) -> str:
    acc = EventAccumulator(str(out / name / "version_0"))
    acc.Reload()
    skews = [e.value for e in acc.Scalars("time/rank_skew")]
    slowest = [int(e.value) for e in acc.Scalars("time/slowest_rank")]
    spikes = [e.value for e in acc.Scalars("time/rank_spikes")] if "time/rank_spikes" in acc.Tags()["scalars"] else []
    named = "time/straggler_advice/text_summary" in acc.Tags()["tensors"]
    over = sum(s > 1.25 for s in skews)
    series = " ".join(f"{s:.2f}({r})" for s, r in zip(skews, slowest))
    return (
        f"| {name} | {'yes' if named else 'no'} | {over} of {len(skews)} | {int(max(spikes, default=0))} | {series} |"
    )


def main() -> None:
    pinned = "--unpinned" not in sys.argv
    # rank 1 inherits rank 0's core mask: the cores are passed on in the environment, which it inherits too
    os.environ.setdefault("STRAGGLER_RUNS_CORES", ",".join(map(str, sorted(os.sched_getaffinity(0)))))
    cores = [int(c) for c in os.environ["STRAGGLER_RUNS_CORES"].split(",")]
    if pinned and len(cores) >= 2:
        os.sched_setaffinity(0, {cores[int(os.environ.get("LOCAL_RANK", "0")) % len(cores)]})
    out = Path(os.environ.setdefault("STRAGGLER_RUNS_DIR", tempfile.mkdtemp(prefix="straggler_runs_")))
    names = [(f"even_{i}", 0.0) for i in range(RUNS)] + [(f"rank1_slow_{i}", SLEEP_S) for i in range(RUNS)]
    for name, sleep_s in names:
        fit(out, name, sleep_s)
    if int(os.environ.get("LOCAL_RANK", "0")) != 0:
        return
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    target = Path(paths[0]) if paths else Path(__file__).parents[1] / "docs/figures/straggler_runs.md"
    where = "each rank on a core of its own" if pinned else "the ranks sharing every core"
    machine = f"{machine_line()}, {os.cpu_count()} cores, CPU capability {get_cpu_capability()}"
    lines = [
        figure_header("scripts/straggler_runs.py" + ("" if pinned else " --unpinned"), machine)
        + f"Tensor parallel 1 x 2 on gloo, {where}, real clock, `StepTimeMonitor()` defaults (straggler_skew 1.25, "
        f"straggler_window 8), logging every step, {STEPS} steps a run; rank 1 sleeps {SLEEP_S * 1000:.0f} ms before "
        "each forward in the slow runs.",
        "",
        "| run | straggler named | logging steps over 1.25 | spikes counted | skew (slowest rank) per logging step |",
        "|---|---|---|---|---|",
        *(row(out, name) for name, _ in names),
        "",
    ]
    target.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
