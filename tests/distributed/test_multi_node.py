"""Two "nodes" on this machine: two torchrun launchers (``--nnodes 2 --nproc-per-node 1``, c10d rendezvous on
127.0.0.1) running ``lit-compute fit`` with TunedDDPStrategy, as a multi-node job is launched (SLURM's srun starts
the same torchrun on each node)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ..conftest import read_events, scalar_values, text_values
from .conftest import failure_lines, launch_nodes

pytestmark = pytest.mark.slow  # the fast tier (make test-fast) leaves these out

ROOT = Path(__file__).resolve().parents[2]

RECORD_ENV = '''
import json, os, time
from pathlib import Path
import lightning.pytorch as pl


class RecordEnv(pl.Callback):
    """Each rank writes the NCCL variables it trains with and where it runs; the second node's rank computes 500 ms
    longer per batch (after the batch arrived: listed after lit_compute's callbacks)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == 1:
            time.sleep(0.5)

    def on_train_end(self, trainer, pl_module):
        data = {"nccl": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}, "node_rank": trainer.node_rank,
                "world_size": trainer.world_size, "num_nodes": trainer.num_nodes}
        Path(f"rank{trainer.global_rank}.json").write_text(json.dumps(data))
'''


def _config(tmp_path: Path) -> Path:
    config = yaml.safe_load((ROOT / "configs" / "ddp.yaml").read_text())
    trainer = config["trainer"]
    # logging every step: a straggler is named over StepTimeMonitor's window of 8 logging steps
    trainer.update(devices=1, num_nodes=2, max_steps=12, max_epochs=None, log_every_n_steps=1)
    trainer["strategy"]["init_args"].update(benchmark_max_mb=0.1, benchmark_seconds=1)
    trainer["callbacks"][2]["init_args"].update(max_mb=0.1, seconds=1)  # CommBenchmark
    trainer["callbacks"].append({"class_path": "record_env.RecordEnv"})
    config["data"]["init_args"].update(
        batch_size=8, image_size=32, num_workers=0, synthetic_num_classes=4, synthetic_images_per_class=30
    )  # one epoch holds every step
    config["model"]["init_args"].update(num_classes=4)
    path = tmp_path / "two_nodes.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
def test_two_nodes_under_torchrun_train_with_the_nccl_settings_on_every_rank_and_the_slow_one_named(tmp_path):
    (tmp_path / "record_env.py").write_text(RECORD_ENV)
    config = _config(tmp_path)
    results = launch_nodes(tmp_path, [config, config], timeout=300)
    assert [rc for rc, _ in results] == [0, 0], "\n".join(
        failure_lines(i, rc, out) for i, (rc, out) in enumerate(results)
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert sorted(r["node_rank"] for r in ranks) == [0, 1]
    for r in ranks:
        assert r["world_size"] == 2
        assert r["num_nodes"] == 2
        assert r["nccl"]["NCCL_ALGO"] == "Ring,Tree"
        assert r["nccl"]["NCCL_SOCKET_NTHREADS"] == "4"
    (version,) = tmp_path.glob("lightning_logs/version_*")
    acc = read_events(version)
    (run,) = text_values(acc, "lit_compute/run")
    assert "| nodes x devices | 2 x 1 |" in run
    assert "| parallel layout | data parallel 2 x tensor parallel 1 |" in run
    # CommBenchmark measured across the two nodes, and the model's gradients were priced at that bandwidth
    assert all(v > 0 for _, v in scalar_values(acc, "comm/allgather_busbw_gbps"))
    assert scalar_values(acc, "comm/grad_allreduce_ms")[-1][1] > 0
    # the slow rank on the other node is named, with its cause (DDP broadcasts the ResNet's BatchNorm buffers at the
    # start of each forward: rank 0 waits there, and that wait is not its own work)
    (advice,) = text_values(acc, "time/straggler_advice")
    assert "rank 1 is a straggler" in advice
    assert "Cause: compute" in advice
