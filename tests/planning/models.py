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
