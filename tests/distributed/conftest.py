"""Helpers shared by this folder's tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ..conftest import make_trainer


class _MLP(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(6)], nn.Linear(16, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Report(pl.Callback):
    def __init__(self, out: str):
        self.out = out

    def on_train_end(self, trainer, pl_module):
        ddp = trainer.strategy.model
        data = {
            "bucket_bytes_cap": ddp.bucket_bytes_cap,
            "comm_hook": ddp._get_ddp_logging_data().get("comm_hook"),
            "params": [p.detach().flatten().tolist() for p in pl_module.parameters()],
        }
        Path(self.out, f"fit_rank{trainer.global_rank}.json").write_text(json.dumps(data))


def _loader():
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(64, 16, generator=g), torch.randint(0, 2, (64,), generator=g)), batch_size=8
    )


def _fit(tmp_path: Path, name: str, strategy, callbacks=(), **kwargs) -> list[dict]:
    out = tmp_path / name
    out.mkdir()
    os.environ.pop("MASTER_PORT", None)  # a fresh port for every process group
    trainer = make_trainer(
        out,
        max_steps=4,
        devices=2,
        strategy=strategy,
        callbacks=[_Report(str(out)), *callbacks],
        limit_val_batches=0,
        **kwargs,
    )
    trainer.fit(_MLP(), train_dataloaders=_loader())
    return [json.loads((out / f"fit_rank{r}.json").read_text()) for r in (0, 1)]


ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_nodes(
    tmp_path: Path, configs: list[Path], timeout: float, extra_path: Path | None = None
) -> list[tuple[int, str]]:
    """``lit-compute fit --config CONFIG`` on as many torchrun "nodes" as configs (``--nnodes N --nproc-per-node 1``,
    c10d rendezvous on 127.0.0.1), each node with its own file, as a job whose nodes were started by hand (or by
    srun) is. Returns each launcher's exit code and output (also in ``launcher<i>.log``); a launch past ``timeout``
    seconds is killed with every process and fails the test (a hang)."""
    return launch_jobs(tmp_path, [configs], timeout, extra_path)[0]


def launch_jobs(
    tmp_path: Path, jobs: list[list[Path]], timeout: float, extra_path: Path | None = None
) -> list[list[tuple[int, str]]]:
    """Several such jobs at once (each its own rendezvous port): their exit codes and outputs, job by job."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_", "GROUP_RANK", "RANK", "NCCL_"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(extra_path or tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    launched: list[list[subprocess.Popen]] = []
    for j, configs in enumerate(jobs):
        port = _free_port()
        nodes = []
        for config in configs:
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(len(configs)),
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                f"lit-compute-test-{j}",
                "-m",
                "lit_compute.cli",
                "fit",
                "--config",
                str(config),
            ]
            nodes.append(
                subprocess.Popen(
                    command,
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )
        launched.append(nodes)
    everyone = [n for nodes in launched for n in nodes]
    outputs: dict[int, str] = {}
    try:
        import time

        deadline = time.monotonic() + timeout
        for node in everyone:
            outputs[node.pid] = node.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
    except subprocess.TimeoutExpired:
        for node in everyone:
            os.killpg(node.pid, signal.SIGKILL)
        pytest.fail(f"{len(jobs)} torchrun job(s) did not finish within {timeout:g} s (a hang?)")
    results = []
    for j, nodes in enumerate(launched):
        for i, node in enumerate(nodes):
            (tmp_path / f"job{j}_launcher{i}.log").write_text(outputs[node.pid])
        results.append([(node.returncode, outputs[node.pid]) for node in nodes])
    return results


def failure_lines(index: int, returncode: int, output: str) -> str:
    """A node's exit code, its first error lines (the root cause, before the other node's knock-on errors) and its
    last lines; the whole output is in launcher<index>.log under the test's tmp_path."""
    lines = output.splitlines()
    first = [line for line in lines if any(k in line for k in ("Error", "error", "terminate", "exitcode", "Signal"))]
    return (
        f"--- launcher {index}: exit {returncode}\nfirst error lines:\n"
        + "\n".join(first[:12])
        + "\nlast lines:\n"
        + "\n".join(lines[-25:])
    )
