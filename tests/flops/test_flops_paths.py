"""FLOPs v2: model and hardware FLOPs, every modern op path, variable shapes, counting that never breaks a step."""

from __future__ import annotations

import dataclasses
import random

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset

from lit_compute import FlopsLogger, count_flops
from lit_compute.flops import SafeFlopCounterMode
from lit_compute.flops.counting import is_heavy_op
from lit_compute.flops.predict import ShapePredictor

from ..conftest import DrivenClock, clocked_trainer, make_trainer, read_events, scalar_values


def _values(acc, tag) -> dict[int, float]:
    return dict(scalar_values(acc, tag))


# -- every op path has a formula ------------------------------------------------------------------------------
@pytest.mark.parametrize(("cell", "gates"), [(nn.LSTM, 4), (nn.GRU, 3), (nn.RNN, 1)])
def test_recurrent_layers_count_in_a_real_cpu_training_step(tmp_path, cell, gates):
    vocab, emb, hidden, batch, steps = 20, 8, 16, 4, 6

    class Seq(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, emb)
            self.rnn = cell(emb, hidden, num_layers=2, batch_first=True)
            self.head = nn.Linear(hidden, vocab)

        def training_step(self, batch, batch_idx):
            (ids,) = batch
            out, _ = self.rnn(self.emb(ids))
            return nn.functional.cross_entropy(self.head(out).flatten(0, 1), ids.flatten())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    tokens = batch * steps
    forward = 2 * tokens * gates * hidden * (emb + hidden) + 2 * tokens * gates * hidden * (2 * hidden)
    forward += 2 * tokens * hidden * vocab
    flops = FlopsLogger(peak="none", log_every_n_steps=1)
    trainer = make_trainer(tmp_path, max_steps=2, callbacks=[flops])
    data = torch.utils.data.TensorDataset(torch.randint(0, vocab, (16, steps)))
    trainer.fit(Seq(), train_dataloaders=DataLoader(data, batch_size=batch))
    logged = _values(read_events(trainer.logger.log_dir), "compute/flops_per_step")
    (count,) = flops.counts.values()
    expected = 3 * forward  # every weight on every step, forward and both gradients
    # but at t=0 the hidden state is zeros that need no gradient: autograd skips d h_0 on the unfused cell path, and
    # the fused oneDNN kernel's d h_0 is hardware FLOPs only, so model FLOPs agree on both paths
    skipped = 2 * 2 * batch * gates * hidden * hidden
    expected -= skipped
    assert logged == {0: expected, 1: expected}
    fused = "aten.mkldnn_rnn_layer" in count.by_op
    assert count.hardware == expected + (skipped if fused else 0)


