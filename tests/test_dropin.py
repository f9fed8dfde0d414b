"""Drop-ins for the classes we extend: what Lightning's and torch's own tests check of the upstream classes, checked
of ours (FP32BatchNormPrecision / FP32BatchNormHalfPrecision, TunedDDPStrategy, SafeFlopCounterMode)."""

from __future__ import annotations

import inspect
import warnings
from datetime import timedelta
from unittest.mock import Mock

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist
import torchvision
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.plugins import HalfPrecision, MixedPrecision
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch.optim import Optimizer
from torch.utils.flop_counter import FlopCounterMode

from lit_compute import FP32BatchNormHalfPrecision, FP32BatchNormPrecision, TunedDDPStrategy
from lit_compute.flops import SafeFlopCounterMode

from .conftest import make_trainer, read_events, run_script, scalar_values, small_model, tiny_data, tiny_model


def _prefix(ours: type, upstream: type) -> None:
    """Upstream's parameters come first in ours, in upstream order; ours after them are keyword-only."""
    up = [p for p in inspect.signature(upstream).parameters.values() if p.kind != p.VAR_KEYWORD]
    mine = list(inspect.signature(ours).parameters.values())
    assert [p.name for p in mine[: len(up)]] == [p.name for p in up]
    extra = [p for p in mine[len(up) :] if p.kind != p.VAR_KEYWORD]
    assert all(p.kind == p.KEYWORD_ONLY for p in extra), [p.name for p in extra if p.kind != p.KEYWORD_ONLY]
    return {p.name: p.default for p in up}, {p.name: p.default for p in mine[: len(up)]}


# -- precision ---------------------------------------------------------------------------------------------------
def test_precision_plugins_are_the_upstream_classes():
    assert isinstance(FP32BatchNormPrecision(), MixedPrecision)
    assert isinstance(FP32BatchNormHalfPrecision(), HalfPrecision)
    up, ours = _prefix(FP32BatchNormPrecision, MixedPrecision)
    assert ours["scaler"] is up["scaler"] is None
    _prefix(FP32BatchNormHalfPrecision, HalfPrecision)
    scaler = Mock()
    plugin = FP32BatchNormPrecision("16-mixed", "cuda:0", scaler)  # MixedPrecision's own positional form
    assert (plugin.precision, plugin.device, plugin.scaler) == ("16-mixed", "cuda:0", scaler)


def test_a_device_in_the_second_place_is_a_device_never_a_norm_list():
    plugin = FP32BatchNormPrecision("bf16-mixed", "cpu")
    assert plugin.device == "cpu"
    assert plugin.fp32_norms == ["BatchNorm"]
    with pytest.raises(ValueError, match=r"precision='bf16-true'.*FP32BatchNormHalfPrecision\('bf16-true'\)"):
        FP32BatchNormPrecision("bf16-true", "cpu")
    with pytest.raises(TypeError):
        FP32BatchNormHalfPrecision("bf16-true", "cpu")  # HalfPrecision takes one argument; ours are keyword-only
    with pytest.raises(ValueError, match=r"fp32_norms='cpu'\) must be a list of strings"):
        FP32BatchNormHalfPrecision(fp32_norms="cpu")
    with pytest.raises(ValueError, match=r"fp32_norms=\['c', 'p', 'u'\]"):
        FP32BatchNormPrecision(fp32_norms=list("cpu"))
    with pytest.raises(ValueError, match=r"precision='16-true'.*master weights"):
        FP32BatchNormHalfPrecision("16-true")


@pytest.mark.parametrize(
    "plugin", [FP32BatchNormPrecision("bf16-mixed", "cuda"), FP32BatchNormHalfPrecision()], ids=["mixed", "true"]
)
def test_lightnings_throughput_monitor_sees_the_bf16_peak(plugin, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args, **kwargs: "NVIDIA A100-SXM4-80GB")
    trainer = Mock(precision_plugin=plugin, world_size=1, enable_validation=False)
    trainer.strategy.root_device = torch.device("cuda", 0)
    trainer.state.stage = RunningStage.TRAINING
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: 1)
    monitor.setup(trainer, Mock(), "fit")
    assert monitor.available_flops == 312e12  # the bf16 peak; a non-MixedPrecision plugin got float32's 19.5e12


