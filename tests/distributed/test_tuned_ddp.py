"""TunedDDPStrategy under 2-process DDP on CPU (gloo): settings, buckets and hooks, spawned and from a script."""

from __future__ import annotations

import json
import os
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist

from lit_compute import NCCLSettings, TunedDDPStrategy

from ..conftest import SpawnDDP, read_events, run_script, text_values
from .conftest import _fit


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
            json.dumps({"env": env, "initialized": dist.is_initialized()})
        )
        super().setup_distributed()


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.slow
def test_ddp_spawn_applies_settings_bucket_and_hook_and_matches_plain_ddp(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Ring")  # exported by the user: the explicit setting wins
    nccl = NCCLSettings(algo="Tree", socket_nthreads=4, nsocks_perthread=4, extra={"NCCL_SOCKET_IFNAME": "lo"})
    rec = tmp_path / "rec"
    rec.mkdir()
    # spawned ranks, both runs (in a full session the forkserver's ranks drifted from each other past the tolerance)
    tuned = _Recording(str(rec), nccl=nccl, bucket_cap_mb=1, comm_hook="fp16", start_method="spawn")
    ranks = _fit(tmp_path, "tuned", tuned, logger=pl.loggers.TensorBoardLogger(str(tmp_path), name="tb", version=0))
    for r in (0, 1):
        seen = json.loads((rec / f"env_rank{r}.json").read_text())
        assert seen["initialized"] is False  # recorded before the process group existed
        assert seen["env"] == {
            "NCCL_ALGO": "Tree",
            "NCCL_SOCKET_NTHREADS": "4",
            "NCCL_NSOCKS_PERTHREAD": "4",
            "NCCL_SOCKET_IFNAME": "lo",
        }
        assert ranks[r]["bucket_bytes_cap"] == 1 * 2**20
        assert ranks[r]["comm_hook"] == "fp16_compress_hook"
    assert ranks[0]["params"] == ranks[1]["params"]  # identical across ranks after fit
    plain = _fit(tmp_path, "plain", SpawnDDP(start_method="spawn"))
    for a, b in zip(ranks[0]["params"], plain[0]["params"]):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=5e-3)
    config = text_values(read_events(tmp_path / "tb" / "version_0"), "ddp/config")[0]
    assert "| backend | gloo |" in config
    assert "| NCCL_ALGO | Tree (inactive: not NCCL) |" in config
    assert "| bucket_cap_mb | 1.0 |" in config
    assert "| comm_hook | fp16 |" in config


@pytest.mark.parametrize("hook", ["fp16", "bf16", "powersgd"])
def test_each_comm_hook_name_registers_torchs_hook(hook):
    """The name-to-hook mapping, on the wrapped model's own `register_comm_hook` (the two-rank runs train with fp16,
    above, and PowerSGD, in the drop-in fit-then-test script)."""
    registered = []

    class Wrapped:
        def register_comm_hook(self, state, hook_fn):
            registered.append((state, hook_fn.__name__))

    strategy = TunedDDPStrategy(comm_hook=hook, powersgd_rank=2)
    strategy.model = Wrapped()
    strategy._register_ddp_hooks()
    state, name = registered[0]
    assert name == {"fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook", "powersgd": "powerSGD_hook"}[hook]
    assert (state is None) == (hook != "powersgd")
    if hook == "powersgd":
        assert state.matrix_approximation_rank == 2


SCRIPT = """
import atexit, json, os, sys
from pathlib import Path
import lightning.pytorch as pl
import torch.distributed as dist
from lightning.pytorch.demos.boring_classes import BoringModel
from lit_compute import NCCLSettings, TunedDDPStrategy

out = Path(sys.argv[1])

class Recording(TunedDDPStrategy):
    def setup_distributed(self):
        env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
        (out / f"rank{self.local_rank}.json").write_text(json.dumps(env))
        super().setup_distributed()

def left_at_exit():  # registered first, so it runs after the strategy's own exit handler
    rank = os.environ.get("LOCAL_RANK", "0")
    (out / f"exit{rank}.json").write_text(json.dumps({"initialized": dist.is_initialized()}))

if __name__ == "__main__":
    atexit.register(left_at_exit)
    model = BoringModel()
    trainer = pl.Trainer(accelerator="cpu", devices=2, max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         strategy=Recording(nccl=NCCLSettings(proto="Simple", min_ctas=2), bucket_cap_mb=5))
    trainer.fit(model)
"""


@pytest.mark.slow
def test_popen_ddp_from_a_script_applies_the_settings(tmp_path):
    result = run_script(tmp_path, SCRIPT, str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stdout[-2000:]
    for r in (0, 1):
        assert json.loads((tmp_path / f"rank{r}.json").read_text()) == {"NCCL_PROTO": "Simple", "NCCL_MIN_CTAS": "2"}
        # the gloo group is destroyed at exit, not left to interpreter finalization (a SIGABRT there fails a node)
        assert json.loads((tmp_path / f"exit{r}.json").read_text()) == {"initialized": False}
