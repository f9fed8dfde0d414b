"""A Hugging Face GPT-2 inside a small LightningModule: a model lit_compute did not write, for `lit-compute tune`.

The weights are random (built from a ``GPT2Config``: nothing is downloaded); the batches are
:class:`~lit_compute.data.TokenDataModule`'s (``input_ids`` and, for padded documents, ``attention_mask``).
Tune it from the repository root (the class path ``examples.hf_gpt2.HFCausalLM`` is imported from there)::

    lit-compute tune --config examples/hf_gpt2.yaml --budget 5m
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch


class HFCausalLM(pl.LightningModule):
    """``transformers.GPT2LMHeadModel`` trained with its own loss; padding positions are ignored (label -100)."""

    def __init__(
        self,
        vocab_size: int = 258,
        n_positions: int = 256,
        n_layer: int = 2,
        n_embd: int = 128,
        n_head: int = 4,
        lr: float = 1e-3,
    ) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        self.save_hyperparameters()
        self.lr = lr
        self.model = GPT2LMHeadModel(
            GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_layer=n_layer, n_embd=n_embd, n_head=n_head)
        )

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        labels = ids if mask is None else ids.masked_fill(mask == 0, -100)
        loss = self.model(input_ids=ids, attention_mask=mask, labels=labels).loss
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)
