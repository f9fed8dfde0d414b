"""NCCLSettings validation and TunedDDPStrategy under 2-process DDP on CPU (gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_compute import CommBenchmark, NCCLSettings, TunedDDPStrategy

from .conftest import SpawnDDP, make_trainer, read_events, scalar_values, text_values


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"algo": "Trie"}, r"NCCL_ALGO='Trie' has unknown token.*ring, tree"),
        ({"algo": "allreduce:tree;gather:ring"}, r"unknown collective 'gather'"),
        ({"proto": "^LL,Fast"}, r"NCCL_PROTO='\^LL,Fast'.*ll, ll128, simple"),
        ({"socket_nthreads": 17}, r"NCCL_SOCKET_NTHREADS=17 is out of range; accepted: 1..16"),
        ({"socket_nthreads": 8, "nsocks_perthread": 16}, r"8 x NCCL_NSOCKS_PERTHREAD=16 = 128 exceeds 64"),
        ({"p2p_level": "NVLINK"}, r"NCCL_P2P_LEVEL='NVLINK'.*LOC, NVL, PIX"),
        ({"min_ctas": 8, "max_ctas": 4}, r"NCCL_MIN_CTAS=8 is above NCCL_MAX_CTAS=4"),
        ({"buffsize": -1}, r"NCCL_BUFFSIZE=-1 must be a positive"),
        ({"debug": "LOUD"}, r"NCCL_DEBUG='LOUD'.*VERSION, WARN, INFO, TRACE"),
        ({"debug_subsys": "INIT,FOO"}, r"NCCL_DEBUG_SUBSYS='INIT,FOO' has unknown \['FOO'\]"),
        ({"extra": {"GLOO_THING": "1"}}, r"extra key 'GLOO_THING' is not an NCCL variable"),
        ({"extra": {"NCCL_ALGO": "Tree"}}, r"use the field algo= instead"),
    ],
)
def test_invalid_settings_are_rejected_with_the_variable_and_what_is_accepted(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NCCLSettings(**kwargs)


def test_valid_settings_and_warnings():
    s = NCCLSettings(algo="allreduce:tree,ring;broadcast:ring", proto="^LL128", socket_nthreads=4,
                     nsocks_perthread=4, ib_disable=True, p2p_level="nvl", extra={"NCCL_SOCKET_IFNAME": "eth0"})
    assert s.env() == {"NCCL_ALGO": "allreduce:tree,ring;broadcast:ring", "NCCL_PROTO": "^LL128",
                       "NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4", "NCCL_IB_DISABLE": "1",
                       "NCCL_P2P_LEVEL": "nvl", "NCCL_SOCKET_IFNAME": "eth0"}
    with pytest.warns(UserWarning, match="NCCL_BUFFSIZE=3000000 is not a power of two"):
        NCCLSettings(buffsize=3_000_000)
    with pytest.warns(UserWarning, match="NCCL_MIN_NCHANNELS is deprecated.*NCCL_MIN_CTAS"):
        NCCLSettings(extra={"NCCL_MIN_NCHANNELS": "4"})


def test_strategy_bad_arguments():
    with pytest.raises(ValueError, match=r"TunedDDPStrategy\(comm_hook='int8'\)"):
        TunedDDPStrategy(comm_hook="int8")
    with pytest.raises(ValueError, match=r"TunedDDPStrategy\(bucket_cap_mb=0\)"):
        TunedDDPStrategy(bucket_cap_mb=0)
    with pytest.raises(ValueError, match=r"powersgd_start_iter=1"):
        TunedDDPStrategy(comm_hook="powersgd", powersgd_start_iter=1)


class _Recording(TunedDDPStrategy):
    """Records, on every rank, the NCCL variables at the moment the process group is about to be created."""

    def __init__(self, out: str, **kwargs):
        super().__init__(**kwargs)
        self.out = out

    def setup_distributed(self):
        env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
        Path(self.out, f"env_rank{self.local_rank}.json").write_text(
            json.dumps({"env": env, "initialized": dist.is_initialized()}))
        super().setup_distributed()


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
    return DataLoader(TensorDataset(torch.randn(64, 16, generator=g), torch.randint(0, 2, (64,), generator=g)),
                      batch_size=8)


def _fit(tmp_path: Path, name: str, strategy, callbacks=(), **kwargs) -> list[dict]:
    out = tmp_path / name
    out.mkdir()
    os.environ.pop("MASTER_PORT", None)  # a fresh port for every process group
    trainer = make_trainer(out, max_steps=4, devices=2, strategy=strategy, callbacks=[_Report(str(out)), *callbacks],
                           limit_val_batches=0, **kwargs)
    trainer.fit(_MLP(), train_dataloaders=_loader())
    return [json.loads((out / f"fit_rank{r}.json").read_text()) for r in (0, 1)]


def test_ddp_spawn_applies_settings_bucket_and_hook_and_matches_plain_ddp(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Ring")  # exported by the user: the explicit setting wins
    nccl = NCCLSettings(algo="Tree", socket_nthreads=4, nsocks_perthread=4, extra={"NCCL_SOCKET_IFNAME": "lo"})
    rec = tmp_path / "rec"
    rec.mkdir()
    tuned = _Recording(str(rec), nccl=nccl, bucket_cap_mb=1, comm_hook="fp16", start_method="spawn")
    ranks = _fit(tmp_path, "tuned", tuned, logger=pl.loggers.TensorBoardLogger(str(tmp_path), name="tb", version=0))
    for r in (0, 1):
        seen = json.loads((rec / f"env_rank{r}.json").read_text())
        assert seen["initialized"] is False  # recorded before the process group existed
        assert seen["env"] == {"NCCL_ALGO": "Tree", "NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4",
                               "NCCL_SOCKET_IFNAME": "lo"}
        assert ranks[r]["bucket_bytes_cap"] == 1 * 2**20
        assert ranks[r]["comm_hook"] == "fp16_compress_hook"
    assert ranks[0]["params"] == ranks[1]["params"]  # identical across ranks after fit
    plain = _fit(tmp_path, "plain", SpawnDDP())
    for a, b in zip(ranks[0]["params"], plain[0]["params"]):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=5e-3)
    config = text_values(read_events(tmp_path / "tb" / "version_0"), "ddp/config")[0]
    assert "| backend | gloo |" in config and "| NCCL_ALGO | Tree (inactive: not NCCL) |" in config
    assert "| bucket_cap_mb | 1.0 |" in config and "| comm_hook | fp16 |" in config


@pytest.mark.parametrize("hook", ["bf16", "powersgd"])
def test_other_comm_hooks_register_on_gloo(tmp_path, hook):
    strategy = TunedDDPStrategy(comm_hook=hook, powersgd_start_iter=2, start_method="spawn")
    ranks = _fit(tmp_path, hook, strategy, logger=False)
    expected = {"bf16": "bf16_compress_hook", "powersgd": "powerSGD_hook"}[hook]
    assert ranks[0]["comm_hook"] == expected
    assert ranks[0]["params"] == ranks[1]["params"]


def test_benchmark_table_has_a_row_per_size_with_positive_bandwidth(tmp_path):
    strategy = TunedDDPStrategy(benchmark_collectives=True, benchmark_max_mb=1, start_method="spawn")
    _fit(tmp_path, "bench", strategy, logger=pl.loggers.TensorBoardLogger(str(tmp_path), name="tb", version=0),
         callbacks=[CommBenchmark(max_mb=0.1, seconds=5)])
    acc = read_events(tmp_path / "tb" / "version_0")
    busbw = scalar_values(acc, "comm/allreduce_busbw_gbps")
    assert [s for s, _ in busbw][:5] == [4096, 16384, 65536, 262144, 1048576]
    assert all(v > 0 for _, v in busbw)
    table = text_values(acc, "comm/allreduce_table")[0]
    assert table.count("\n| ") >= 5 and "busbw (GB/s)" in table


SCRIPT = """
import json, os, sys
from pathlib import Path
import lightning.pytorch as pl
from lightning.pytorch.demos.boring_classes import BoringModel
from lit_compute import NCCLSettings, TunedDDPStrategy

out = Path(sys.argv[1])

class Recording(TunedDDPStrategy):
    def setup_distributed(self):
        env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
        (out / f"rank{self.local_rank}.json").write_text(json.dumps(env))
        super().setup_distributed()

if __name__ == "__main__":
    model = BoringModel()
    trainer = pl.Trainer(accelerator="cpu", devices=2, max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         strategy=Recording(nccl=NCCLSettings(proto="Simple", min_ctas=2), bucket_cap_mb=5))
    trainer.fit(model)
"""


def test_popen_ddp_from_a_script_applies_the_settings(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK"))}
    result = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    for r in (0, 1):
        assert json.loads((tmp_path / f"rank{r}.json").read_text()) == {"NCCL_PROTO": "Simple", "NCCL_MIN_CTAS": "2"}
