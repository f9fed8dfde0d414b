"""Models the estimate tests build by class path (from the repository root)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn


class MaskedMLP(pl.LightningModule):
    """Keeps only the positive activations of its hidden layer: a data-dependent shape fake tensors cannot trace."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, width), nn.ReLU())
        self.selector = Selector()
        self.head = nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        kept = self.selector(self.encoder(x))
        return self.head(kept.unsqueeze(-1)).mean() + 0 * y.sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Selector(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h[h > 0]


class ManualWithScheduler(pl.LightningModule):
    """Manual optimization that steps its learning-rate scheduler itself (``self.lr_schedulers()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        scheduler.step()
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]


class WideAdamMLP(pl.LightningModule):
    """Many parameters, small activations: Adam's step holds the peak at every micro-batch."""

    def __init__(self, width: int = 1024) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(8, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class _Clock:
    """A clock the data below advances (tests drive time, they do not measure it)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


CLOCK = _Clock()


class _ClockedSamples(torch.utils.data.Dataset):
    def __init__(self, per_sample_s: float, n: int = 64) -> None:
        self.per_sample_s, self.n = per_sample_s, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        CLOCK.t += self.per_sample_s
        return torch.zeros(8), torch.tensor(0.0)


class _ClockedCollate:
    def __init__(self, per_batch_s: float) -> None:
        self.per_batch_s = per_batch_s

    def __call__(self, items):
        CLOCK.t += self.per_batch_s
        return torch.utils.data.default_collate(items)


class ClockedData(pl.LightningDataModule):
    """Regression samples whose loading advances :data:`CLOCK`: ``per_sample_s`` each, ``per_batch_s`` a batch."""

    def __init__(self, batch_size: int = 8, per_sample_s: float = 0.0, per_batch_s: float = 0.0) -> None:
        super().__init__()
        self.batch_size, self.per_sample_s, self.per_batch_s = batch_size, per_sample_s, per_batch_s

    def train_dataloader(self):
        return torch.utils.data.DataLoader(
            _ClockedSamples(self.per_sample_s), batch_size=self.batch_size, collate_fn=_ClockedCollate(self.per_batch_s)
        )
