"""FlopsLogger end to end: what lands in the event files."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.flop_counter import flop_registry

from lit_compute import FlopsLogger, count_flops
from lit_compute.flops import chip_for_name, measure_peak_flops, peak_flops

from ..conftest import (
    TwoOptimizerGAN,
    make_trainer,
    read_events,
    scalar_values,
    text_values,
    tiny_data,
    tiny_model,
)


def _all_close(points, expected) -> bool:
    return bool(points) and all(v == pytest.approx(expected, rel=1e-5) for _, v in points)


COMPUTE_TAGS = {
    "compute/flops_per_step",
    "compute/flops_per_sample",
    "compute/tflops_per_sec",
    "compute/global_tflops_per_sec",
    "compute/mfu",
    "compute/peak_tflops",
}


def test_event_file_tags_mfu_and_counts(tmp_path):
    model, data = tiny_model(), tiny_data()
    cb = FlopsLogger(peak_flops=1e11, log_every_n_steps=2)
    trainer = make_trainer(
        tmp_path, max_steps=6, limit_train_batches=6, callbacks=[cb], limit_val_batches=2, val_check_interval=3
    )
    trainer.fit(model, datamodule=data)
    acc = read_events(trainer.logger.log_dir)
    tags = set(acc.Tags()["scalars"])
    assert tags >= COMPUTE_TAGS
    assert {"compute/val_flops_per_step", "compute/val_tflops_per_sec", "compute/val_mfu"} <= tags
    # MFU = achieved / peak, per logged step
    tflops = dict(scalar_values(acc, "compute/global_tflops_per_sec"))
    for step, mfu in scalar_values(acc, "compute/mfu"):
        assert mfu == pytest.approx(tflops[step] / 0.1, rel=1e-5)
    assert _all_close(scalar_values(acc, "compute/peak_tflops"), 0.1)
    # the count is the model's forward + backward for one batch
    x = torch.zeros(8, 3, 32, 32)
    expected = count_flops(model.train(), x).total
    assert _all_close(scalar_values(acc, "compute/flops_per_step"), expected)
    assert _all_close(scalar_values(acc, "compute/flops_per_sample"), expected / 8)
    table = text_values(acc, "compute/flops_by_module")
    assert table
    assert "layer1" in table[0]
    assert "fwd+bwd GFLOPs" in table[0]


def test_gradient_accumulation_counts_every_micro_batch(tmp_path):
    cb = FlopsLogger(peak="none", log_every_n_steps=1)
    trainer = make_trainer(tmp_path, max_steps=3, limit_train_batches=8, accumulate_grad_batches=2, callbacks=[cb])
    model = tiny_model()
    trainer.fit(model, datamodule=tiny_data())
    per_batch = count_flops(model.train(), torch.zeros(8, 3, 32, 32)).total
    acc = read_events(trainer.logger.log_dir)
    assert _all_close(scalar_values(acc, "compute/flops_per_step"), 2 * per_batch)
    assert "compute/mfu" not in acc.Tags()["scalars"]  # peak="none": no MFU, not a zero


class _VariableShapes(Dataset):
    """Batches alternate between 32x32 and 48x48 images (a multi-resolution loader)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        side = 32 if (i // 2) % 2 == 0 else 48
        return torch.randn(3, side, side), i % 4


def test_variable_batch_shapes_get_their_own_counts(tmp_path):
    cb = FlopsLogger(peak="none", log_every_n_steps=1)
    trainer = make_trainer(tmp_path, max_steps=4, limit_train_batches=4, callbacks=[cb], limit_val_batches=0)
    model = tiny_model()
    trainer.fit(model, train_dataloaders=DataLoader(_VariableShapes(), batch_size=2))
    train_sigs = [s for s in cb.counts if s[0] == "train"]
    assert len(train_sigs) == 2
    got = sorted(c.total for c in cb.counts.values() if c is not None)
    model.train()
    assert got == [count_flops(model, torch.zeros(2, 3, side, side)).total for side in (32, 48)]
    assert got[1] > 2 * got[0]


def test_training_is_bitwise_identical_with_and_without(tmp_path):
    def run(callbacks):
        pl.seed_everything(123)
        model = tiny_model()
        trainer = make_trainer(
            tmp_path, max_steps=4, limit_train_batches=4, callbacks=callbacks, logger=False, limit_val_batches=1
        )
        trainer.fit(model, datamodule=tiny_data())
        return model.state_dict()

    plain = run([])
    counted = run([FlopsLogger(peak="none", log_every_n_steps=1)])
    assert plain.keys() == counted.keys()
    for key in plain:
        assert torch.equal(plain[key], counted[key]), key


class _Elementwise(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return ((x * self.scale) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Linear(_Elementwise):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.lin(x).pow(2).mean()


def _loader():
    return DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4)


def test_model_with_nothing_to_count_warns_and_logs_nothing(tmp_path):
    cb = FlopsLogger(peak="none", log_every_n_steps=1)
    trainer = make_trainer(tmp_path, max_steps=4, callbacks=[cb])
    with pytest.warns(UserWarning, match="could not count the FLOPs"):
        trainer.fit(_Elementwise(), train_dataloaders=_loader())
    assert trainer.global_step == 4
    assert not [t for t in read_events(trainer.logger.log_dir).Tags()["scalars"] if t.startswith("compute/")]


def test_failing_formula_warns_once_and_training_goes_on(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("formula exploded")

    for op in (torch.ops.aten.addmm, torch.ops.aten.mm):
        monkeypatch.setitem(flop_registry, op, broken)
    cb = FlopsLogger(peak="none", log_every_n_steps=1)
    trainer = make_trainer(tmp_path, max_steps=4, callbacks=[cb])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(_Linear(), train_dataloaders=_loader())
    messages = [str(w.message) for w in caught if "FlopsLogger" in str(w.message)]
    assert len(messages) == 1
    assert "formula exploded" in messages[0]
    assert trainer.global_step == 4
    assert not [t for t in read_events(trainer.logger.log_dir).Tags()["scalars"] if t.startswith("compute/")]


def test_table_peak_missing_on_cpu_warns_and_measure_works(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=2, callbacks=[FlopsLogger(log_every_n_steps=1)])
    with pytest.warns(UserWarning, match="no peak for cpu device"):
        trainer.fit(tiny_model(), datamodule=tiny_data())
    assert "compute/mfu" not in read_events(trainer.logger.log_dir).Tags()["scalars"]
    assert measure_peak_flops("cpu", torch.float32, size=256, seconds=0.05) > 1e8


def test_compiled_module_counts_like_the_original(tmp_path):
    class Compiled(_Linear):
        def configure_model(self):
            self.lin = torch.compile(self.lin, backend="aot_eager")

    counts = []
    for cls in (_Linear, Compiled):
        cb = FlopsLogger(peak="none", log_every_n_steps=1)
        trainer = make_trainer(tmp_path / cls.__name__, max_steps=2, callbacks=[cb])
        trainer.fit(cls(), train_dataloaders=_loader())
        counts.append([c.total for c in cb.counts.values()])
    assert counts[0] == counts[1]
    assert counts[0][0] > 0


@pytest.mark.parametrize(
    ("name", "chip"),
    [
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA L40S", "l40s"),
        ("Tesla V100-SXM2-16GB", "v100-sxm"),
        ("Tesla V100-PCIE-32GB", "v100-pcie"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA T1000", None),
    ],
)
def test_peak_table_name_matching(name, chip):
    assert chip_for_name(name) == chip


def test_peak_values_are_dense_and_tf32_aware():
    assert peak_flops("NVIDIA H200", torch.bfloat16) == pytest.approx(989.4e12)  # not the 1979 sparse figure
    assert peak_flops("NVIDIA L40S", torch.bfloat16) == pytest.approx(362.05e12)
    assert peak_flops("NVIDIA L4", torch.bfloat16) == pytest.approx(121e12)
    assert peak_flops("Tesla V100-SXM2-16GB", torch.bfloat16) is None  # no bf16 tensor cores
    assert peak_flops("cpu", torch.float32) is None
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, False
        assert peak_flops("NVIDIA A100-SXM4-80GB", torch.float32) == pytest.approx(19.5e12)
        torch.backends.cudnn.allow_tf32 = True  # convolutions on TF32 (torch's default)
        assert peak_flops("NVIDIA A100-SXM4-80GB", torch.float32) == pytest.approx(156e12)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = True, False
        assert peak_flops("NVIDIA A100-SXM4-80GB", torch.float32) == pytest.approx(156e12)
        # pre-Ampere: no TF32 units, the switches change nothing
        torch.backends.cudnn.allow_tf32 = True
        assert peak_flops("Tesla V100-SXM2-16GB", torch.float32) == pytest.approx(15.7e12)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_float32_peak_weighs_convolutions_and_matmuls_by_their_own_tf32_switch():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    by_op = {"aten.convolution": 3e9, "aten.convolution_backward": 6e9, "aten.mm": 1e9}
    try:
        # torch's defaults: convolutions on TF32 (156 TF on A100), matmuls in full float32 (19.5 TF)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True
        expected = 10e9 / (9e9 / 156e12 + 1e9 / 19.5e12)
        assert peak_flops("NVIDIA A100-SXM4-80GB", torch.float32, by_op) == pytest.approx(expected)
        # a transformer (matmuls only) counts against the float32 peak, not TF32
        assert peak_flops("NVIDIA A100-SXM4-80GB", torch.float32, {"aten.mm": 1e9}) == pytest.approx(19.5e12)
        torch.backends.cuda.matmul.allow_tf32 = True
        assert peak_flops("NVIDIA A100-SXM4-80GB", torch.float32, by_op) == pytest.approx(156e12)
        assert peak_flops("NVIDIA A100-SXM4-80GB", torch.bfloat16, by_op) == pytest.approx(312e12)  # not float32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"FlopsLogger\(peak='fast'\)"):
        FlopsLogger(peak="fast")
    with pytest.raises(ValueError, match=r"FlopsLogger\(log_every_n_steps=0\)"):
        FlopsLogger(log_every_n_steps=0)
    with pytest.raises(ValueError, match=r"FlopsLogger\(peak_flops=-1"):
        FlopsLogger(peak_flops=-1)


def test_the_first_validation_counts_every_batch_its_counted_ones_included(tmp_path):
    """Batches of 4, 4 and 2 samples: the first validation counts two shapes for real; its FLOPs per step is the
    mean over all three batches (2 x B x 64 x 32 each), as every later validation's is."""

    class Linear(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(64, 32, bias=False)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            self.log("val/loss", self.layer(batch[0]).pow(2).mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(10, 64))
    trainer = make_trainer(
        tmp_path,
        max_steps=4,
        limit_train_batches=2,
        limit_val_batches=3,
        check_val_every_n_epoch=1,
        callbacks=[FlopsLogger(peak="none")],
    )
    trainer.fit(
        Linear(), train_dataloaders=DataLoader(data, batch_size=4), val_dataloaders=DataLoader(data, batch_size=4)
    )
    per_step = scalar_values(read_events(trainer.logger.log_dir), "compute/val_flops_per_step")
    exact = (2 * 4 * 64 * 32 * 2 + 2 * 2 * 64 * 32) / 3
    assert [v for _, v in per_step] == [pytest.approx(exact)] * 2  # two validations, the first one exact too


def test_a_module_the_tracker_cannot_name_is_said_and_the_totals_stay_whole(tmp_path, monkeypatch):
    from lit_compute.flops.module_tracker import HooklessModuleTracker

    original = HooklessModuleTracker._get_mod_name

    def fails_on_linear(self, mod):
        if isinstance(mod, nn.Linear):
            raise KeyError("no name for this module")
        return original(self, mod)

    monkeypatch.setattr(HooklessModuleTracker, "_get_mod_name", fails_on_linear)
    flops = FlopsLogger(peak="none", log_every_n_steps=1)
    trainer = make_trainer(tmp_path, max_steps=1, callbacks=[flops])
    with pytest.warns(UserWarning, match=r"could not name Linear \(KeyError: 'no name for this module'\).*incomplete"):
        trainer.fit(tiny_model(), datamodule=tiny_data())
    (count,) = [c for sig, c in flops.counts.items() if sig[0] == "train"]
    assert count.total > 0
    assert not any(path.endswith("fc") for path in count.by_module)


class _PaddedEncoder(pl.LightningModule):
    """A user's padded-sequence model: ``nn.TransformerEncoder`` with a padding mask (its evaluation fast path builds
    nested tensors), and a head of its own that runs a Linear on a nested tensor (ops torch's FlopCounterMode tried
    to decompose, and the decomposition reads sizes() a nested tensor refuses)."""

    def __init__(self, norm_first: bool = True, nested_head: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=norm_first)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)
        self.proj = nn.Linear(32, 32)
        self.head = nn.Linear(32, 2)
        self.nested_head = nested_head

    def forward(self, x, mask):
        h = self.enc(self.emb(x), src_key_padding_mask=mask)
        if self.nested_head:
            h = self.proj(torch._nested_tensor_from_mask(h, ~mask)).to_padded_tensor(0.0, h.shape)
        return self.head(h.mean(1))

    def training_step(self, batch, batch_idx):
        x, mask, y = batch
        return nn.functional.cross_entropy(self(x, mask), y)

    def validation_step(self, batch, batch_idx):
        x, mask, y = batch
        self.log("val/loss", nn.functional.cross_entropy(self(x, mask), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _padded_loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 50, (32, 12), generator=g)
    mask = torch.zeros(32, 12, dtype=torch.bool)
    mask[:, 8:] = True
    mask[::2, 5:] = True
    return DataLoader(TensorDataset(x, mask, torch.randint(0, 2, (32,), generator=g)), batch_size=8)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true"])
def test_nested_tensors_in_the_users_model_never_end_the_run(tmp_path, precision):
    """No exception from inside a counting pass reaches the user's step: nested tensors through fit and validation
    under every precision, the FLOPs still logged, and training bitwise as without FlopsLogger."""
    from lit_compute import FP32BatchNormHalfPrecision

    def run(callbacks, root):
        plugins = [FP32BatchNormHalfPrecision(fp32_norms=["LayerNorm"])] if precision == "bf16-true" else []
        kwargs = {} if plugins else {"precision": precision}
        trainer = make_trainer(
            root,
            max_steps=4,
            limit_train_batches=4,
            val_check_interval=2,
            limit_val_batches=2,
            callbacks=callbacks,
            plugins=plugins,
            **kwargs,
        )
        # post-norm layers take the fused fast path in evaluation (bf16-true: float32 LayerNorms fed bfloat16 nested
        # tensors); under CPU autocast that fast path fails in torch itself, so bf16-mixed runs pre-norm layers
        model = _PaddedEncoder(norm_first=precision == "bf16-mixed")
        trainer.fit(model, _padded_loader(), _padded_loader())
        return trainer, model.state_dict()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, plain = run([], tmp_path / "plain")
        trainer, counted = run([FlopsLogger(peak="none", log_every_n_steps=1)], tmp_path / "counted")
    assert trainer.global_step == 4
    for key in plain:
        assert torch.equal(plain[key], counted[key]), key
    acc = read_events(trainer.logger.log_dir)
    assert scalar_values(acc, "compute/flops_per_step")
    assert scalar_values(acc, "val/loss")


def test_a_counted_batch_writes_its_flops_and_bytes_by_op_class(tmp_path):
    from lit_compute.run_record import read_record

    trainer = make_trainer(tmp_path, max_steps=2, callbacks=[FlopsLogger(peak="none", log_every_n_steps=1)])
    model = tiny_model()
    trainer.fit(model, datamodule=tiny_data())
    acc = read_events(trainer.logger.log_dir)
    (text,) = text_values(acc, "compute/op_classes")
    assert "| optimizer |" in text
    assert "<!--" not in text
    data = read_record(trainer.logger.log_dir).op_classes
    assert data["samples"] == 8
    assert data["parameters"] == sum(p.numel() for p in model.parameters())
    # Adam's step its own class; the ResNet's convolutions theirs, apart from its classifier's matmul
    assert set(data["by_class"]) >= {"conv", "matmul", "norm", "elementwise", "optimizer"}
    assert data["by_class"]["conv"][0] + data["by_class"]["matmul"][0] == data["hardware_flops"]
    assert data["by_class"]["conv"][0] > 100 * data["by_class"]["matmul"][0]
    # the ResNet convolves channels-first: the tensors a GPU would transpose at 16 bits are kept for whatif. Each
    # convolution's weight is transposed by its forward, its data gradient and its weight gradient (the stem has no
    # data gradient: the images need none); each of those calls transposes three tensors
    activations, weights, tensors = data["channels_first_conv"]
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    conv_bytes = [m.weight.numel() * m.weight.element_size() for m in convs]
    assert weights == 3 * sum(conv_bytes) - conv_bytes[0]
    assert data["conv_weights"] == sum(conv_bytes)  # each weight once a forward: what a CPU reorders every call
    assert tensors == 3 * (3 * len(convs) - 1)
    assert activations > 0
    assert scalar_values(acc, "compute/bytes_per_step")[0][1] == pytest.approx(
        sum(v[1] for v in data["by_class"].values()), rel=1e-6
    )  # one batch a step: the step's bytes are its
    (table,) = text_values(acc, "compute/flops_by_module")
    assert "| MB moved | FLOP/byte |" in table.replace("  ", " ")


def test_the_op_class_table_holds_the_optimizers_step_once_under_accumulation(tmp_path):
    """An accumulated step's first batch steps no optimizer: the first batch that does is counted too, so the table
    whatif prices holds the optimizer; the step's bytes hold it once, not once a micro-batch; every step has its
    FLOPs, the first included."""
    from lit_compute.run_record import read_record

    def run(accumulate, folder):
        trainer = make_trainer(
            tmp_path / folder,
            max_steps=2,
            limit_train_batches=8,
            accumulate_grad_batches=accumulate,
            callbacks=[FlopsLogger(peak="none", log_every_n_steps=1)],
        )
        trainer.fit(tiny_model(), datamodule=tiny_data())
        return read_record(trainer.logger.log_dir).op_classes, read_events(trainer.logger.log_dir)

    (plain, _), (accumulated, acc) = run(1, "plain"), run(2, "accumulated")
    assert accumulated["accumulate_grad_batches"] == 2
    assert accumulated["by_class"]["optimizer"] == plain["by_class"]["optimizer"]
    optimizer = plain["by_class"]["optimizer"][1]
    # the counted batch adds its gradients to the first batch's (12 bytes a parameter more than a fresh backward)
    batch = sum(v[1] for k, v in accumulated["by_class"].items() if k != "optimizer")
    fresh = sum(v[1] for k, v in plain["by_class"].items() if k != "optimizer")
    assert batch - fresh == pytest.approx(12 * accumulated["trainable_parameters"], rel=0.01)
    assert optimizer > 0
    assert scalar_values(acc, "compute/bytes_per_step")[-1][1] == pytest.approx(2 * batch + optimizer)
    assert [step for step, _ in scalar_values(acc, "compute/flops_per_step")] == [0, 1]


def test_a_forward_after_an_optimizers_step_keeps_its_own_op_classes(tmp_path):
    """A GAN under manual optimization: the generator's pass after the discriminator's step is matmuls, not the
    optimizer's step (its ops have no FLOPs), so every FLOP of the batch is in the matmul class."""
    from lit_compute.run_record import read_record

    trainer = make_trainer(
        tmp_path, max_steps=2, limit_val_batches=0, callbacks=[FlopsLogger(peak="none", log_every_n_steps=1)]
    )
    trainer.fit(TwoOptimizerGAN(), DataLoader(TensorDataset(torch.randn(16, 8)), batch_size=4))
    data = read_record(trainer.logger.log_dir).op_classes
    assert data["by_class"]["optimizer"][0] == 0
    assert data["by_class"]["optimizer"][2] > 0
    assert data["by_class"]["matmul"][0] == data["hardware_flops"] > 0
