"""FLOPs that follow the model as it changes under the same batch shape: fine-tuning that unfreezes layers
(Lightning's BackboneFinetuning and its computer_vision_fine_tuning pattern), mode switches, a model that grows."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import BackboneFinetuning, BaseFinetuning
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode

from lit_compute import FlopsLogger

from ..conftest import make_trainer, read_events, scalar_values


def _loader(n: int = 32, features: int = 64, batch: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(n, features, generator=g), torch.randint(0, 4, (n,), generator=g)), batch_size=batch
    )


class TruthPerStep(pl.Callback):
    """torch's own FlopCounterMode on the step's batch, with the model exactly as the step finds it (after every
    fine-tuning callback before this one has run): forward + backward, gradients restored afterwards."""

    def __init__(self) -> None:
        self.truth: dict[int, int] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        x, y = batch
        saved = [p.grad for p in pl_module.parameters()]
        counter = FlopCounterMode(display=False)
        with counter:
            loss = nn.functional.cross_entropy(pl_module(x), y)
            if loss.requires_grad:
                loss.backward()
        for p, g in zip(pl_module.parameters(), saved):
            p.grad = g
        self.truth[trainer.fit_loop.epoch_loop._batches_that_stepped] = counter.get_total_flops()


class Classifier(pl.LightningModule):
    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, x):
        return self.head(self.backbone(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.01)


def _check(tmp_path, model, finetuning, epochs: int = 3) -> tuple[dict, dict]:
    truth = TruthPerStep()
    trainer = make_trainer(
        tmp_path,
        max_epochs=epochs,
        max_steps=-1,
        limit_train_batches=4,
        limit_val_batches=0,
        callbacks=[finetuning, truth, FlopsLogger(peak="none", log_every_n_steps=1)],
    )
    trainer.fit(model, train_dataloaders=_loader())
    logged = dict(scalar_values(read_events(trainer.logger.log_dir), "compute/flops_per_step"))
    assert sorted(logged) == sorted(truth.truth) == list(range(4 * epochs))
    return logged, truth.truth


def test_backbone_finetuning_counts_every_epoch_before_and_after_unfreezing(tmp_path):
    model = Classifier(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU()), nn.Linear(256, 4))
    logged, truth = _check(tmp_path, model, BackboneFinetuning(unfreeze_backbone_at_epoch=1, verbose=False))
    assert logged == {step: pytest.approx(flops, rel=1e-6) for step, flops in truth.items()}  # float32 events
    frozen, unfrozen = truth[0], truth[4]
    assert unfrozen > 2.5 * frozen  # the backbone's backward came in at epoch 1, and the logged count followed it


class Milestones(BaseFinetuning):
    """Lightning's computer_vision_fine_tuning example: the feature extractor frozen, its last layers unfrozen at
    the first milestone, the rest at the second; BatchNorm kept training (``train_bn=True``: its parameters are
    never frozen)."""

    def __init__(self, milestones=(1, 2)) -> None:
        super().__init__()
        self.milestones = milestones

    def freeze_before_training(self, pl_module):
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module, epoch, optimizer):
        if epoch == self.milestones[0]:
            self.unfreeze_and_add_param_group(pl_module.backbone[-4:], optimizer=optimizer, train_bn=True)
        elif epoch == self.milestones[1]:
            self.unfreeze_and_add_param_group(pl_module.backbone[:-4], optimizer=optimizer, train_bn=True)


def test_milestones_finetuning_of_a_cnn_counts_each_stage(tmp_path):
    backbone = nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Flatten(),
    )
    model = Classifier(backbone, nn.Linear(16 * 64, 4))
    logged, truth = _check(tmp_path, model, Milestones())
    assert logged == {step: pytest.approx(flops, rel=1e-6) for step, flops in truth.items()}
    assert truth[0] < truth[4] < truth[8]  # three stages, three counts


def test_a_model_that_grows_between_epochs_is_counted_again(tmp_path):
    class Grows(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 1:
                pl_module.head = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 4))
                trainer.optimizers[0].add_param_group({"params": list(pl_module.head.parameters())})

    model = Classifier(nn.Sequential(nn.Linear(64, 256), nn.ReLU()), nn.Linear(256, 4))
    logged, truth = _check(tmp_path, model, Grows(), epochs=2)
    assert logged == {step: pytest.approx(flops, rel=1e-6) for step, flops in truth.items()}
    assert truth[4] > truth[0]


# -- FLOPs that depend on a batch's values, not only its shapes ----------------------------------------------------
class MaskedEncoder(pl.LightningModule):
    """``nn.TransformerEncoder`` with a padding mask: in eval (validation) it runs the nested-tensor fast path,
    whose FLOPs follow each sequence's real length."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True)
        self.head = nn.Linear(32, 4)

    def forward(self, x, pad):
        return self.head(self.encoder(x, src_key_padding_mask=pad).mean(dim=1))

    def training_step(self, batch, batch_idx):
        x, pad, y = batch
        return nn.functional.cross_entropy(self(x, pad), y)

    def validation_step(self, batch, batch_idx):
        x, pad, y = batch
        self.log("val/loss", nn.functional.cross_entropy(self(x, pad), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _padded(n: int, seq: int = 24) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(2, seq, (n,), generator=g)
    pad = torch.arange(seq)[None, :] >= lengths[:, None]  # True = padding
    return TensorDataset(torch.randn(n, seq, 32, generator=g), pad, torch.randint(0, 4, (n,), generator=g))


def test_a_masked_eval_encoder_is_flagged_as_estimated_with_a_warning_naming_it(tmp_path):
    trainer = make_trainer(
        tmp_path,
        max_steps=2,
        limit_train_batches=2,
        limit_val_batches=4,
        callbacks=[FlopsLogger(peak="none", log_every_n_steps=1)],
    )
    data = _padded(16)
    with pytest.warns(
        UserWarning,
        match=r"depend on their values, not only their shapes "
        r"\(_nested_tensor_from_mask in `encoder`\)",
    ):
        trainer.fit(
            MaskedEncoder(),
            train_dataloaders=DataLoader(data, batch_size=4),
            val_dataloaders=DataLoader(data, batch_size=4),
        )
    acc = read_events(trainer.logger.log_dir)
    assert [v for _, v in scalar_values(acc, "compute/val_flops_estimated")] == [1.0]
    assert "compute/flops_estimated" not in acc.Tags()["scalars"]  # training takes no fast path


class PackedLSTM(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(16, 32, batch_first=True)
        self.head = nn.Linear(32, 4)

    def training_step(self, batch, batch_idx):
        x, lengths, y = batch
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = self.rnn(packed)
        return nn.functional.cross_entropy(self.head(h[-1]), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_packed_lstm_is_flagged_as_estimated(tmp_path):
    g = torch.Generator().manual_seed(2)
    data = TensorDataset(
        torch.randn(24, 20, 16, generator=g),
        torch.randint(3, 21, (24,), generator=g),
        torch.randint(0, 4, (24,), generator=g),
    )
    trainer = make_trainer(
        tmp_path,
        max_steps=6,
        limit_train_batches=6,
        limit_val_batches=0,
        callbacks=[FlopsLogger(peak="none", log_every_n_steps=1)],
    )
    with pytest.warns(UserWarning, match=r"depend on their values.*_pack_padded_sequence"):
        trainer.fit(PackedLSTM(), train_dataloaders=DataLoader(data, batch_size=4))
    flags = dict(scalar_values(read_events(trainer.logger.log_dir), "compute/flops_estimated"))
    assert flags == {0: 0.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0}  # the counted batch is exact for itself


class Branchy(pl.LightningModule):
    """A data-dependent branch, as in Lightning's DQN template: a batch whose flag is set also runs the policy."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(64, 4)
        self.policy = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        if x[0, 0] > 0:  # decided by a value of the batch
            loss = loss + self.policy(x).pow(2).mean()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_data_dependent_branch_is_found_by_a_recount_and_named(tmp_path):
    x = torch.randn(80, 64)
    x[:, 0] = torch.tensor([-1.0 if i < 40 else 1.0 for i in range(80)])  # the branch is taken from batch 10 on
    data = TensorDataset(x, torch.randint(0, 4, (80,)))
    trainer = make_trainer(
        tmp_path,
        max_steps=20,
        limit_train_batches=20,
        limit_val_batches=0,
        callbacks=[FlopsLogger(peak="none", log_every_n_steps=1)],
    )
    with pytest.warns(UserWarning, match=r"same shapes counted differently in `policy`"):
        trainer.fit(Branchy(), train_dataloaders=DataLoader(data, batch_size=4))
    acc = read_events(trainer.logger.log_dir)
    flags = dict(scalar_values(acc, "compute/flops_estimated"))
    # the recount at the signature's 16th occurrence (step 16) found the difference: flagged from there on
    assert flags == {16: 0.0, 17: 1.0, 18: 1.0, 19: 1.0}
    per_step = dict(scalar_values(acc, "compute/flops_per_step"))
    assert per_step[15] == per_step[0] < per_step[16]  # before the recount, the first count was used
    assert per_step[17] == pytest.approx((per_step[0] + per_step[16]) / 2)  # then the mean of the real counts