def test_gradient_clipping_goes_through_the_subclass_hooks():
    """Lightning's test_amp.py::test_clip_gradients, on ours."""
    optimizer = Mock(spec=Optimizer)
    precision = FP32BatchNormPrecision(precision="16-mixed", device="cuda:0", scaler=Mock())
    precision.clip_grad_by_value = Mock()
    precision.clip_grad_by_norm = Mock()
    precision.clip_gradients(optimizer)
    precision.clip_grad_by_value.assert_not_called()
    precision.clip_grad_by_norm.assert_not_called()
    precision.clip_gradients(optimizer, clip_val=1.0, gradient_clip_algorithm=GradClipAlgorithmType.VALUE)
    precision.clip_grad_by_value.assert_called_once()
    precision.clip_grad_by_norm.assert_not_called()
    with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):
        precision.clip_gradients(Mock(_step_supports_amp_scaling=True), clip_val=1.0)


def test_a_users_clip_grad_by_norm_override_is_called_in_training(tmp_path):
    calls = []

    class Mine(FP32BatchNormPrecision):
        def clip_grad_by_norm(self, optimizer, clip_val):
            calls.append(clip_val)
            super().clip_grad_by_norm(optimizer, clip_val)

    trainer = make_trainer(tmp_path, max_steps=2, gradient_clip_val=0.5, plugins=[Mine("bf16-mixed")])
    trainer.fit(small_model(), datamodule=tiny_data())  # bf16: small work for a CPU without bf16 instructions
    assert calls == [0.5, 0.5]


def test_autocast_context_scaler_and_device_as_upstream():
    plugin = FP32BatchNormPrecision("bf16-mixed", "cpu")
    with plugin.autocast_context_manager():
        assert torch.is_autocast_enabled("cpu")
        assert not torch.is_autocast_cache_enabled()
    assert plugin.scaler is None
    fp16 = FP32BatchNormPrecision("16-mixed", "cpu", init_scale=1024.0)
    assert isinstance(fp16.scaler, torch.amp.GradScaler)
    assert fp16.scaler.get_scale() == 1024.0


@pytest.mark.parametrize("kind", ["module_init", "forward", "convert"])
def test_half_precision_contract_in_bf16_true(kind):
    """Lightning's test_half.py, on ours (bf16-true; 16-true is refused)."""
    plugin = FP32BatchNormHalfPrecision("bf16-true")
    assert plugin.precision == "bf16-true"
    assert plugin._desired_input_dtype == torch.bfloat16
    if kind == "module_init":
        with plugin.module_init_context():
            model = torch.nn.Linear(2, 2)
            assert torch.get_default_dtype() == torch.bfloat16
        assert model.weight.dtype == torch.bfloat16
    elif kind == "forward":
        with plugin.forward_context():
            assert torch.get_default_dtype() == torch.bfloat16
        assert torch.get_default_dtype() == torch.float32
    else:
        module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
        module = plugin.convert_module(module)
        assert module[0].weight.dtype == torch.bfloat16
        assert module[1].weight.dtype == torch.float32


# -- DDP -------------------------------------------------------------------------------------------------------------
def test_tuned_ddp_is_a_ddp_strategy_with_its_constructor_and_defaults():
    assert isinstance(TunedDDPStrategy(), DDPStrategy)
    up, ours = _prefix(TunedDDPStrategy, DDPStrategy)
    assert ours == up  # upstream defaults (timeout, start_method, ...)
    assert TunedDDPStrategy()._ddp_kwargs == DDPStrategy()._ddp_kwargs == {}  # nothing forced on DDP
    strategy = TunedDDPStrategy(
        timeout=timedelta(seconds=77),
        process_group_backend="gloo",
        broadcast_buffers=False,
        start_method="spawn",
        bucket_cap_mb=10,
    )
    assert strategy._timeout == timedelta(seconds=77)
    assert strategy._process_group_backend == "gloo"
    assert strategy._ddp_kwargs == {"broadcast_buffers": False, "bucket_cap_mb": 10}
    assert strategy._start_method == "spawn"


def test_tuned_ddp_is_in_lightnings_strategy_registry():
    for name, method in (("ddp_tuned", "popen"), ("ddp_tuned_spawn", "spawn"), ("ddp_tuned_fork", "fork")):
        assert name in StrategyRegistry
        strategy = StrategyRegistry.get(name)
        assert type(strategy) is TunedDDPStrategy
        assert strategy._start_method == method
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp_tuned_spawn", logger=False)
    assert isinstance(trainer.strategy, TunedDDPStrategy)


