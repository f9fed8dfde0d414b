from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml

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


def _needs_gpu(config: Path) -> bool:
    return "accelerator: gpu" in config.read_text()


@pytest.mark.parametrize("config", CONFIGS, ids=[c.name for c in CONFIGS])
def test_every_config_loads_through_the_cli_parser(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if _needs_gpu(config) and not torch.cuda.is_available():
        # Lightning refuses these strategies on CPU: parse and check every component, build the CPU-safe ones
        class ParseOnly(LitComputeCLI):
            def instantiate_classes(self):
                pass

        cli = ParseOnly(args=["--config", str(config)], run=False)
        trainer = cli.config.trainer
        assert trainer.strategy.class_path
        assert trainer.callbacks
        assert cli.config.model.class_path
        from jsonargparse import ArgumentParser

        for plugin in trainer.plugins or []:
            parser = ArgumentParser(exit_on_error=False)
            parser.add_argument("--p", type=pl.plugins.Precision)
            built = parser.instantiate_classes(parser.parse_object({"p": plugin})).p
            assert isinstance(built, pl.plugins.Precision)
        return
    cli = LitComputeCLI(args=["--config", str(config)], run=False)
    assert cli.model is not None
    assert cli.datamodule is not None
    assert cli.trainer is not None


def test_the_fsdp_config_shards_by_block_with_float32_norms(tmp_path, monkeypatch):
    from lit_compute.models import GPTBlock

    class ParseOnly(LitComputeCLI):
        def instantiate_classes(self):
            pass

    monkeypatch.chdir(tmp_path)
    cli = ParseOnly(args=["--config", str(ROOT / "configs" / "gpt_fsdp.yaml")], run=False)
    strategy = cli.config.trainer.strategy
    assert strategy.class_path == "lightning.pytorch.strategies.FSDPStrategy"
    assert strategy.init_args.auto_wrap_policy == {GPTBlock}
    (plugin,) = cli.config.trainer.plugins
    assert plugin.class_path == "lit_compute.FP32BatchNormFSDPPrecision"
    assert plugin.init_args.fp32_norms == ["LayerNorm"]
    tf32 = [c for c in cli.config.trainer.callbacks if c.class_path == "lit_compute.Float32MatmulPrecision"]
    assert [c.init_args.precision for c in tf32] == ["high"]


@pytest.mark.slow  # over five seconds in the fast tier (CONTRIBUTING: a test of more than a few seconds)
def test_quickstart_fit_writes_train_loss(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = LitComputeCLI(
        args=[
            "fit",
            "--config",
            str(ROOT / "configs" / "quickstart.yaml"),
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
    assert len(losses) >= 3
    assert all(v > 0 for _, v in losses)
    assert "val/acc" in acc.Tags()["scalars"]


def test_any_lightning_module_class_path_works(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = LitComputeCLI(
        args=[
            "--model",
            "lightning.pytorch.demos.boring_classes.BoringModel",
            "--data",
            "lightning.pytorch.demos.boring_classes.BoringDataModule",
        ],
        run=False,
    )
    assert type(cli.model).__name__ == "BoringModel"


def test_gpt_demo_trains_a_few_steps_with_token_metrics(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = LitComputeCLI(
        args=[
            "fit",
            "--config",
            str(ROOT / "configs" / "gpt.yaml"),
            "--trainer.max_steps=6",
            "--trainer.val_check_interval=3",
            "--trainer.limit_val_batches=2",
            "--trainer.log_every_n_steps=2",
            "--data.init_args.max_tokens=20000",
            "--data.init_args.seq_len=64",
            "--data.init_args.batch_size=4",
            "--model.init_args.block_size=64",
            "--model.init_args.n_layer=1",
        ]
    )
    for logger in cli.trainer.loggers:
        if hasattr(logger, "close"):
            logger.close()
    acc = read_events(sorted(tmp_path.glob("lightning_logs/version_*"))[-1])
    tags = set(acc.Tags()["scalars"])
    assert {
        "train/loss",
        "val/loss",
        "time/tokens_per_sec",
        "compute/padding_fraction",
        "compute/flops_per_step",
        "compute/hardware_flops_per_step",
    } <= tags


def test_a_refused_argument_in_yaml_is_one_line_with_our_reason(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "bad.yaml"
    config.write_text(
        "trainer:\n  plugins:\n    - class_path: lit_compute.FP32BatchNormPrecision\n"
        "      init_args:\n        precision: 16-true\n"
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "lit-compute: error: FP32BatchNormPrecision(precision='16-true') is refused" in err
    assert "master weights" in err
    assert "Traceback" not in err


def test_version_and_unknown_commands(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("lit-compute ")
    assert main(["fitt"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'fitt'" in err
    assert "report" in err
    assert "bench" in err


GPT_SMALL = [
    "--data.init_args.max_tokens=20000",
    "--data.init_args.seq_len=64",
    "--data.init_args.batch_size=4",
    "--model.init_args.block_size=64",
    "--model.init_args.n_layer=2",
    "--model.init_args.lr=0.0001",
]
GPT_MODEL_PARALLEL = r"""
import sys
from lit_compute.cli import main

if __name__ == "__main__":
    main(["fit", "--config", sys.argv[1], "--trainer.max_steps=10", "--trainer.val_check_interval=5",
          "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=2", *sys.argv[2:]])
"""


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.parametrize(
    ("data_parallel", "tensor_parallel"), [(1, 2), (2, 2)], ids=["tensor-parallel", "fsdp2-x-tensor-parallel"]
)
@pytest.mark.slow
def test_the_sharded_gpt_config_trains_on_two_processes_with_every_component_on(
    tmp_path, data_parallel, tensor_parallel
):
    """The config's default layout (tensor parallel 2) and both dimensions (FSDP2 x tensor parallel, 2 x 2 on four
    processes, with CommBenchmark over each mesh dimension), every component on; FSDP2 alone is
    tests/distributed/test_parallel_layouts.py's (20 s of the suite saved here). The GPT has an
    example_input_array, which FlopsLogger's fit-start count ran before FSDP2's lazy set-up ('FSDPParam' object has
    no attribute 'param_dtype' on both ranks)."""
    import math

    import yaml

    from .conftest import run_script, scalar_values, text_values

    config = yaml.safe_load((ROOT / "configs" / "gpt_model_parallel.yaml").read_text())
    config["trainer"]["strategy"]["init_args"].update(
        data_parallel_size=data_parallel, tensor_parallel_size=tensor_parallel
    )
    config["trainer"]["callbacks"][3]["init_args"].update(start_step=6, warmup=1, active=2)  # the profiler window
    config["trainer"]["logger"][1]["init_args"]["port"] = 0  # PrometheusLogger on a free port
    config["data"]["init_args"]["mode"] = "packed"  # one shape: the memory prediction is of that shape
    world = data_parallel * tensor_parallel
    config["trainer"]["devices"] = world
    if world == 4:
        config["trainer"]["callbacks"].append(
            {"class_path": "lit_compute.CommBenchmark", "init_args": {"max_mb": 0.05, "seconds": 2}}
        )
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = run_script(tmp_path, GPT_MODEL_PARALLEL, str(tmp_path / "config.yaml"), *GPT_SMALL, timeout=400)
    assert result.returncode == 0, result.stdout[-4000:]
    (version,) = tmp_path.glob("lightning_logs/version_*")
    acc = read_events(version)
    (run,) = text_values(acc, "lit_compute/run")
    assert f"| parallel layout | data parallel {data_parallel} x tensor parallel {tensor_parallel} |" in run
    assert "ModelParallelStrategy" in run
    local, total = (scalar_values(acc, f"compute/{k}")[-1][1] for k in ("flops_per_step", "global_flops_per_step"))
    hardware = scalar_values(acc, "compute/hardware_flops_per_step")[-1][1]
    assert total == pytest.approx(world * local, rel=1e-6)  # peers with the same count
    # per device is what the device executed (hardware FLOPs add the fused attention's recomputed scores): tensor
    # parallelism each peer's shards plus the work every peer repeats (embeddings, norms, the tied head), so the sum
    # over the devices is more than that
    from lit_compute.flops import count_flops
    from lit_compute.models import GPT

    args = {**config["model"].get("init_args", {}), "block_size": 64, "n_layer": 2, "lr": 1e-4}
    unsharded = count_flops(GPT(**args), torch.zeros(4, 64, dtype=torch.long)).total * data_parallel
    assert hardware >= local
    assert unsharded < total < tensor_parallel * unsharded
    tags = set(acc.Tags()["scalars"])
    assert {
        "val/loss",
        "time/global_tokens_per_sec",
        "time/rank_skew",
        "rank/1/step_ms",
        "compute/mfu",
        "memory/peak_gb_rank_max",
    } <= tags
    assert all(math.isfinite(v) for _, v in scalar_values(acc, "train/loss"))
    traces = sorted(p.name for p in (version / "profiler").glob("*.pt.trace.json"))
    assert [t.split("_")[-1] for t in traces] == [f"rank{r}.pt.trace.json" for r in range(world)]
    if world == 4:  # the collectives measured over the world and over each mesh dimension's groups
        for where in ("comm", "comm/data_parallel", "comm/tensor_parallel"):
            assert all(v > 0 for _, v in scalar_values(acc, f"{where}/allreduce_busbw_gbps")), where
        return  # the memory prediction below simulates two ranks
    if data_parallel == 2:  # the example's forward GFLOPs per sample comes with the first counted batch instead
        assert scalar_values(acc, "compute/forward_gflops_per_sample")
    # each rank's peak memory, predicted before any step (each rank simulated in this process), within 10% of what
    # MemoryMonitor measured on the two processes (rank 0's own, and the largest of any rank)
    from lit_compute.planning import estimate

    plan = estimate(tmp_path / "config.yaml", micro_batches=[4], overrides=GPT_SMALL)
    assert [r.rank for r in plan.rows] == [0, 1]
    measured = scalar_values(acc, "memory/peak_gb")[-1][1] * 1e9
    largest = scalar_values(acc, "memory/peak_gb_rank_max")[-1][1] * 1e9
    assert plan.rows[0].peak_bytes == pytest.approx(measured, rel=0.10)
    assert max(r.peak_bytes for r in plan.rows) == pytest.approx(largest, rel=0.10)
    # with a capacity: the largest micro-batch that fits every rank, searched on the rank with the largest peak (#47)
    capacity = 2 * max(r.peak_bytes for r in plan.rows)
    fitted = estimate(tmp_path / "config.yaml", micro_batches=[4], memory=capacity, overrides=GPT_SMALL)
    assert fitted.largest_fitting
    assert fitted.largest_fitting > 4
    assert fitted.next_size.peak_bytes > capacity
    assert any(
        n.startswith(f"largest micro-batch that fits: {fitted.largest_fitting} ") and "the largest)" in n
        for n in fitted.notes
    ), fitted.notes


BAD_CONFIGS = {
    "empty": ("", "the config file is empty"),
    "unknown_section": ("trainr:\n  max_steps: 2\n", "does not accept option 'trainr.max_steps'"),
    "unknown_trainer_argument": ("trainer:\n  max_stepz: 2\n", "does not accept option 'trainer.max_stepz'"),
    "wrong_type": ("trainer:\n  max_steps: many\n", "Parser key \"trainer.max_steps\": Expected a <class 'int'>"),
    "yaml_syntax": ("trainer:\n  max_steps: [2\n", "Problems parsing config"),
    "tab_indent": ("trainer:\n\tmax_steps: 2\n", "Problems parsing config"),
    "misspelt_callback": (
        "trainer:\n  callbacks:\n    - class_path: lit_compute.FlopLogger\n",
        "lit_compute.FlopLogger: module 'lit_compute' has no attribute 'FlopLogger'",
    ),
    "callback_option": (
        "trainer:\n  callbacks:\n    - class_path: lit_compute.StepTimeMonitor\n      init_args:\n        windoww: 3\n",
        "lit_compute.StepTimeMonitor: Option 'windoww' is not accepted",
    ),
    "callback_type": (
        "trainer:\n  callbacks:\n    - class_path: lit_compute.StepTimeMonitor\n      init_args:\n"
        "        window: abc\n",
        "Parser key \"window\" Expected a <class 'int'>. Got value: abc",
    ),
    "misspelt_model": (
        "model:\n  class_path: lit_compute.models.ImageClassifer\n",
        "module 'lit_compute.models' has no attribute 'ImageClassifer'",
    ),
    "data_type": (
        "data:\n  class_path: lit_compute.data.TorchvisionImageDataModule\n  init_args:\n    batch_size: big\n",
        "Parser key \"batch_size\" Expected a <class 'int'>. Got value: big",
    ),
    "precision": ("trainer:\n  precision: 17-mixed\n", "Given value: 17-mixed is none of"),
    "strategy_name": ("trainer:\n  strategy: ddp_tunned\n", "invalid strategy name: `strategy='ddp_tunned'`"),
    "accelerator": ("trainer:\n  accelerator: tpuu\n", "invalid accelerator name: `accelerator='tpuu'`"),
    "devices": ("trainer:\n  devices: zero\n", "`devices` selected with `CPUAccelerator` should be an int > 0"),
    "section_shape": ("trainer:\n  - max_steps: 2\n", "a section of the config is not a mapping"),
    "data_dir": (
        "data:\n  class_path: lit_compute.data.TorchvisionImageDataModule\n  init_args:\n"
        "    data_dir: /nonexistent/folder\n",
        "TorchvisionImageDataModule(data_dir='/nonexistent/folder'): the folder does not exist",
    ),
}


@pytest.mark.timeout(120)  # a config that slipped through would train the default run: fail instead
@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_a_bad_config_ends_in_one_line_naming_the_key(tmp_path, monkeypatch, capsys, name):
    text, expected = BAD_CONFIGS[name]
    monkeypatch.chdir(tmp_path)
    config = tmp_path / f"{name}.yaml"
    config.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config)])  # every case stops before training
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("lit-compute: error:")]
    assert len(ours) == 1, err[-2000:]
    assert expected in ours[0], err[-2000:]
    assert "Traceback" not in err
    assert "usage:" not in err
    assert not list(tmp_path.glob("lightning_logs/version_*"))  # no empty run for TensorBoard to list


@pytest.mark.parametrize(
    ("text", "suggestion"),
    [
        (
            "trainer:\n  callbacks:\n    - class_path: lit_compute.FlopsLogger\n      init_args:\n"
            "        peek: measure\n",
            "did you mean 'peak'?",
        ),
        ("trainer:\n  callbacks:\n    - class_path: lit_compute.StepTimeMonitr\n", "did you mean 'StepTimeMonitor'?"),
        ("trainr:\n  max_steps: 2\n", "did you mean 'trainer'?"),
        ("trainer:\n  max_stepz: 2\n", "did you mean 'max_steps'?"),
        (
            "trainer:\n  callbacks:\n    - class_path: lit_compute.StepTimeMonitor\n      init_args:\n"
            "        window: twenty\n",
            "StepTimeMonitor's window takes an int, e.g. window: ",
        ),  # its default
        (
            "trainer:\n  callbacks:\n    - class_path: lit_compute.FlopsLogger\n      init_args:\n"
            "        peak: mesure\n",
            "did you mean 'measure'?",
        ),
        (
            "trainer:\n  callbacks:\n    - class_path: lit_compute.FlopsLogger\n      init_args:\n"
            "        peak: fancy\n",
            "peak takes one of table, measure, remeasure, none",
        ),
    ],
    ids=["option", "class", "section", "trainer-argument", "value-type", "choice", "choices"],
)
def test_a_misspelt_key_or_class_gets_a_close_match(tmp_path, monkeypatch, capsys, text, suggestion):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "typo.yaml").write_text(text)
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(tmp_path / "typo.yaml")])
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("lit-compute: error:")]
    assert suggestion in line


def test_a_config_path_that_does_not_exist_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", "nothere.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--config nothere.yaml: no such file" in err
    assert "quickstart" in err
    assert "lit-compute init NAME" in err


@pytest.mark.timeout(120)
def test_a_config_with_only_a_model_trains_on_its_own_loaders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "boring.yaml").write_text(
        "model:\n  class_path: lightning.pytorch.demos.boring_classes.BoringModel\n"
        "trainer:\n  max_steps: 2\n  logger: false\n  enable_checkpointing: false\n"
    )
    (tmp_path / "config.yaml").write_text("# the user's own file\n")
    cli = LitComputeCLI(args=["fit", "--config", str(tmp_path / "boring.yaml")])
    assert cli.datamodule is None
    assert cli.trainer.global_step == 2
    assert not (tmp_path / "cache").exists()
    # without a logger there is no run folder to save the resolved config in: nothing is written in its place
    assert (tmp_path / "config.yaml").read_text() == "# the user's own file\n"


USER_CLASSES = """
import lightning.pytorch as pl
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class MyModel(pl.LightningModule):
    def __init__(self, num_classes: int = 5, lr: float = 0.5, hidden: int = 8):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(4, num_classes)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class MyData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 32, num_workers: int = 0, num_classes: int = 5):
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(64, 4, generator=g), torch.randint(0, self.hparams.num_classes, (64,), generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=self.hparams.batch_size)
"""


@pytest.mark.timeout(120)
def test_a_users_own_classes_keep_their_own_defaults(tmp_path, monkeypatch, capsys):
    """The default model's and datamodule's arguments (ImageClassifier's num_classes=10, lr=0.001; the image
    datamodule's batch_size=64) never leak into the user's classes that accept the same names."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "user_classes.py").write_text(USER_CLASSES)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "mine.yaml").write_text(
        "trainer:\n  max_steps: 2\n  logger: false\n  enable_checkpointing: false\n"
        "model:\n  class_path: user_classes.MyModel\n"
        "data:\n  class_path: user_classes.MyData\n"
    )
    cli = LitComputeCLI(args=["fit", "--config", "mine.yaml"])
    assert (cli.model.hparams.num_classes, cli.model.hparams.lr) == (5, 0.5)
    assert (cli.datamodule.hparams.batch_size, cli.datamodule.hparams.num_classes) == (32, 5)
    assert cli.trainer.global_step == 2
    capsys.readouterr()
    # --print_config shows exactly that; a value the user writes (even the default model's) is kept
    with pytest.raises(SystemExit):
        main(["fit", "--config", "mine.yaml", "--model.init_args.num_classes=10", "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["init_args"] == {"num_classes": 10, "lr": 0.5, "hidden": 8}
    assert printed["data"]["init_args"] == {"batch_size": 32, "num_workers": 0, "num_classes": 5}
    # a model named alone: no datamodule, and --print_config says so
    with pytest.raises(SystemExit):
        main(["fit", "--model", "user_classes.MyModel", "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"] is None
    assert printed["model"]["init_args"]["num_classes"] == 5
    # the default model still gets its own defaults, and arguments given without a class path go to it
    with pytest.raises(SystemExit):
        main(["fit", "--model.init_args.lr=0.01", "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"].endswith("ImageClassifier")
    assert printed["model"]["init_args"]["num_classes"] == 10
    assert printed["model"]["init_args"]["lr"] == 0.01
    assert printed["data"]["init_args"]["batch_size"] == 64
