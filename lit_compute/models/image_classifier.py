"""ImageClassifier: a LightningModule around any torchvision classification model."""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

import torch
import torchvision
from lightning.pytorch import LightningModule
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from lit_compute import _compat
from lit_compute._validate import Check, validated


def classification_models() -> list[str]:
    """Names of torchvision's classification models (what ``arch`` accepts)."""
    return sorted(torchvision.models.list_models(module=torchvision.models))


class ImageClassifier(LightningModule):
    """Image classification with any torchvision classification model, trained from scratch.

    The network is built with ``weights=None`` (nothing is ever downloaded). Loss: cross-entropy.

    Logged metrics:
        - ``train/loss``: training loss, every step.
        - ``val/loss``: validation loss, per epoch.
        - ``val/acc``: validation top-1 accuracy (torchmetrics), per epoch.

    Args:
        arch: A torchvision classification model name (``torchvision.models.list_models(module=torchvision.models)``).
        num_classes: Output classes.
        lr: Learning rate.
        weight_decay: Decoupled weight decay (AdamW) or L2 (SGD).
        optimizer: ``"adamw"`` or ``"sgd"`` (momentum 0.9, Nesterov).
        scheduler: ``"none"`` or ``"cosine"`` (cosine decay over the run's optimizer steps).
        label_smoothing: Cross-entropy label smoothing.
        channels_last: Keep weights and inputs in channels-last memory format (faster convolutions on
            tensor-core GPUs and with oneDNN on CPU).
        compile: ``torch.compile`` the network in ``configure_model``.
        model_kwargs: Extra keyword arguments for the torchvision builder (e.g. ``{"image_size": 64}`` for ViT).

    Raises:
        ValueError: unknown ``arch`` (the message lists valid names) or bad values.

    Example:
        >>> model = ImageClassifier("resnet18", num_classes=10)
        >>> model(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    @property
    def hp(self) -> Any:
        """``self.hparams`` (Lightning types it as a mapping; its keys read as attributes)."""
        return self.hparams

    @validated
    def __init__(
        self,
        arch: str = "resnet18",
        num_classes: Annotated[int, Check(ge=2)] = 10,
        lr: Annotated[float, Check(gt=0)] = 1e-3,
        weight_decay: Annotated[float, Check(ge=0)] = 1e-4,
        optimizer: Literal["adamw", "sgd"] = "adamw",
        scheduler: Literal["none", "cosine"] = "none",
        label_smoothing: Annotated[float, Check(ge=0.0, lt=1.0)] = 0.0,
        channels_last: bool = False,
        compile: bool = False,
        model_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        valid = classification_models()
        if arch not in valid:
            few = ", ".join(
                n for n in ("resnet18", "resnet50", "mobilenet_v3_small", "efficientnet_b0", "vit_b_16") if n in valid
            )
            raise ValueError(
                f"ImageClassifier(arch={arch!r}) is not a torchvision classification model; valid names include "
                f"{few} ({len(valid)} in all: torchvision.models.list_models(module=torchvision.models))"
            )
        self.save_hyperparameters()
        kwargs = dict(model_kwargs or {})
        if arch in ("inception_v3", "googlenet"):
            kwargs.setdefault("aux_logits", False)
            kwargs.setdefault("init_weights", True)
        self.net: nn.Module = torchvision.models.get_model(arch, weights=None, num_classes=num_classes, **kwargs)
        if channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        self.val_acc = MulticlassAccuracy(num_classes=num_classes)

    def setup(self, stage: str) -> None:
        # An example image at the datamodule's size, so Lightning's model summary reports this model's real FLOPs
        size = getattr(getattr(self._trainer, "datamodule", None), "image_size", None) if self._trainer else None
        if self.example_input_array is None and isinstance(size, int):
            self.example_input_array = torch.zeros(1, 3, size, size)

    def configure_model(self) -> None:
        if self.hp.compile and _compat.compiled_original(self.net) is None:
            self.net = cast(nn.Module, torch.compile(self.net))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hp.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        out = self.net(x)
        return out if isinstance(out, torch.Tensor) else out[0]  # Inception/GoogLeNet named tuples

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.criterion(self(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val/loss", self.criterion(logits, y), prog_bar=True, sync_dist=True)
        self.val_acc(logits, y)
        self.log("val/acc", self.val_acc, prog_bar=True)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("test/loss", self.criterion(logits, y), sync_dist=True)
        self.log("test/acc", (logits.argmax(-1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> Any:
        hp = self.hp
        opt: torch.optim.Optimizer
        if hp.optimizer == "sgd":
            opt = torch.optim.SGD(
                self.parameters(), lr=hp.lr, momentum=0.9, nesterov=True, weight_decay=hp.weight_decay
            )
        else:
            opt = torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        if hp.scheduler == "cosine":
            total = max(1, int(self.trainer.estimated_stepping_batches))
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
        return opt
