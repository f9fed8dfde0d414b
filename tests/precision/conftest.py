"""Helpers shared by this folder's tests."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class _ConvNet(pl.LightningModule):
    """conv -> BatchNorm -> GroupNorm -> linear, on random images."""

    def __init__(self, scale: float = 1.0, inf_at: tuple[int, ...] = ()):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.gn = nn.GroupNorm(2, 8)
        self.head = nn.Linear(8, 4)
        self.scale = scale
        self.inf_at = inf_at

    def forward(self, x):
        x = self.gn(torch.relu(self.bn(self.conv(x * self.scale))))
        return self.head(x.mean(dim=(2, 3)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x).float(), y)

    def on_after_backward(self):
        if self.global_step in self.inf_at:
            self.head.weight.grad.fill_(float("inf"))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _loader(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return DataLoader(
        TensorDataset(torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 4, (n,), generator=g)), batch_size=8
    )
