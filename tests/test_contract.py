"""One contract over every public component: builds from defaults, survives two fits, state round-trips, YAML."""

from __future__ import annotations

import inspect
from pathlib import Path

import lightning.pytorch as pl
import pytest
from jsonargparse import ArgumentParser
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.callbacks import Callback

import lit_compute

from .conftest import make_trainer, small_model, tiny_data, tiny_model

ROOT = Path(__file__).resolve().parents[1]
LIGHTNING_BASES = (
    Callback,
    LightningDataModule,
    LightningModule,
    pl.plugins.Precision,
    pl.strategies.Strategy,
    pl.loggers.Logger,
)
COMPONENTS = sorted(
    name
    for name in lit_compute.__all__
    if inspect.isclass(getattr(lit_compute, name)) and issubclass(getattr(lit_compute, name), LIGHTNING_BASES)
)
# Defaults that would make a component too slow for a unit test (the defaults still build in test_builds...).
TEST_ARGS: dict[str, dict] = {
    "TorchvisionImageDataModule": {
        "batch_size": 8,
        "image_size": 32,
        "synthetic_num_classes": 4,
        "synthetic_images_per_class": 8,
        "num_workers": 0,
    },
    "ImageClassifier": {"num_classes": 4},
    "PrometheusLogger": {"port": 0},
    "FlopsLogger": {"peak": "none"},
    "ProfilerWindow": {"start_step": 0, "warmup": 0, "active": 1},
    "CommBenchmark": {"max_mb": 0.1, "seconds": 2},
    "DALIImageDataModule": {
        "batch_size": 8,
        "image_size": 32,
        "synthetic_num_classes": 4,
        "synthetic_images_per_class": 8,
    },
    "GPT": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 16},
    "TokenDataModule": {"batch_size": 4, "seq_len": 32, "max_tokens": 5000},
    "CompileModules": {"backend": "eager"},
}
# Public base classes users extend (README and examples/ show them; no config uses one on its own).
BASE_CLASSES = {"MeasuringCallback"}
# Components that train on token batches: they pair with each other instead of the image model and data.
TOKEN_PAIR = {"GPT": "TokenDataModule", "TokenDataModule": "GPT"}


def _base(cls: type) -> type:
    for base in LIGHTNING_BASES:
        if issubclass(cls, base):
            return base
    raise AssertionError(f"{cls} is public but of no known component kind")


def _fit_twice(tmp_path: Path, name: str, obj) -> None:
    base = _base(type(obj))
    if base is pl.strategies.Strategy:  # a strategy belongs to one Trainer (as Lightning's own): fit, test, fit again
        trainer = make_trainer(tmp_path / "fit", max_steps=2, strategy=obj)
        model, data = tiny_model(), tiny_data()
        trainer.fit(model, datamodule=data)
        trainer.test(model, datamodule=data)
        trainer.fit(model, datamodule=data)
        assert trainer.global_step == 2
        return
    for i in range(2):
        kwargs: dict = {}
        model, data = tiny_model(), tiny_data()
        if name in TOKEN_PAIR:
            partner = TOKEN_PAIR[name]
            model, data = (obj, None) if name == "GPT" else (None, obj)
            other = getattr(lit_compute, partner)(**TEST_ARGS[partner])
            model, data = model or other, data or other
        if base is Callback:
            kwargs["callbacks"] = [obj]
        elif base is LightningDataModule:
            data = obj
        elif base is LightningModule:
            model = obj
        elif base is pl.plugins.Precision:  # bf16 by default: small work for a CPU without bf16 instructions
            kwargs["plugins"] = [obj]
            model = small_model()
        elif base is pl.strategies.Strategy:
            kwargs["strategy"] = obj
        elif base is pl.loggers.Logger:
            kwargs["logger"] = [pl.loggers.TensorBoardLogger(str(tmp_path), name="tb"), obj]
        trainer = make_trainer(tmp_path / f"fit{i}", max_steps=2, **kwargs)
        trainer.fit(model, datamodule=data)
        assert trainer.global_step == 2


@pytest.mark.parametrize("name", COMPONENTS)
def test_builds_from_defaults(name):
    cls = getattr(lit_compute, name)
    cls()


@pytest.mark.parametrize("name", COMPONENTS)
def test_survives_two_fits_and_state_round_trips(tmp_path, name):
    cls = getattr(lit_compute, name)
    obj = cls(**TEST_ARGS.get(name, {}))
    _fit_twice(tmp_path, name, obj)
    if hasattr(obj, "state_dict"):
        state = obj.state_dict()
        fresh = cls(**TEST_ARGS.get(name, {}))
        fresh.load_state_dict(state)
        again = fresh.state_dict()
        assert set(again) == set(state)
        for key, value in state.items():
            if hasattr(value, "equal"):
                assert value.equal(again[key]), key
            else:
                assert again[key] == value, key


@pytest.mark.parametrize("name", COMPONENTS)
def test_parses_from_yaml(name):
    cls = getattr(lit_compute, name)
    base = _base(cls)
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--component", type=base)
    cfg = parser.parse_string(f"component:\n  class_path: lit_compute.{name}\n")
    obj = parser.instantiate_classes(cfg).component
    assert type(obj) is cls


@pytest.mark.parametrize("name", COMPONENTS)
def test_component_is_documented_and_used_in_a_config(name):
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert any(name in page.read_text() for page in pages), f"{name} is in neither README.md nor a docs page"
    if name in BASE_CLASSES:
        return  # extended in code, never configured on its own: README and examples/ show it
    used = [p.name for p in (ROOT / "configs").glob("*.yaml") if name in p.read_text()]
    assert used, f"{name} is used by no file in configs/"


def test_nccl_settings_parse_from_yaml_inside_the_strategy():
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--strategy", type=pl.strategies.Strategy)
    cfg = parser.parse_string(
        "strategy:\n  class_path: lit_compute.TunedDDPStrategy\n  init_args:\n    bucket_cap_mb: 50\n"
        "    nccl:\n      algo: Tree\n      socket_nthreads: 4\n      nsocks_perthread: 4\n"
    )
    strategy = parser.instantiate_classes(cfg).strategy
    assert strategy.nccl == lit_compute.NCCLSettings(algo="Tree", socket_nthreads=4, nsocks_perthread=4)
    assert strategy.bucket_cap_mb == 50
