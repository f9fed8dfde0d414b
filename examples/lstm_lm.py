"""A recurrent language model: an embedding, ``torch.nn.LSTM`` (or ``torch.nn.GRU``: ``cell: gru``) and a linear
head over the vocabulary, trained on next-token prediction with Adam, on :class:`~lit_compute.data.TokenDataModule`'s
batches (``input_ids``). For the memory figure (`lit-compute bench memory`): an RNN's step holds what no other layer
does (oneDNN's recurrent workspace on a CPU, cuDNN's on a GPU). From the repository root::

    lit-compute estimate --config examples/memory/lstm.yaml --micro-batch 8
"""

from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import torch


class LSTMLanguageModel(pl.LightningModule):
    """``layers`` recurrent layers (``cell``: LSTM or GRU) of ``hidden`` units over ``embedding``-wide token vectors;
    Adam at ``lr``."""

    def __init__(
        self,
        vocab_size: int = 258,
        embedding: int = 256,
        hidden: int = 512,
        layers: int = 2,
        lr: float = 1e-3,
        cell: Literal["lstm", "gru"] = "lstm",
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = torch.nn.Embedding(vocab_size, embedding)
        recurrent = torch.nn.LSTM if cell == "lstm" else torch.nn.GRU
        self.lstm = recurrent(embedding, hidden, num_layers=layers, batch_first=True)
        self.head = torch.nn.Linear(hidden, vocab_size)
        self.lr = lr

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids = batch["input_ids"]
        out, _ = self.lstm(self.embed(ids[:, :-1]))
        logits = self.head(out)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)