def test_the_timeout_reaches_init_process_group(tmp_path, monkeypatch):
    seen = {}
    real = dist.init_process_group

    def recording(*args, **kwargs):
        seen.update(kwargs, backend=args[0] if args else kwargs.get("backend"))
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", recording)
    trainer = make_trainer(
        tmp_path,
        max_steps=1,
        devices=1,
        strategy=TunedDDPStrategy(timeout=timedelta(seconds=123), process_group_backend="gloo"),
    )
    try:
        trainer.fit(tiny_model(), datamodule=tiny_data())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert seen["timeout"] == timedelta(seconds=123)
    assert seen["backend"] == "gloo"


@pytest.mark.slow
def test_ddp_tuned_is_a_strategy_name_after_importing_lit_compute(tmp_path):
    """lit_compute imported first (the other order, Lightning first, is the fit-then-test script's below)."""
    source = (
        "import lit_compute\nimport lightning.pytorch as pl\nfrom lit_compute import FlopsLogger"
        + """
trainer = pl.Trainer(accelerator="cpu", devices=1, strategy="ddp_tuned", logger=False)
print("STRATEGY", type(trainer.strategy).__name__)
"""
    )
    result = run_script(tmp_path, source, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:]
    assert "STRATEGY TunedDDPStrategy" in result.stdout, result.stdout[-2000:]


def test_fit_then_test_logs_the_ddp_configuration_once(tmp_path):
    strategy = TunedDDPStrategy(process_group_backend="gloo")
    trainer = make_trainer(tmp_path, max_steps=2, devices=1, strategy=strategy, limit_test_batches=1)
    model, data = tiny_model(), tiny_data()
    try:
        trainer.fit(model, datamodule=data)
        trainer.test(model, datamodule=data)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    acc = read_events(trainer.logger.log_dir)
    assert len(acc.Tensors("ddp/config/text_summary")) == 1


FIT_THEN_TEST = r"""
import lightning.pytorch as pl
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
import lit_compute  # registers ddp_tuned*


class Hook(pl.Callback):
    def on_train_end(self, trainer, pl_module):  # the wrapped model's hook, and the ranks' weights after PowerSGD
        weights = torch.cat([p.detach().flatten() for p in pl_module.parameters()])
        gathered = [torch.zeros_like(weights) for _ in range(trainer.world_size)]
        torch.distributed.all_gather(gathered, weights)
        if trainer.is_global_zero:
            print("HOOK", trainer.strategy.model._get_ddp_logging_data().get("comm_hook"),
                  "SAME", all(torch.equal(gathered[0], g) for g in gathered))


if __name__ == "__main__":
    named = pl.Trainer(accelerator="cpu", devices=1, strategy="ddp_tuned", logger=False)
    print("STRATEGY", type(named.strategy).__name__)  # a name after `import lit_compute`, Lightning imported first
    # the registered names build this same class (test above); one forked strategy covers the loops, PowerSGD
    # taking over the gradients' exchange from its second iteration
    strategy = lit_compute.TunedDDPStrategy(start_method="fork", comm_hook="powersgd", powersgd_start_iter=2)
    trainer = pl.Trainer(accelerator="cpu", devices=2, max_steps=4, limit_val_batches=2, limit_test_batches=2,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, strategy=strategy, callbacks=[Hook()])
    model = BoringModel()
    trainer.fit(model)
    trainer.test(model)  # a new process group after fit's teardown destroyed the spawned ranks' one
    print("DONE", type(trainer.strategy).__name__)
"""


