"""Helpers shared by this folder's tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import lightning.pytorch as pl
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
