"""On 2 gloo ranks, in one launch (Lightning starts the second rank by re-running this script):

1. every lit_compute component on through fit, validate and test, with a strategy that *raises on rank 1* when
   lit_compute calls a collective outside ``setup`` and the logging event's all-reduce (a collective only one rank
   reaches would hang or abort the job; here it fails the run instead);
2. rank 1 is SIGKILLed inside a profiler window: rank 0 gets the error from gloo and still writes its window.

Usage: python faults_two_ranks.py OUT_DIR
"""

import json
import os
import signal
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import DDPStrategy

import lit_compute
from lit_compute import (
    CommBenchmark,
    DeviceMonitor,
    FlopsLogger,
    LossScaleMonitor,
    ProfilerWindow,
    PrometheusLogger,
    StepTimeMonitor,
)

#: the installed package's folder: a frame of ours is a file under it (a repository cloned into a folder named
#: lit_compute holds Lightning's files, in its .venv, under a "/lit_compute/" path too)
PACKAGE = os.path.dirname(os.path.abspath(lit_compute.__file__)) + os.sep


class StrayCollective(BaseException):
    """Not an Exception: no measuring callback's guard swallows it, so rank 1 stops at once (and rank 0 with it)."""


class RaiseOnRank1(DDPStrategy):
    """DDP whose collectives raise on rank 1 when a lit_compute frame calls them outside setup and the one
    all-reduce of the logging event."""

    def _check(self, name):
        ours = [f for f in traceback.extract_stack()[:-2] if f.filename.startswith(PACKAGE)]
        if ours and not any(f.name in ("_all_reduce_sum", "setup") for f in ours) and self.global_rank == 1:
            raise StrayCollective(
                f"STRAY COLLECTIVE {name} from {ours[-1].filename}:{ours[-1].lineno} ({ours[-1].name})"
            )

    def broadcast(self, obj, src=0):
        self._check("broadcast")
        return super().broadcast(obj, src)

    def barrier(self, name=None):
        self._check("barrier")
        return super().barrier(name)

    def reduce(self, tensor, *args, **kwargs):
        self._check("reduce")
        return super().reduce(tensor, *args, **kwargs)

    def all_gather(self, tensor, group=None, sync_grads=False):
        self._check("all_gather")
        return super().all_gather(tensor, group=group, sync_grads=sync_grads)


def everything(out: Path) -> None:
    callbacks = [
        FlopsLogger(peak="none", log_every_n_steps=1),
        StepTimeMonitor(log_every_n_steps=1),
        DeviceMonitor(gpu=False, log_every_n_steps=1),
        LossScaleMonitor(log_every_n_steps=1),
        ProfilerWindow(start_step=1, warmup=0, active=2),
        CommBenchmark(max_mb=0.1, seconds=1),
    ]
    strategy = RaiseOnRank1(process_group_backend="gloo", timeout=timedelta(seconds=60))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=5,
        limit_val_batches=2,
        limit_test_batches=2,
        val_check_interval=2,
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=callbacks,
        logger=[pl.loggers.TensorBoardLogger(str(out), name="tb"), PrometheusLogger(port=0)],
    )
    model = BoringModel()
    trainer.fit(model)
    trainer.validate(model)
    trainer.test(model)
    print(f"EVERYTHING DONE rank {trainer.global_rank}", flush=True)


class KillRank1(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == 1 and trainer.global_step == 4:
            os.kill(os.getpid(), signal.SIGKILL)


def killed(out: Path) -> None:
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        max_steps=20,
        enable_progress_bar=False,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60)),
        enable_checkpointing=False,
        logger=pl.loggers.TensorBoardLogger(str(out), name="killed"),
        callbacks=[KillRank1(), ProfilerWindow(start_step=2, warmup=0, active=10)],
    )
    try:
        trainer.fit(BoringModel())
    except Exception as err:  # noqa: BLE001 - the survivor: gloo says its peer is gone
        print(f"SURVIVOR rank {trainer.global_rank}: {type(err).__name__}", flush=True)
        traces = sorted(p.name for p in (out / "killed").rglob("*.pt.trace.json"))
        (out / "survivor.json").write_text(json.dumps(traces))


if __name__ == "__main__":
    # Lightning's launcher SIGKILLs the main process (rank 0 here) within 5 s of a child rank's death (its process
    # observer polls every 5 s); on busy cores it once killed rank 0 after it printed SURVIVOR and before it wrote
    # survivor.json. What is tested is what rank 0 writes when its peer dies, not how soon Lightning ends it, so the
    # observer polls every 60 s here (before the first fit starts it; rank 0 still ends on gloo's 60 s timeout).
    from functools import partial

    from lightning.fabric.strategies.launchers import subprocess_script

    subprocess_script._ChildProcessObserver = partial(subprocess_script._ChildProcessObserver, sleep_period=60)
    OUT = Path(sys.argv[1])
    everything(OUT)
    killed(OUT)