@pytest.mark.slow
def test_fit_then_test_on_one_trainer_with_two_gloo_ranks(tmp_path):
    """Fit then test on one trainer of a spawned TunedDDPStrategy, training with PowerSGD on gloo."""
    result = run_script(tmp_path, FIT_THEN_TEST, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert result.stdout.count("DONE TunedDDPStrategy") == 1, result.stdout[-3000:]
    assert "STRATEGY TunedDDPStrategy" in result.stdout
    assert "HOOK powerSGD_hook SAME True" in result.stdout, result.stdout[-3000:]


# -- the FLOP counter ------------------------------------------------------------------------------------------------
def T(*shape, requires_grad=False):  # the helper's name in torch's test_flop_counter.py
    return torch.randn(*shape, requires_grad=requires_grad)


def _both(fn):
    """Run ``fn(mode)`` under torch's FlopCounterMode and ours; their total FLOPs."""
    totals = []
    for cls in (FlopCounterMode, SafeFlopCounterMode):
        mode = cls(display=False)
        with mode:
            fn()
        totals.append(mode.get_total_flops())
    return totals


def test_safe_flop_counter_is_a_flop_counter_mode_with_its_signature():
    assert issubclass(SafeFlopCounterMode, FlopCounterMode)
    up, ours = _prefix(SafeFlopCounterMode, FlopCounterMode)
    assert ours == up


def test_counts_like_flop_counter_mode_on_torchs_test_cases():
    mod = torch.nn.Linear(9, 10)

    def variety():
        torch.mm(T(4, 5), T(5, 6))
        torch.addmm(T(4, 6), T(4, 5), T(5, 6), beta=0.5, alpha=0.5)
        torch.matmul(T(5, 6), T(6, 7))
        torch.einsum("ab,bc->ac", T(6, 7), T(7, 8))
        mod(T(8, 9))

    def backward():
        a = T(4, 5, requires_grad=True)
        a = torch.mm(a, T(5, 6))
        a = a.unsqueeze(0).expand(7, 4, 6)
        torch.bmm(a, T(7, 6, 7)).sum().backward()

    class Custom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.mm(x, x)

        @staticmethod
        def backward(ctx, grad):
            return torch.mm(grad, grad) + torch.mm(grad, grad)

    def autograd_op():
        Custom.apply(T(5, 5, requires_grad=True)).sum().backward()

    def convs():
        torch.conv2d(T(2, 3, 6, 6), T(6, 3, 4, 4), padding=1)
        torch.conv1d(T(2, 3, 6), T(6, 3, 4), padding=1)

    assert _both(variety) == [3012, 3012]
    assert _both(backward) == [5184, 5184]
    assert _both(autograd_op) == [750, 750]
    assert _both(convs) == [28800 + 1440] * 2


def test_module_names_are_torchs_by_default_and_paths_on_request():
    resnet18 = torchvision.models.resnet18()
    x = T(1, 3, 224, 224, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "mods argument is not needed anymore", as torch says
        mode = SafeFlopCounterMode(resnet18, display=False)
    with mode:
        resnet18(x).sum().backward()
    assert mode.get_total_flops() == 10884440064
    assert mode.flop_counts["ResNet.layer1"][torch.ops.aten.convolution] == 924844032
    assert mode.flop_counts["ResNet.layer1"][torch.ops.aten.convolution_backward] == 1849688064
    paths = SafeFlopCounterMode(display=False, module_paths=resnet18)
    with paths:
        resnet18(x).sum().backward()
    assert paths.flop_counts["model.layer1"][torch.ops.aten.convolution] == 924844032
    assert paths.result().by_module["layer1"] == paths.result().forward_by_module["layer1"] * 3


def test_custom_mapping_display_false_as_upstream():
    def five(*args, out_shape=None, **kwargs):
        return 5

    for cls in (FlopCounterMode, SafeFlopCounterMode):
        mode = cls(display=False, custom_mapping={torch.ops.aten.add: five})
        with mode:
            a = T(4, 5)
            a + a
        assert mode.get_total_flops() == 5, cls


def test_flops_logger_still_logs_through_the_upstream_classes(tmp_path):
    from lit_compute import FlopsLogger

    trainer = make_trainer(
        tmp_path,
        max_steps=2,
        plugins=[FP32BatchNormPrecision("bf16-mixed")],
        callbacks=[FlopsLogger(peak_flops=1e12, log_every_n_steps=1)],
    )
    trainer.fit(small_model(), datamodule=tiny_data())  # bf16: small work for a CPU without bf16 instructions
    assert scalar_values(read_events(trainer.logger.log_dir), "compute/flops_per_step")


def test_the_fsdp_plugin_is_an_fsdp_precision_that_keeps_named_norms_out_of_the_policy():
    from lightning.pytorch.plugins import FSDPPrecision
    from torch.nn.modules.batchnorm import _BatchNorm

    from lit_compute import FP32BatchNormFSDPPrecision
    from lit_compute.models import GPT

    assert isinstance(FP32BatchNormFSDPPrecision(), FSDPPrecision)
    _prefix(FP32BatchNormFSDPPrecision, FSDPPrecision)
    plugin = FP32BatchNormFSDPPrecision("bf16-mixed", fp32_norms=["LayerNorm"])
    assert plugin.mixed_precision_config._module_classes_to_ignore == (_BatchNorm,)  # torch's default before
    model = plugin.convert_module(GPT(n_layer=1, n_head=2, n_embd=16))
    config = plugin.mixed_precision_config
    assert config.param_dtype == torch.bfloat16
    assert config._module_classes_to_ignore == (_BatchNorm, torch.nn.LayerNorm)
    assert model.blocks[0].ln_1.weight.dtype == torch.float32
    with pytest.raises(ValueError, match=r"FP32BatchNormFSDPPrecision\(precision='16-true'\) is refused"):
        FP32BatchNormFSDPPrecision("16-true")