def test_masked_encoder_in_eval_counts_each_sequence_at_its_own_length():
    e, f, layers = 32, 64, 2
    encoder = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(e, 4, f, batch_first=True, dropout=0.0), layers, enable_nested_tensor=True
    ).eval()
    lengths = [6, 3, 8]
    mask = torch.ones(3, 8, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = False
    with torch.inference_mode():
        count = count_flops(encoder, torch.randn(3, 8, e), src_key_padding_mask=mask, backward=False, count_on="real")
    per_layer = sum(8 * n * e * e + 4 * n * n * e + 4 * n * e * f for n in lengths)
    assert count.errors == []
    assert count.forward == layers * per_layer


def test_bilinear_counts_every_term():
    count = count_flops(nn.Bilinear(5, 6, 7), torch.randn(3, 5), torch.randn(3, 6), backward=False, count_on="real")
    assert count.forward == 2 * 3 * 7 * 5 * 6


def test_heavy_op_names_are_told_from_elementwise_look_alikes():
    for name in (
        "aten._grouped_mm",
        "aten.mkldnn_rnn_layer",
        "aten._cudnn_rnn",
        "aten.mm",
        "aten._int_mm",
        "aten.convolution_overrideable",
        "aten._scaled_dot_product_flash_attention_for_cpu",
        "aten.linear",
    ):
        assert is_heavy_op(name), name
    for name in (
        "aten.lgamma",
        "aten.mvlgamma",
        "aten.upsample_bilinear2d",
        "aten._thnn_fused_lstm_cell",
        "aten.cummax",
        "aten.relu",
        "aten._convert_weight_to_int4pack",
    ):
        assert not is_heavy_op(name), name


# -- model FLOPs and hardware FLOPs ------------------------------------------------------------------------------
class _Checkpointed(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU())
        self.head = nn.Linear(16, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.head(checkpoint(self.inner, x, use_reentrant=False)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_activation_checkpointing_raises_hfu_not_mfu(tmp_path):
    clock = DrivenClock()

    class Clocked(pl.Callback):
        def on_train_batch_start(self, *args):
            clock.advance(0.01)

    trainer = clocked_trainer(
        tmp_path,
        clock,
        max_steps=4,
        limit_train_batches=4,
        callbacks=[Clocked(), FlopsLogger(peak_flops=1e9, log_every_n_steps=1)],
    )
    data = torch.utils.data.TensorDataset(torch.randn(32, 16), torch.randint(0, 4, (32,)))
    trainer.fit(_Checkpointed(), train_dataloaders=DataLoader(data, batch_size=8))
    acc = read_events(trainer.logger.log_dir)
    model_flops, hardware = _values(acc, "compute/flops_per_step"), _values(acc, "compute/hardware_flops_per_step")
    recomputed = 2 * 8 * (16 * 32 + 32 * 16)  # the checkpointed segment's forward, run again in backward
    forward = recomputed + 2 * 8 * 16 * 4
    assert set(model_flops.values()) == {3 * forward - 2 * 8 * 16 * 32}  # the first layer's input needs no gradient
    assert all(hardware[s] - model_flops[s] == recomputed for s in model_flops)
    mfu, hfu = _values(acc, "compute/mfu"), _values(acc, "compute/hfu")
    assert mfu
    assert all(hfu[s] / mfu[s] == pytest.approx(hardware[s] / model_flops[s], rel=1e-5) for s in mfu)


# -- counting never breaks the user's step ------------------------------------------------------------------------
class _GradientPenalty(pl.LightningModule):
    """WGAN-GP's critic loss: a gradient of the output with respect to the input, inside training_step."""

    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        x = x.clone().requires_grad_(True)
        score = self.critic(x)
        (grad,) = torch.autograd.grad(score.sum(), x, create_graph=True)
        return score.mean() + ((grad.norm(2, dim=1) - 1) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def _gpt2(vocab=64):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=vocab, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg)


class _HFCausalLM(pl.LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def training_step(self, batch, batch_idx):
        return self.model(
            input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), labels=batch["input_ids"]
        ).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class _Tokens(Dataset):
    def __init__(self, n=48, vocab=64, lengths=(8, 8), seed=0):
        rng = random.Random(seed)
        self.items = [
            torch.randint(0, vocab, (rng.randint(*lengths),), generator=torch.Generator().manual_seed(i))
            for i in range(n)
        ]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def pad_collate(items):
    """Pad every batch to its own longest sequence, with an attention mask."""
    longest = max(len(t) for t in items)
    ids = torch.zeros(len(items), longest, dtype=torch.long)
    mask = torch.zeros(len(items), longest, dtype=torch.long)
    for i, t in enumerate(items):
        ids[i, : len(t)], mask[i, : len(t)] = t, 1
    return {"input_ids": ids, "attention_mask": mask}


def _lstm_model():
    class LSTMNet(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = nn.LSTM(8, 16, batch_first=True), nn.Linear(16, 1)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return self.head(self.rnn(x.unsqueeze(1).repeat(1, 3, 1))[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return LSTMNet()


CASES = {
    "gradient_penalty": (
        _GradientPenalty,
        lambda: DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 8)), batch_size=8),
    ),
    "gpt2": (
        lambda: _HFCausalLM(_gpt2()),
        lambda: DataLoader(_Tokens(lengths=(6, 12)), batch_size=4, collate_fn=pad_collate),
    ),
    "lstm": (_lstm_model, lambda: DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 8)), batch_size=8)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_training_is_bitwise_identical_with_and_without_flops_logger(tmp_path, case):
    build, loader = CASES[case]

    def run(callbacks):
        pl.seed_everything(7)
        model = build()
        trainer = make_trainer(tmp_path, max_steps=4, limit_train_batches=4, callbacks=callbacks, logger=False)
        trainer.fit(model, train_dataloaders=loader())
        return model.state_dict()

    plain = run([])
    logger = FlopsLogger(peak="none", log_every_n_steps=1)
    counted = run([logger])
    assert logger.counted_batches >= 1
    assert not logger._disabled
    assert plain.keys() == counted.keys()
    for key in plain:
        assert torch.equal(plain[key], counted[key]), key


def test_a_counter_that_raises_as_it_leaves_the_step_warns_once_and_the_run_goes_on(tmp_path, monkeypatch):
    """#47 item 1: ``SafeFlopCounterMode.__exit__`` raising after the mode has left the stack ended the run at step 1;
    FlopsLogger turns itself off with one warning and the weights come out as without it."""
    build, loader = CASES["gradient_penalty"]

    def run(callbacks):
        pl.seed_everything(7)
        model = build()
        trainer = make_trainer(tmp_path, max_steps=4, limit_train_batches=4, callbacks=callbacks, logger=False)
        trainer.fit(model, train_dataloaders=loader())
        return trainer, model.state_dict()

    _, plain = run([])
    original = SafeFlopCounterMode.__exit__

    def exit_then_raise(self, *exc):
        original(self, *exc)
        raise RuntimeError("counter broke on the way out")

    monkeypatch.setattr(SafeFlopCounterMode, "__exit__", exit_then_raise)
    logger = FlopsLogger(peak="none", log_every_n_steps=1)
    with pytest.warns(
        UserWarning,
        match="FlopsLogger: the FLOP counter failed as it left the step .*counter broke on "
        "the way out.*disabled; training goes on",
    ) as caught:
        trainer, counted = run([logger])
    assert trainer.global_step == 4
    assert logger._disabled
    assert sum("counter broke" in str(w.message) for w in caught) == 1
    for key in plain:
        assert torch.equal(plain[key], counted[key]), key


def test_gradient_penalty_step_is_counted_with_its_double_backward(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=2, callbacks=[FlopsLogger(peak="none", log_every_n_steps=1)])
    trainer.fit(_GradientPenalty(), train_dataloaders=CASES["gradient_penalty"][1]())
    logged = _values(read_events(trainer.logger.log_dir), "compute/flops_per_step")
    forward = 2 * 8 * (8 * 16 + 16 * 1)
    assert set(logged) == {0, 1}
    assert all(v > 3 * forward for v in logged.values())


def test_a_formula_that_raises_never_reaches_the_users_code():
    def broken(*args, **kwargs):
        raise RuntimeError("formula exploded")

    lin = nn.Linear(4, 4)
    with SafeFlopCounterMode(display=False, custom_mapping={torch.ops.aten.addmm: broken}) as counter:
        out = lin(torch.randn(2, 4)).sum()
        out.backward()
    assert any("formula exploded" in e for e in counter.errors)
    assert lin.weight.grad is not None


# -- batches of every kind -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class ImageBatch:
    images: torch.Tensor
    labels: torch.Tensor
    source: str = "synthetic"


class Holder:
    """A plain object holding tensors (no .to(), not a dataclass)."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels


class _ShapeShifting(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        side = (16, 24, 32)[(i // 4) % 3]
        return torch.randn(3, side, side), i % 4


class _Conv(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.net(batch.images), batch.labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("kind", [ImageBatch, Holder])
def test_a_custom_batch_object_gets_a_count_per_shape(tmp_path, kind):
    def collate(items):
        return kind(torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items]))

    trainer = make_trainer(
        tmp_path, max_steps=6, limit_train_batches=6, callbacks=[FlopsLogger(peak="none", log_every_n_steps=1)]
    )
    model = _Conv()
    trainer.fit(model, train_dataloaders=DataLoader(_ShapeShifting(), batch_size=4, collate_fn=collate))
    logged = _values(read_events(trainer.logger.log_dir), "compute/flops_per_step")
    expected = {side: count_flops(model.net, torch.zeros(4, 3, side, side)).total for side in (16, 24, 32)}
    assert logged == {step: expected[(16, 24, 32)[step % 3]] for step in range(6)}


# -- variable shapes cost nothing ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_variable_length_batches_are_predicted_exactly(tmp_path):
    torch.manual_seed(0)
    model = _HFCausalLM(_gpt2())
    flops = FlopsLogger(peak="none", log_every_n_steps=1)
    trainer = make_trainer(tmp_path, max_steps=30, limit_train_batches=30, callbacks=[flops])
    data = _Tokens(n=120, lengths=(8, 64), seed=1)
    loader = DataLoader(data, batch_size=4, collate_fn=pad_collate)
    trainer.fit(model, train_dataloaders=loader)
    logged = _values(read_events(trainer.logger.log_dir), "compute/flops_per_step")
    assert sorted(logged) == list(range(30))  # every logging step logs
    batches = list(loader)[:30]
    distinct = {b["input_ids"].shape[1] for b in batches}
    assert len(distinct) > 12
    assert flops.counted_batches <= 8
    assert flops.predicted_batches >= len(distinct) - 8
    for step, batch in enumerate(batches):
        real = count_flops(
            model.model,
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=batch["input_ids"],
            count_on="real",
        ).total
        assert logged[step] == pytest.approx(real, rel=1e-3), step


def test_shape_predictor_refuses_what_it_cannot_fit():
    predictor = ShapePredictor(verify_every=0)

    def sig(h):
        return ("train", (("0", (2, 3, h, h), "float32"),))

    def conv_flops(h):  # a strided convolution rounds the size down: not a polynomial
        return (2 * ((h - 3) // 2 + 1) ** 2 * 27,)

    for h in range(16, 40, 3):
        assert predictor.predict(sig(h)) is None
        predictor.add(sig(h), conv_flops(h))
    assert predictor.predict(sig(41)) is None  # never trusted: it counts for real instead
    quadratic = ShapePredictor(verify_every=0)
    for h in (8, 16, 24, 32, 40):
        quadratic.add(sig(h), (7 * h * h + 3 * h + 11,))
    assert quadratic.predict(sig(100)) == (7 * 100 * 100 + 3 * 100 + 11,)
    assert quadratic.predict(("train", (("0", (3, 3, 100, 100), "float32"),))) is None  # a dimension never seen varying


def test_an_lstm_fed_with_data_has_the_same_model_flops_on_the_kernel_and_the_meta_path(tmp_path):
    """2 layers on CPU: oneDNN's kernel computes the first layer's input gradient and d h_0, which nothing needs;
    the meta path (matmuls under autograd) leaves them out. Model FLOPs agree; hardware FLOPs keep the work."""

    class Tagger(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(48, 96, num_layers=2, batch_first=True)
            self.head = nn.Linear(96, 4)

        def forward(self, x):
            out, _ = self.rnn(x)
            return self.head(out[:, -1])

        def training_step(self, batch, batch_idx):
            return nn.functional.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model, x = Tagger(), torch.randn(8, 20, 48)
    flops = FlopsLogger(peak="none", log_every_n_steps=1)
    trainer = make_trainer(tmp_path, max_steps=1, callbacks=[flops])
    trainer.fit(
        model, train_dataloaders=DataLoader(torch.utils.data.TensorDataset(x, torch.randint(0, 4, (8,))), batch_size=8)
    )
    (kernel,) = flops.counts.values()
    meta = count_flops(model, x, count_on="meta")
    assert kernel.total == meta.total
    if "aten.mkldnn_rnn_layer" in kernel.by_op:
        unneeded = 2 * 8 * 20 * (4 * 96 * 48) + 2 * 2 * 8 * (4 * 96 * 96)  # first layer's d input; d h_0 per layer
        assert kernel.hardware == kernel.total + unneeded
