"""Hugging Face transformers of three kinds in one small LightningModule, built from a config (random weights:
nothing is downloaded), for the memory figure (`lit-compute bench memory`) and anyone's own experiments:

- ``kind: causal``: a decoder (``AutoModelForCausalLM``: Llama, with grouped-query attention when
  ``num_key_value_heads`` < ``num_attention_heads``), trained on next-token prediction;
- ``kind: masked``: an encoder (``AutoModelForMaskedLM``: BERT), trained to predict every token;
- ``kind: seq2seq``: an encoder-decoder (``AutoModelForSeq2SeqLM``: T5), the batch as both input and target.

``gradient_checkpointing: true`` turns on the model's own activation checkpointing. Batches are
:class:`~lit_compute.data.TokenDataModule`'s (``input_ids``, ``attention_mask`` where there is padding).
From the repository root (the class path ``examples.hf_models.HFModel`` is imported from there)::

    lit-compute fit --config examples/hf_llama_gqa.yaml
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

BUILDERS = {"causal": "AutoModelForCausalLM", "masked": "AutoModelForMaskedLM", "seq2seq": "AutoModelForSeq2SeqLM"}


class HFModel(pl.LightningModule):
    """A transformers model of ``model_type`` (``"llama"``, ``"bert"``, ``"t5"``, ...) built from ``config`` (the
    arguments of its config class), trained with its own loss; padding positions are ignored (label -100)."""

    def __init__(
        self,
        model_type: str = "llama",
        kind: str = "causal",
        config: dict[str, Any] | None = None,
        gradient_checkpointing: bool = False,
        lr: float = 1e-3,
    ) -> None:
        super().__init__()
        import transformers

        if kind not in BUILDERS:
            raise ValueError(f"HFModel(kind={kind!r}): one of {sorted(BUILDERS)}")
        self.save_hyperparameters()
        self.kind, self.lr = kind, lr
        built = transformers.AutoConfig.for_model(model_type, **(config or {}))
        self.model = getattr(transformers, BUILDERS[kind]).from_config(built)
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        labels = ids if mask is None else ids.masked_fill(mask == 0, -100)
        loss = self.model(input_ids=ids, attention_mask=mask, labels=labels).loss
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)
