"""A three-convolution CNN whose memory is mostly convolution activations (64 px, 32-64 channels at full
resolution): the model where a CPU's convolution workspaces show most (`lit-compute bench memory`)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn


class ThreeConvNet(pl.LightningModule):
    """Three 3x3 convolutions at full resolution, then a linear head; images of ``image_size`` pixels."""

    def __init__(self, num_classes: int = 10, image_size: int = 64, lr: float = 1e-3) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(8),
            nn.Flatten(),
            nn.Linear(64 * 8 * 8, num_classes),
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)
