"""Two "nodes" on this machine: two torchrun launchers (``--nnodes 2 --nproc-per-node 1``, c10d rendezvous on
127.0.0.1) running ``lit-compute fit`` with TunedDDPStrategy, as a multi-node job is launched (SLURM's srun starts
the same torchrun on each node)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ..conftest import read_events, scalar_values, text_values

ROOT = Path(__file__).resolve().parents[2]

RECORD_ENV = '''
import json, os
from pathlib import Path
import lightning.pytorch as pl


class RecordEnv(pl.Callback):
    """Each rank writes the NCCL variables it trains with and where it runs."""

    def on_train_end(self, trainer, pl_module):
        data = {"nccl": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}, "node_rank": trainer.node_rank,
                "world_size": trainer.world_size, "num_nodes": trainer.num_nodes}
        Path(f"rank{trainer.global_rank}.json").write_text(json.dumps(data))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp_path: Path) -> Path:
    config = yaml.safe_load((ROOT / "configs" / "ddp.yaml").read_text())
    trainer = config["trainer"]
    trainer.update(devices=1, num_nodes=2, max_steps=4, max_epochs=None, log_every_n_steps=2)
    trainer["strategy"]["init_args"].update(benchmark_max_mb=0.1, benchmark_seconds=2)
    trainer["callbacks"][2]["init_args"].update(max_mb=0.1, seconds=2)  # CommBenchmark
    trainer["callbacks"].append({"class_path": "record_env.RecordEnv"})
    config["data"]["init_args"].update(batch_size=8, image_size=32, num_workers=0, synthetic_num_classes=4,
                                       synthetic_images_per_class=8)
    config["model"]["init_args"].update(num_classes=4)
    path = tmp_path / "two_nodes.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _failure_lines(index: int, returncode: int, output: str) -> str:
    """A node's exit code, its first error lines (the root cause, before the other node's knock-on errors) and its
    last lines; the whole output is in launcher<index>.log under the test's tmp_path."""
    lines = output.splitlines()
    first = [line for line in lines if any(k in line for k in ("Error", "error", "terminate", "exitcode", "Signal"))]
    return (f"--- launcher {index}: exit {returncode}\nfirst error lines:\n" + "\n".join(first[:12])
            + "\nlast lines:\n" + "\n".join(lines[-25:]))


def test_two_nodes_under_torchrun_train_with_the_nccl_settings_on_every_rank(tmp_path):
    (tmp_path / "record_env.py").write_text(RECORD_ENV)
    config = _config(tmp_path)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_", "GROUP_RANK", "RANK", "NCCL_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    port = _free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "lit-compute-test",
               "-m", "lit_compute.cli", "fit", "--config", str(config)]
    nodes = [subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True) for _ in range(2)]
    outputs = []
    try:
        for node in nodes:
            outputs.append(node.communicate(timeout=300)[0])
    except subprocess.TimeoutExpired:
        for node in nodes:
            os.killpg(node.pid, signal.SIGKILL)
        pytest.fail("the two-node torchrun job did not finish within 300 s (a hang?)")
    for i, out in enumerate(outputs):
        (tmp_path / f"launcher{i}.log").write_text(out)
    assert [n.returncode for n in nodes] == [0, 0], "\n".join(_failure_lines(i, n.returncode, o)
                                                            for i, (n, o) in enumerate(zip(nodes, outputs)))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert sorted(r["node_rank"] for r in ranks) == [0, 1]
    for r in ranks:
        assert r["world_size"] == 2 and r["num_nodes"] == 2
        assert r["nccl"]["NCCL_ALGO"] == "Ring,Tree" and r["nccl"]["NCCL_SOCKET_NTHREADS"] == "4"
    (version,) = tmp_path.glob("lightning_logs/version_*")
    acc = read_events(version)
    (run,) = text_values(acc, "lit_compute/run")
    assert "| nodes x devices | 2 x 1 |" in run and "| parallel layout | data parallel 2 x tensor parallel 1 |" in run
    # CommBenchmark measured across the two nodes, and the model's gradients were priced at that bandwidth
    assert all(v > 0 for _, v in scalar_values(acc, "comm/allgather_busbw_gbps"))
    assert scalar_values(acc, "comm/grad_allreduce_ms")[-1][1] > 0
