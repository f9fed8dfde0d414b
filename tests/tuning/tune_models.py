"""Models the tune tests train in their trial processes (imported by class path from the repository root).

``SleepyRegression``'s step costs ``coef * batch**2`` seconds of sleep, so halving the micro-batch doubles the
samples per second whatever the machine's load (a sleep does not compete for cores); its loss is NaN when its
convolution weight is channels-last, and a fused optimizer makes it run out of memory, so the tune meets a
speed-up, a numerics failure and an OOM in one small run.
"""

from __future__ import annotations

import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class SleepyRegression(pl.LightningModule):
    def __init__(self, coef: float = 1e-3, lr: float = 0.01) -> None:
        super().__init__()
        self.coef = coef
        self.lr = lr
        self.conv = torch.nn.Conv2d(2, 4, 3)  # only there so channels-last applies
        self.lin = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        if self.trainer.optimizers[0].param_groups[0].get("fused"):
            raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 1099511627776 bytes.")
        x, y = batch
        time.sleep(self.coef * x.shape[0] ** 2)
        loss = torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), y)
        if not self.conv.weight.is_contiguous():  # channels-last
            loss = loss * float("nan")
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class RandomRegressionData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 16, num_workers: int = 0, samples: int = 512) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.num_workers = num_workers
        g = torch.Generator().manual_seed(0)
        x = torch.randn(samples, 8, generator=g)
        self.data = TensorDataset(x, x.sum(-1) + 0.1 * torch.randn(samples, generator=g))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size, num_workers=self.num_workers)


class NeverStarts(pl.LightningModule):
    """Hangs while being built (a trial that never reports)."""

    def __init__(self) -> None:
        super().__init__()
        time.sleep(3600)


class Faulty(SleepyRegression):
    """Fails as ``fault.txt`` in the working directory says: ``crash`` (a bug), ``disk full`` (ENOSPC), else trains."""

    def training_step(self, batch, batch_idx):
        import errno
        from pathlib import Path

        fault = Path("fault.txt").read_text().strip() if Path("fault.txt").is_file() else ""
        if fault == "crash":
            raise RuntimeError("a bug in the model")
        if fault == "disk full":
            raise OSError(errno.ENOSPC, "No space left on device", "checkpoint.ckpt")
        return super().training_step(batch, batch_idx)


class WideRegression(SleepyRegression):
    """A hidden layer of 4096: activations of 16 KB per sample, so the micro-batch decides the memory."""

    def __init__(self, coef: float = 0.0, lr: float = 0.01) -> None:
        super().__init__(coef, lr)
        self.lin = torch.nn.Sequential(torch.nn.Linear(8, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1))


class ValidatedRegression(SleepyRegression):
    """Logs ``val_loss`` from a validation step (the drift check's --validate compares it)."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), y))


class ValidatedRegressionData(RandomRegressionData):
    def val_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)
