"""FP32BatchNormPrecision on CPU (bf16/fp16 autocast work on CPU): norms in float32, statistics, refusals,
SyncBatchNorm."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from lit_compute import FP32BatchNormHalfPrecision, FP32BatchNormPrecision
from lit_compute.precision import fp32_norm_precision

from ..conftest import SpawnDDP, make_trainer
from .conftest import _ConvNet, _loader

EXPECTED_OTHER = {"16-mixed": torch.float32, "bf16-mixed": torch.float32, "bf16-true": torch.bfloat16}


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed", "bf16-true"])
def test_norms_stay_float32_and_others_have_the_mode_dtype(tmp_path, precision):
    # a small conv net with a BatchNorm and a GroupNorm: bf16 is what this tests, so its work is small enough for a
    # CPU without bf16 instructions (where a ResNet-18's bf16 steps took 14-17 s)
    model = _ConvNet()
    plugin = fp32_norm_precision(precision, fp32_norms=["BatchNorm", "GroupNorm"])
    trainer = make_trainer(tmp_path, max_steps=3, plugins=[plugin], limit_val_batches=0)
    trainer.fit(model, train_dataloaders=_loader(n=24))
    norms = [m for m in model.modules() if isinstance(m, (_BatchNorm, nn.GroupNorm))]
    assert len(norms) == 2
    for m in norms:
        buffers = [m.running_mean, m.running_var] if isinstance(m, _BatchNorm) else []
        for t in [*m.parameters(), *buffers]:
            assert t.dtype == torch.float32
    others = [p for n, p in model.named_parameters() if not any(p is q for m in norms for q in m.parameters())]
    assert {p.dtype for p in others} == {EXPECTED_OTHER[precision]}
    assert trainer.precision == precision


@pytest.mark.parametrize(("capability", "warned"), [("AVX2", True), ("AVX512", False)])
def test_bf16_on_a_cpu_without_bf16_instructions_says_so_once_with_the_fix(tmp_path, monkeypatch, capability, warned):
    import platform
    import warnings

    from lit_compute.precision import fp32_batchnorm_precision as module

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(module, "_SLOW_BF16_WARNED", set())
    said = []
    plugins = (
        FP32BatchNormPrecision("bf16-mixed"),
        FP32BatchNormPrecision("bf16-mixed"),
        FP32BatchNormHalfPrecision("bf16-true"),
    )
    for i, plugin in enumerate(plugins):
        trainer = make_trainer(tmp_path / str(i), max_steps=1, limit_val_batches=0, plugins=[plugin])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(_ConvNet(), train_dataloaders=_loader(n=8))
        said += [str(w.message) for w in caught if "AVX512-BF16" in str(w.message)]
    if warned:  # once per plugin class in a process, however many trainers
        assert [text.split("(")[0] for text in said] == ["FP32BatchNormPrecision", "FP32BatchNormHalfPrecision"]
        assert "AVX2" in said[0]
        assert "'32-true'" in said[0]
    else:
        assert said == []


def test_group_norm_kept_in_float32_when_named(tmp_path):
    model = _ConvNet()
    trainer = make_trainer(
        tmp_path, max_steps=2, plugins=[FP32BatchNormHalfPrecision("bf16-true", fp32_norms=["BatchNorm", "GroupNorm"])]
    )
    trainer.fit(model, train_dataloaders=_loader())
    assert model.gn.weight.dtype == torch.float32
    assert model.conv.weight.dtype == torch.bfloat16


def test_bf16_true_model_summary_forwards_the_example_input(tmp_path):
    """Lightning's model summary forwards ``example_input_array`` unconverted; the plugin converts it with the
    weights, so a bf16-true run of a model with an example input starts (it failed with a dtype mismatch)."""
    model = _ConvNet()
    model.example_input_array = torch.randn(2, 3, 8, 8)
    trainer = pl.Trainer(
        default_root_dir=tmp_path,
        accelerator="cpu",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=True,
        plugins=[FP32BatchNormHalfPrecision("bf16-true")],
    )
    trainer.fit(model, train_dataloaders=_loader())
    assert model.example_input_array.dtype == torch.bfloat16
    assert trainer.global_step == 1


def _running_stats(precision_kwargs, steps=8):
    pl.seed_everything(0)
    model = _ConvNet(scale=3.0)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **precision_kwargs,
    )
    trainer.fit(model, train_dataloaders=_loader(n=64))
    return model.bn.running_mean.float(), model.bn.running_var.float()


def test_batchnorm_statistics_track_float32_closer_than_plain_low_precision():
    ref_mean, ref_var = _running_stats({"precision": "32-true"})
    ours_mean, ours_var = _running_stats({"plugins": [FP32BatchNormHalfPrecision("bf16-true")]})
    plain_mean, plain_var = _running_stats({"precision": "bf16-true"})  # Lightning: BatchNorm in bf16 too

    def err(a, b):
        return float((a - b).abs().max() / b.abs().max())

    assert err(ours_var, ref_var) < 0.02
    assert err(ours_mean, ref_mean) < 0.02
    assert err(ours_var, ref_var) < err(plain_var, ref_var)
    assert err(ours_mean, ref_mean) < err(plain_mean, ref_mean)


def test_huge_activation_keeps_running_variance_finite():
    def fit(**kwargs):
        pl.seed_everything(0)
        model = _ConvNet(scale=2000.0)  # variance ~1e7: above float16's 65504
        trainer = pl.Trainer(
            accelerator="cpu",
            max_steps=2,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            **kwargs,
        )
        trainer.fit(model, train_dataloaders=_loader())
        return model.bn.running_var

    plain = fit(precision="16-true")  # plain float16 BatchNorm
    ours = fit(plugins=[FP32BatchNormPrecision("16-mixed")])
    assert not torch.isfinite(plain).all()
    assert torch.isfinite(ours).all()
    assert ours.max() > 65504


def test_16_true_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"precision='16-true'.*master weights.*16-mixed"):
        FP32BatchNormPrecision("16-true")
    with pytest.raises(ValueError, match=r"precision='64-true'"):
        FP32BatchNormPrecision("64-true")
    with pytest.raises(ValueError, match=r"backoff_factor=2"):
        FP32BatchNormPrecision("16-mixed", backoff_factor=2)


def _norm_dtypes(module) -> list[str]:
    rows = [
        f"{name} {m.weight.dtype} {m.running_var.dtype}"
        for name, m in module.named_modules()
        if isinstance(m, nn.SyncBatchNorm)
    ]
    conv = next(m for m in module.modules() if isinstance(m, nn.Conv2d))
    return rows + [f"conv {conv.weight.dtype}"]


class _RecordingDDP(SpawnDDP):
    """Records the norms' dtypes where DDP wraps the model (after Lightning's SyncBatchNorm conversion and the
    precision plugin's in-place conversion). DDP refuses SyncBatchNorm on CPU modules, so on CPU the layers are
    then turned back into BatchNorm to let the two processes train; a GPU run keeps them (test below)."""

    def __init__(self, out_dir, **kwargs):
        super().__init__(**kwargs)
        self.out_dir = out_dir

    def configure_ddp(self):
        (self.out_dir / f"rank{self.global_rank}.txt").write_text("\n".join(_norm_dtypes(self.model)))
        if self.root_device.type == "cpu":
            _revert_sync_batchnorm(self.model)
        super().configure_ddp()


def _revert_sync_batchnorm(module):
    for name, child in module.named_children():
        if isinstance(child, nn.SyncBatchNorm):
            bn = nn.BatchNorm2d(child.num_features, child.eps, child.momentum, child.affine, child.track_running_stats)
            bn.load_state_dict(child.state_dict())
            setattr(module, name, bn)
        else:
            _revert_sync_batchnorm(child)


@pytest.mark.slow
def test_sync_batchnorm_under_ddp_spawn_is_float32(tmp_path):
    trainer = make_trainer(
        tmp_path,
        max_steps=2,
        devices=2,
        strategy=_RecordingDDP(tmp_path),
        sync_batchnorm=True,
        plugins=[FP32BatchNormHalfPrecision("bf16-true")],
        logger=False,
    )
    trainer.fit(_ConvNet(), train_dataloaders=_loader())
    for rank in (0, 1):
        lines = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert lines == ["bn torch.float32 torch.float32", "conv torch.bfloat16"]


@pytest.mark.multi_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="SyncBatchNorm training needs two CUDA devices")
def test_sync_batchnorm_trains_float32_on_two_gpus(tmp_path):
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=2,
        strategy=_RecordingDDP(tmp_path),
        sync_batchnorm=True,
        plugins=[FP32BatchNormPrecision("bf16-mixed")],
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(_ConvNet(), train_dataloaders=_loader())
    assert (tmp_path / "rank1.txt").read_text().splitlines()[0] == "bn torch.float32 torch.float32"


def test_each_refusal_of_16_true_recommends_only_what_can_be_used():
    with pytest.raises(ValueError, match="precision='16-mixed'") as mixed:
        FP32BatchNormPrecision("16", "cpu")
    assert "precision='16-mixed'" in str(mixed.value)
    assert "FP32BatchNormHalfPrecision('bf16-true')" in str(mixed.value)
    assert "precision='bf16-true'" not in str(mixed.value)  # this class refuses bf16-true: it must not suggest it
    with pytest.raises(ValueError, match="precision='bf16-true'") as half:
        FP32BatchNormHalfPrecision("16-true")
    assert "precision='bf16-true'" in str(half.value)
    assert "FP32BatchNormPrecision('16-mixed')" in str(half.value)


@pytest.mark.parametrize(
    ("capability", "measured", "picked"),
    [
        ("AVX2", None, "32-true"),  # no bf16 instructions: float32 without measuring
        ("AVX512", (False, "bf16 autocast runs training blocks at 0.62x float32's speed here"), "32-true"),
        ("AVX512", (True, "bf16 autocast runs training blocks at 2.05x float32's speed here"), "bf16-mixed"),
    ],
    ids=["avx2", "avx512-slow", "avx512-fast"],
)
def test_slow_bf16_float32_picks_the_precision_by_the_rule_and_says_which(
    tmp_path, monkeypatch, capability, measured, picked
):
    """The demo's rule (#48): bf16 where it is fast on this run's device, float32 where it is not; the choice is
    what trains (the convolution's output dtype), what ``trainer.precision`` reads, and one line on the console."""
    import platform

    from lit_compute.hardware import this_machine

    asked: list[str] = []

    def bf16_fast(device: str = "cpu"):
        asked.append(device)
        return measured

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(this_machine, "bf16_fast", bf16_fast)
    model, seen = _ConvNet(), []
    next(m for m in model.modules() if isinstance(m, nn.Conv2d)).register_forward_hook(
        lambda module, args, out: seen.append(out.dtype)
    )
    plugin = FP32BatchNormPrecision("bf16-mixed", slow_bf16="float32")
    from lit_compute.precision import fp32_batchnorm_precision as module

    said: list[str] = []  # what goes to Lightning's rank-zero console line
    monkeypatch.setattr(module, "rank_zero_info", lambda message: said.append(message))
    at_setup: list[
        str
    ] = []  # what a callback reads in setup, before Lightning connects the plugin (FlopsLogger's peak)

    class ReadsPrecision(pl.Callback):
        def setup(self, trainer, pl_module, stage):
            at_setup.append(trainer.precision)

    for fit in range(2):  # a second fit trains as the first
        trainer = make_trainer(
            tmp_path / str(fit), max_steps=1, limit_val_batches=0, plugins=[plugin], callbacks=[ReadsPrecision()]
        )
        trainer.fit(model, train_dataloaders=_loader(n=8))
        assert trainer.precision == picked
    assert at_setup == [picked, picked]  # it read "bf16-mixed" and FlopsLogger measured a bf16 peak for a float32 run
    assert set(seen) == {torch.float32 if picked == "32-true" else torch.bfloat16}
    assert asked == ([] if capability == "AVX2" else ["cpu"])  # picked once for the device
    want = "float32 (autocast off)" if picked == "32-true" else "bf16-mixed"
    assert len(said) == 1, said
    assert f"training in {want} on cpu: " in said[0], said
    assert ("AVX2" in said[0]) if capability == "AVX2" else measured[1] in said[0]


def test_slow_bf16_float32_is_for_bf16_mixed_only():
    with pytest.raises(
        ValueError,
        match=r"FP32BatchNormPrecision\(precision='16-mixed', slow_bf16='float32'\): the "
        r"fallback is for 'bf16-mixed' only",
    ):
        FP32BatchNormPrecision("16-mixed", slow_bf16="float32")
    with pytest.raises(ValueError, match="slow_bf16"):
        FP32BatchNormPrecision("bf16-mixed", slow_bf16="fp32")  # type: ignore[arg-type]
