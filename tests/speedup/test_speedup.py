"""The callbacks ``lit-compute tune`` writes into tuned configs, each on a model it did not write."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from lit_compute.speedup import ChannelsLast, CompileModules, FusedOptimizer
from lit_compute.speedup.compile_modules import compile_targets
from tests.conftest import tiny_data, tiny_model


def _trainer(tmp_path, callbacks, **kwargs):
    settings = {
        "accelerator": "cpu",
        "max_steps": 2,
        "limit_val_batches": 0,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": tmp_path,
    }
    return pl.Trainer(callbacks=callbacks, **{**settings, **kwargs})


def test_channels_last_converts_the_convolutions_and_trains(tmp_path):
    model = tiny_model()
    _trainer(tmp_path, [ChannelsLast()]).fit(model, datamodule=tiny_data())
    weights = [p for p in model.parameters() if p.dim() == 4]
    assert weights
    assert all(
        p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
        for p in weights
        if p.shape[1] > 1 and p.shape[-1] > 1
    )
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_fused_optimizer_switches_the_kernel_and_matches_the_plain_update(tmp_path, optimizer):
    class Model(BoringModel):
        def configure_optimizers(self):
            if optimizer == "sgd":
                return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    results = []
    for callbacks in ([], [FusedOptimizer()]):
        pl.seed_everything(0)
        model = Model()
        trainer = _trainer(tmp_path, callbacks, max_steps=4)
        trainer.fit(model)
        results.append((model, trainer.optimizers[0].param_groups[0]))
    (plain, plain_group), (fused, fused_group) = results
    assert not plain_group["fused"]
    assert fused_group["fused"] is True
    assert fused_group["foreach"] is False
    for a, b in zip(plain.parameters(), fused.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fused_optimizer_leaves_an_optimizer_without_a_fused_kernel_and_says_why(tmp_path):
    class Model(BoringModel):
        def configure_optimizers(self):
            return torch.optim.RMSprop(self.parameters(), lr=0.01)

    with pytest.warns(UserWarning, match="FusedOptimizer: RMSprop has no fused implementation; it keeps its own"):
        _trainer(tmp_path, [FusedOptimizer()]).fit(Model())


def test_compile_modules_compiles_what_a_training_step_calls(tmp_path):
    class Blocks(BoringModel):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(32, 32), torch.nn.ReLU()])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.layer(x)

    model = Blocks()
    model.example_input_array = torch.randn(2, 32)  # Lightning's model summary forwards it with hooks on each layer
    assert [type(m).__name__ for m in compile_targets(model)] == ["Linear", "Linear", "ReLU"]
    callback = CompileModules(backend="eager")
    torch._dynamo.reset()
    _trainer(tmp_path, [callback], enable_model_summary=True).fit(model)
    assert callback.compiled == ["Linear", "Linear", "ReLU"]
    assert all(m._compiled_call_impl is not None for m in compile_targets(model))
    with pytest.raises(
        ValueError, match=r"CompileModules\(mode='fast'\) must be one of 'default', 'reduce-overhead', 'max-autotune'"
    ):
        CompileModules(mode="fast")
