from pathlib import Path

import pytest

from lit_compute.cli import LitComputeCLI, main

from .conftest import read_events, scalar_values

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_help_lists_subcommands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for sub in ("fit", "validate", "test"):
        assert sub in out


def test_fit_help_works(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--help"])
    assert exit_info.value.code == 0
    assert "--config" in capsys.readouterr().out


@pytest.mark.parametrize("config", CONFIGS, ids=[c.name for c in CONFIGS])
def test_every_config_loads_through_the_cli_parser(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = LitComputeCLI(args=["--config", str(config)], run=False)
    assert cli.model is not None and cli.datamodule is not None and cli.trainer is not None


def test_quickstart_fit_writes_train_loss(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = LitComputeCLI(
        args=[
            "fit",
            "--config", str(ROOT / "configs" / "quickstart.yaml"),
            "--trainer.max_steps=4",
            "--trainer.limit_val_batches=1",
            "--trainer.log_every_n_steps=1",
            "--data.init_args.num_workers=0",
            "--data.init_args.synthetic_images_per_class=8",
        ]
    )
    for logger in cli.trainer.loggers:
        if hasattr(logger, "close"):
            logger.close()  # the Prometheus endpoint keeps serving after fit until closed
    events = sorted(tmp_path.glob("lightning_logs/version_*"))
    assert events, list(tmp_path.rglob("*"))
    acc = read_events(events[-1])
    losses = scalar_values(acc, "train/loss")
    assert len(losses) >= 3 and all(v > 0 for _, v in losses)
    assert "val/acc" in acc.Tags()["scalars"]


def test_any_lightning_module_class_path_works(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = LitComputeCLI(
        args=["--model", "lightning.pytorch.demos.boring_classes.BoringModel",
              "--data", "lightning.pytorch.demos.boring_classes.BoringDataModule"],
        run=False,
    )
    assert type(cli.model).__name__ == "BoringModel"
