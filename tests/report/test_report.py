"""lit-compute report and what TensorBoard serves for a lit_compute run, as a user sees them."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import lightning.pytorch as pl
import pytest
import yaml
from PIL import Image
from torch.utils.data import DataLoader
from torch.utils.tensorboard import SummaryWriter

from lit_compute import (
    DeviceMonitor,
    FlopsLogger,
    FP32BatchNormPrecision,
    LossScaleMonitor,
    MemoryMonitor,
    ProfilerWindow,
    StepTimeMonitor,
)
from lit_compute.formatting import flops_rate, human, markdown_table
from lit_compute.report import ReportError, build_report, load_run, main
from lit_compute.tensorboard_layout import LAYOUT, chart_matches, charts_in

from ..conftest import (
    DrivenClock,
    TimedImages,
    TimedNet,
    clocked_trainer,
    read_events,
    scalar_values,
    small_model,
    tiny_model,
)


def _train(root: Path, name: str, load_s: float = 0.0005, steps: int = 8) -> Path:
    callbacks = [
        FlopsLogger(peak_flops=1e11, log_every_n_steps=2),
        StepTimeMonitor(log_every_n_steps=2, window=4),
        DeviceMonitor(log_every_n_steps=2),
        LossScaleMonitor(log_every_n_steps=2),
        ProfilerWindow(start_step=3, warmup=1, active=2),
        MemoryMonitor(log_every_n_steps=2),
    ]
    logger = pl.loggers.TensorBoardLogger(str(root), name=name, version=0)
    clock = DrivenClock()
    trainer = clocked_trainer(
        root,
        clock,
        max_steps=steps,
        limit_train_batches=steps,
        callbacks=callbacks,
        logger=logger,
        plugins=[FP32BatchNormPrecision("16-mixed")],
        limit_val_batches=0,
    )
    # float16 on a CPU has no fast kernels: a ResNet-18's 11 M parameters took 0.9 s a step whatever the image size
    model = small_model()
    model.training_step = _timed(model.training_step, clock, 0.02)
    trainer.fit(model, train_dataloaders=DataLoader(TimedImages(clock, load_s, n=64, size=16), batch_size=8))
    return Path(logger.log_dir)


def _timed(step, clock: DrivenClock, seconds: float):
    def training_step(*args, **kwargs):
        clock.advance(seconds)
        return step(*args, **kwargs)

    return training_step


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return root, _train(root, "fast"), _train(root, "slow", load_s=0.004)  # 32 ms of loading per batch of 8


@pytest.mark.slow
def test_report_sections_match_the_event_file(runs, tmp_path):
    _, fast, _ = runs
    out = tmp_path / "report.md"
    text, loaded = build_report([str(fast)], out, None, None)
    acc = read_events(fast)
    steps = [v for _, v in scalar_values(acc, "time/step_ms")]
    assert f"| mean step time (ms) | {human(sum(steps) / len(steps))} |" in text
    step, peak = max(scalar_values(acc, "memory/peak_gb"), key=lambda p: p[1])
    activations = dict(scalar_values(acc, "memory/activations_gb"))[step]
    assert (
        f"| step peak memory per device (GB): parameters, gradients, optimizer, activations, other | {human(peak)}: "
        in text
    )
    assert human(activations) in text
    gflops = scalar_values(acc, "compute/forward_gflops_per_sample")[0][1]
    assert f"| model forward GFLOPs per sample | {human(gflops, 4)} |" in text
    assert "of 100 GFLOP/s peak per device" in text  # 0.1 TFLOP/s in the unit that fits
    assert "| precision | 16-mixed (FP32BatchNormPrecision) |" in text
    assert "### Profiler windows" in text
    assert "aten::" in text
    assert "### Advice" in text
    assert "e+" not in text
    assert "e-0" not in text
    pngs = sorted((tmp_path / "report_plots").glob("*.png"))
    prefix = re.sub(r"[^A-Za-z0-9_.-]+", "_", loaded[0].name).strip("_.")  # plots are named after their run
    assert {p.name for p in pngs} == {
        f"{prefix}_step_time.png",
        f"{prefix}_throughput.png",
        f"{prefix}_mfu.png",
        f"{prefix}_loss_scale.png",
        f"{prefix}_samples_per_s.png",
    }
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert Image.open(p).size[0] > 300
        assert f"]({p.relative_to(tmp_path).as_posix()})" in text


def test_human_numbers():
    assert human(14231.7) == "14,232"
    assert human(3.14159) == "3.14"
    assert human(0.0025118) == "0.00251"
    assert human(250.0) == "250"
    assert human(None) == "n/a"
    assert human(float("nan")) == "n/a"
    assert flops_rate(0.0025) == "2.5 GFLOP/s"
    assert flops_rate(312.0) == "312 TFLOP/s"
    assert flops_rate(4e-5) == "40 MFLOP/s"


def test_comparison_ratios_and_cost(runs, tmp_path):
    _, fast, slow = runs
    text, loaded = build_report([str(fast), str(slow)], tmp_path / "cmp.md", None, 3.0)
    fast_run, slow_run = loaded
    assert (fast_run.name, slow_run.name) == ("fast/version_0", "slow/version_0")
    ratio = slow_run.samples_per_sec / fast_run.samples_per_sec
    assert ratio == pytest.approx(8 / (0.032 + 0.02) / (8 / (0.004 + 0.02)), rel=1e-3)  # driven clocks: exact
    row = next(line for line in text.splitlines() if line.startswith("| slow/version_0 |"))
    assert f"| {human(ratio)} |" in row
    saved = 1 - fast_run.samples_per_sec / slow_run.samples_per_sec
    assert f"slow/version_0 costs {abs(saved):.1%} more per sample than the baseline fast/version_0." in text
    assert "Input-bound" in text  # the slow run's advice cites its data-wait fraction


def _write_run(folder: Path, scalars: dict[str, float], info: dict[str, str], steps: int = 4) -> Path:
    """A run's event file as lit_compute writes it: scalars at a few steps and the lit_compute/run table."""
    writer = SummaryWriter(str(folder))
    for step in range(steps):
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, step)
    writer.add_text("lit_compute/run", markdown_table(["key", "value"], [[k, v] for k, v in info.items()]), 0)
    writer.close()
    return folder


def test_runs_of_different_workloads_are_compared_like_with_like(tmp_path):
    """A GPT beside two ResNet runs: two tables, each run compared only with its own workload; the GPT's in
    tokens/s (the ResNets' ratio is theirs alone)."""
    image = {"compute/forward_gflops_per_sample": 4.1, "compute/mfu": 0.3}
    a = _write_run(tmp_path / "resnet" / "version_0", {**image, "time/samples_per_sec": 10.0}, {"data": "Images"})
    b = _write_run(tmp_path / "resnet" / "version_1", {**image, "time/samples_per_sec": 25.0}, {"data": "Images"})
    gpt = _write_run(
        tmp_path / "gpt" / "version_0",
        {"compute/forward_gflops_per_sample": 0.52, "time/samples_per_sec": 900.0, "time/tokens_per_sec": 4000.0},
        {"data": "TokenDataModule"},
    )
    text, _ = build_report([str(a), str(gpt), str(b)], tmp_path / "r.md", None, None, plots=False)
    assert "These runs train 2 different workloads" in text
    assert "### Images, 4.1 GFLOPs forward per sample" in text
    assert "### TokenDataModule, 0.52 GFLOPs" in text
    images = text[text.index("### Images") : text.index("### TokenDataModule")]
    assert "| resnet/version_1 | 40 | 25 | 30.0% | 0.4 | 2.5 |" in images
    assert "gpt/" not in images
    tokens = text[text.index("### TokenDataModule") : text.index("## resnet/version_0")]
    assert "| run | time per token (ms) | tokens/s |" in tokens
    assert "| gpt/version_0 | 0.25 | 4,000 |" in tokens


def test_two_experiments_with_the_same_version_stay_apart(tmp_path):
    a = _write_run(tmp_path / "exp_a" / "lightning_logs" / "version_0", {"time/samples_per_sec": 10.0}, {})
    b = _write_run(tmp_path / "exp_b" / "lightning_logs" / "version_0", {"time/samples_per_sec": 20.0}, {})
    text, runs = build_report([str(a), str(b)], tmp_path / "r.md", None, 1.0, plots=False)
    assert [r.name for r in runs] == ["exp_a/lightning_logs/version_0", "exp_b/lightning_logs/version_0"]
    assert (
        "exp_b/lightning_logs/version_0 costs 50.0% less per sample than the baseline exp_a/lightning_logs/version_0"
        in text
    )


BF16_CPU = {
    "precision": "bf16-mixed",
    "precision plugin": "FP32BatchNormPrecision",
    "device": "cpu",
    "world size": "1",
    "cpu cores": "2",
    "data": "TorchvisionImageDataModule",
}


@pytest.mark.parametrize(
    ("scalars", "info", "expected", "not_expected"),
    [
        # 3% MFU in bf16 on a machine at load 10 while the process gets 30% of a core
        (
            {"compute/mfu": 0.03, "device/cpu_percent": 30.0, "device/load_avg_1m": 10.0, "time/step_ms": 100.0},
            BF16_CPU,
            ["CPU-starved: the machine's load average is 10 on 2 cores", "Low MFU: compute/mfu is 3.0% in bf16-mixed"],
            ["Nothing stands out"],
        ),
        # input-bound on token batches: no image decoder advice
        (
            {"time/data_wait_fraction": 0.5, "time/tokens_per_sec": 100.0, "compute/padding_fraction": 0.4},
            {**BF16_CPU, "data": "TokenDataModule"},
            [
                "Input-bound: data wait is 50.0%",
                "tokenise once",
                "Padding waste: 40.0%",
                "set TokenDataModule(mode='packed')",
            ],
            ["DALI"],
        ),
        # a user's own datamodule: the advice names it, not a setting it does not have
        (
            {"compute/padding_fraction": 0.4},
            {**BF16_CPU, "data": "MyTextData"},
            ["Padding waste: 40.0%", "pack sequences into fixed-length rows in MyTextData"],
            ["set TokenDataModule(mode='packed')"],
        ),
        # input-bound on images: the image advice
        ({"time/data_wait_fraction": 0.5, "time/samples_per_sec": 100.0}, BF16_CPU, ["DALIImageDataModule"], []),
        ({"compute/mfu": 0.6, "time/data_wait_fraction": 0.01}, BF16_CPU, ["Nothing stands out"], ["Low MFU"]),
        # 100 MiB of gradients at 1.31 GB/s busbw on 2 ranks: 80 ms of a 100 ms step; 20 ms needs 5.2 GB/s
        (
            {
                "comm/gradient_bytes": 104857600.0,
                "comm/grad_allreduce_ms": 80.0,
                "time/step_ms": 100.0,
                "comm/allreduce_busbw_gbps": 1.31,
            },
            {**BF16_CPU, "world size": "2"},
            [
                "Bandwidth-bound gradients: all-reducing this model's 100.0 MiB",
                "80% of a 100.0 ms step",
                "needs 5.2 GB/s bus bandwidth (42 Gbit/s between nodes)",
            ],
            [],
        ),
        # collectives overlap little but take 5% of the step: not worth a line
        (
            {"profiler/comm_overlap_fraction": 0.2, "profiler/comm_fraction": 0.05},
            BF16_CPU,
            [],
            ["Communication-bound"],
        ),
        (
            {"profiler/comm_overlap_fraction": 0.2, "profiler/comm_fraction": 0.4},
            BF16_CPU,
            ["Communication-bound: collectives take 40.0% of the profiled steps and only 20.0%"],
            [],
        ),
    ],
    ids=[
        "starved-cpu-low-mfu-bf16",
        "input-bound-tokens",
        "padding-own-datamodule",
        "input-bound-images",
        "healthy",
        "bandwidth-bound",
        "little-comm",
        "comm-bound",
    ],
)
def test_advice_follows_the_numbers(tmp_path, scalars, info, expected, not_expected):
    run = _write_run(tmp_path / "run", scalars, info)
    text, _ = build_report([str(run)], tmp_path / "r.md", None, None, plots=False)
    advice = text.split("### Advice", 1)[1]
    for phrase in expected:
        assert phrase in advice, (phrase, advice)
    for phrase in not_expected:
        assert phrase not in advice, (phrase, advice)


def test_runs_without_our_tags_are_skipped_with_a_line(tmp_path, capsys):
    ours = _write_run(tmp_path / "logs" / "ours", {"time/step_ms": 5.0}, {})
    plain = pl.loggers.TensorBoardLogger(str(tmp_path / "logs"), name="plain", version=0)
    plain.log_metrics({"loss": 1.0}, step=0)
    plain.finalize("success")
    assert main([str(tmp_path / "logs"), "--out", str(tmp_path / "r.md"), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "skipped:" in out
    assert "plain/version_0 has none of lit_compute's tags" in out
    assert "(1 run(s): " in out
    assert out.rstrip().endswith(")")
    assert "Skipped 1 folder(s)" in (tmp_path / "r.md").read_text()
    assert ours.exists()


def test_report_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no TensorBoard event files"):
        build_report([str(tmp_path / "empty")], tmp_path / "r.md", None, None)
    assert main([str(tmp_path / "empty"), "--out", str(tmp_path / "r.md")]) == 2
    assert "no TensorBoard event files" in capsys.readouterr().err
    run = _write_run(tmp_path / "run", {"time/step_ms": 5.0}, {})
    assert main([str(run), "--out", str(tmp_path)]) == 2  # a folder
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "is a folder; name a file such as" in err
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert main([str(run), "--out", str(locked / "r.md"), "--no-plots"]) == 2
        assert "cannot write --out" in capsys.readouterr().err
    else:
        assert main([str(run), "--out", "/proc/r.md", "--no-plots"]) == 2  # not writable, even for root
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert "cannot write --out /proc/r.md" in err


def test_a_plain_run_alone_is_a_clear_error(tmp_path):
    plain = pl.loggers.TensorBoardLogger(str(tmp_path), name="plain", version=0)
    plain.log_metrics({"loss": 1.0}, step=0)
    plain.finalize("success")
    with pytest.raises(ReportError, match="none of lit_compute's tags"):
        load_run(Path(plain.log_dir))


def test_the_flops_hparam_is_in_hparams_yaml_and_the_hparams_plugin(tmp_path):
    from tensorboard.plugins.hparams import metadata as hp_metadata

    trainer = clocked_trainer(
        tmp_path, DrivenClock(), max_steps=2, callbacks=[FlopsLogger(peak="none", log_every_n_steps=1)]
    )
    model = tiny_model()
    from ..conftest import tiny_data

    trainer.fit(model, datamodule=tiny_data())  # ImageClassifier gives an example input at the data's image size
    saved = yaml.safe_load((Path(trainer.logger.log_dir) / "hparams.yaml").read_text())
    value = saved["compute/forward_gflops_per_sample"]
    acc = read_events(trainer.logger.log_dir)
    assert value == pytest.approx(scalar_values(acc, "compute/forward_gflops_per_sample")[0][1], rel=1e-5)
    content = acc.SummaryMetadata(hp_metadata.SESSION_START_INFO_TAG).plugin_data.content
    hparams = hp_metadata.parse_session_start_info_plugin_data(content).hparams
    assert hparams["compute/forward_gflops_per_sample"].number_value == pytest.approx(value)
    assert "arch" in hparams  # one session with Lightning's own hparams and ours
    assert len(scalar_values(acc, "hp_metric")) == 1  # not one more point per call


# -- TensorBoard itself ----------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str):
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10).read())


@pytest.fixture(scope="module")
def tensorboard(runs):
    root = runs[0]
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(root),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast=false",
            "--reload_interval=1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if "compute/mfu" in _get(port, "/data/plugin/scalars/tags").get("fast/version_0", {}):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_tensorboard_serves_our_tags_text_and_layout(tensorboard):
    port, run = tensorboard, "fast/version_0"
    scalars = _get(port, "/data/plugin/scalars/tags")
    assert {
        "compute/mfu",
        "compute/tflops_per_sec",
        "time/data_wait_fraction",
        "amp/loss_scale",
        "device/cpu_percent",
        "profiler/step_time_ms",
    } <= set(scalars[run])
    texts = _get(port, "/data/plugin/text/tags")
    served = {t.removesuffix("/text_summary") for t in texts[run]}
    assert {"compute/flops_by_module", "profiler/top_ops", "lit_compute/run"} <= served
    layout = _get(port, "/data/plugin/custom_scalars/layout")
    titles = {c["title"] for c in layout["category"]}
    assert {"Compute", "Time", "Precision", "Device", "Memory"} <= titles
    assert "Communication" not in titles  # only charts whose tags exist
    assert "Profiler windows" not in titles  # one window: one point per tag, no line to draw


def test_each_custom_scalars_chart_matches_exactly_its_tags(tensorboard):
    """Asked of TensorBoard's own custom-scalars API: the tags each chart's patterns pull in."""
    port, run = tensorboard, "fast/version_0"
    tags = set(_get(port, "/data/plugin/scalars/tags")[run])
    layout = _get(port, "/data/plugin/custom_scalars/layout")
    checked, rates = 0, set()
    for category in layout["category"]:
        for chart in category["chart"]:
            patterns = chart["multiline"]["tag"]
            served = set()
            for pattern in patterns:
                query = urllib.parse.urlencode({"run": run, "tag": pattern})
                answer = _get(port, f"/data/plugin/custom_scalars/scalars?{query}")
                assert answer["regex_valid"]
                served |= set(answer["tag_to_events"])
            title = chart["title"]
            intended = {
                t
                for p in next(
                    c
                    for unit in ("TFLOP/s", "GFLOP/s", "MFLOP/s")
                    for cat in charts_in(unit).values()
                    for t_, c in cat.items()
                    if t_ == title
                )
                for t in [p.strip("^$").replace("\\", "")]
            } & tags
            assert served == intended, title
            assert served == chart_matches(patterns, tags), title
            checked += 1
            rates.update([title] if "FLOP/s" in title else [])
    assert checked >= 12
    assert rates, rates
    assert not [t for t in rates if "TFLOP/s" in t], rates  # a CPU's FLOP/s in a unit that fits it


def test_training_and_validation_figures_never_share_a_chart():
    """A validation figure is logged once per validation run: in a training chart its few points draw a line
    straight across the training curve (the GPT demo's val_mfu did, in the MFU chart)."""
    for charts in LAYOUT.values():
        for title, patterns in charts.items():
            kinds = {bool(re.search(r"(^|/)(val|test)_", p)) for p in patterns}
            assert len(kinds) == 1, title


# -- a sweep's log dir ------------------------------------------------------------------------------------------
def test_report_over_many_runs_reads_every_one(tmp_path):
    for i in range(12):
        _write_run(
            tmp_path / "sweep" / f"lr_{i}" / "version_0",
            {"time/samples_per_sec": 10.0 + i, "compute/mfu": 0.1},
            BF16_CPU,
        )
    text, runs = build_report([str(tmp_path / "sweep")], tmp_path / "r.md", None, None, plots=False)
    assert len(runs) == 12
    assert len({r.name for r in runs}) == 12
    assert "lr_11/version_0" in text


def test_run_figures_are_total_work_over_total_time_not_a_mean_of_windows(tmp_path):
    """Logging windows of very different step times (steps 2-3 take 10x longer): the report's samples/s, mean step,
    data-wait fraction, achieved FLOP/s and MFU are totals over the timed steps, exactly, on a driven clock."""
    clock = DrivenClock()
    compute = {s: (0.1 if s in (2, 3) else 0.01) for s in range(8)}
    trainer = clocked_trainer(
        tmp_path,
        clock,
        max_steps=8,
        limit_train_batches=8,
        log_every_n_steps=2,
        limit_val_batches=0,
        callbacks=[StepTimeMonitor(), FlopsLogger(peak_flops=1e9)],
    )
    trainer.fit(TimedNet(clock, slow=compute), train_dataloaders=DataLoader(TimedImages(clock, 0.001), batch_size=4))
    run = load_run(Path(trainer.logger.log_dir))
    timed = range(1, 8)  # step 0 is tainted (the loader's start, and the FLOP count)
    seconds = sum(0.004 + compute[s] for s in timed)  # 4 images x 1 ms of loading, then the step's compute
    assert run.samples_per_sec == pytest.approx(4 * len(timed) / seconds, rel=1e-4)
    assert run.mean_step_ms == pytest.approx(seconds / len(timed) * 1e3, rel=1e-4)
    assert run.total("time/data_wait_fraction") == pytest.approx(0.004 * len(timed) / seconds, rel=1e-4)
    flops = run.last("compute/flops_per_step")
    assert run.total("compute/global_tflops_per_sec") == pytest.approx(flops * len(timed) / seconds / 1e12, rel=1e-4)
    assert run.total("compute/mfu") == pytest.approx(flops * len(timed) / seconds / 1e9, rel=1e-4)
    windows = run.values("time/samples_per_sec")
    assert abs(sum(windows) / len(windows) - run.samples_per_sec) > 0.1 * run.samples_per_sec  # the old mean was off
    assert run.timed_span() == (7, 1, 7)
    text, _ = build_report([str(trainer.logger.log_dir)], tmp_path / "report.md", None, None, plots=False)
    assert "7 timed steps, logged at steps 1-7: rates are total work / total timed time" in text
    assert f"| samples/s | {human(run.samples_per_sec)} |" in text


def test_cut_or_empty_event_files_are_named_as_such(tmp_path, capsys):
    run_dir = _train(tmp_path / "logs", "cut", steps=2)
    for events in run_dir.glob("events.out.tfevents.*"):
        events.write_bytes(events.read_bytes()[:10])  # a run killed while writing
    assert main([str(run_dir), "--out", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err
    assert "holds no readable TensorBoard events (1 event file(s): 10 bytes): empty or cut short" in err
    assert "train with lit_compute's callbacks" not in err


@pytest.mark.slow
def test_plots_in_a_folder_that_cannot_be_written_end_in_one_line(tmp_path, capsys):
    run_dir = _train(tmp_path / "logs", "ok", steps=2)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the plots folder would go")
    assert main([str(run_dir), "--out", str(tmp_path / "r.md"), "--plots", str(blocked / "plots")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"lit-compute report: cannot write the plots to {blocked / 'plots'}: ")
    assert err.endswith("pass --plots DIR (a writable folder) or --no-plots")
    assert "\n" not in err


def test_without_an_example_input_the_flops_hparam_reaches_hparams_yaml_once_known(tmp_path):
    from lightning.pytorch.demos.boring_classes import BoringModel

    trainer = clocked_trainer(
        tmp_path, DrivenClock(), max_steps=2, callbacks=[FlopsLogger(peak="none", log_every_n_steps=1)]
    )
    trainer.fit(BoringModel())
    saved = yaml.safe_load((Path(trainer.logger.log_dir) / "hparams.yaml").read_text())
    acc = read_events(trainer.logger.log_dir)
    # BoringModel: Linear(32, 2) on one sample: 2 x 32 x 2 forward FLOPs
    assert saved["compute/forward_gflops_per_sample"] == pytest.approx(128 / 1e9)
    assert saved["compute/forward_gflops_per_sample"] == pytest.approx(
        scalar_values(acc, "compute/forward_gflops_per_sample")[0][1], rel=1e-5
    )


def test_a_run_that_stopped_early_says_where(tmp_path):
    info = {**BF16_CPU, "planned": "64 steps"}
    stopped = _write_run(tmp_path / "a" / "version_0", {"time/step_ms": 5.0, "train/loss": 1.0}, info, steps=12)
    done = _write_run(
        tmp_path / "b" / "version_0",
        {"time/step_ms": 5.0, "train/loss": 1.0},
        {**info, "planned": "12 steps"},
        steps=12,
    )
    text, runs = build_report([str(stopped), str(done)], tmp_path / "r.md", None, None, plots=False)
    assert "**Stopped early: at step 12 of 64**" in text
    assert text.count("Stopped early") == 1  # the finished run is not flagged
    assert "| a/version_0 (stopped at step 12 of 64) |" in text


def test_lit_compute_fit_names_its_run_for_the_report(tmp_path, monkeypatch):
    from lit_compute.cli import main as cli_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIT_COMPUTE_RUN_FILE", str(tmp_path / "run.txt"))
    (tmp_path / "c.yaml").write_text(
        "model:\n  class_path: lightning.pytorch.demos.boring_classes.BoringModel\ntrainer:\n  max_steps: 2\n"
        "  enable_checkpointing: false\n  logger:\n    class_path: lightning.pytorch.loggers.TensorBoardLogger\n"
        "    init_args:\n      save_dir: .\n      name: lightning_logs\n"
    )
    for version in (0, 1):
        cli_main(["fit", "--config", str(tmp_path / "c.yaml")])
        assert (tmp_path / "run.txt").read_text().strip() == str(tmp_path / "lightning_logs" / f"version_{version}")


def test_two_runs_started_together_never_share_a_version_folder(tmp_path, monkeypatch):
    """Lightning lists the version folders and creates its own only when it first writes: two ``lit-compute fit``
    started together both listed no folder and wrote into ``version_0``, and each ``make demo`` reported both runs
    mixed. Here the other run has just taken ``version_0`` after this one listed the folders."""
    from lightning.pytorch.loggers import TensorBoardLogger

    from lit_compute.cli import main as cli_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIT_COMPUTE_RUN_FILE", str(tmp_path / "run.txt"))
    (tmp_path / "lightning_logs" / "version_0").mkdir(parents=True)  # the other run's claim
    monkeypatch.setattr(TensorBoardLogger, "_get_next_version", lambda self: 0)  # what this run listed before it
    (tmp_path / "c.yaml").write_text(
        "model:\n  class_path: lightning.pytorch.demos.boring_classes.BoringModel\ntrainer:\n  max_steps: 2\n"
        "  enable_checkpointing: false\n  enable_progress_bar: false\n  enable_model_summary: false\n  logger:\n"
        "    class_path: lightning.pytorch.loggers.TensorBoardLogger\n    init_args:\n      save_dir: .\n"
        "      name: lightning_logs\n"
    )
    cli_main(["fit", "--config", str(tmp_path / "c.yaml")])
    ours = tmp_path / "lightning_logs" / "version_1"
    assert (tmp_path / "run.txt").read_text().strip() == str(ours)
    assert not list((tmp_path / "lightning_logs" / "version_0").iterdir())  # nothing written into the other run's
    assert list(ours.glob("events.out.tfevents.*"))
    assert (ours / "config.yaml").exists()


def test_low_mfu_advice_names_channels_last_only_for_image_runs_and_points_to_tune():
    from lit_compute.report.advice import advice

    class FakeRun:
        def __init__(self, tokens):
            from lit_compute.run_record import RunRecord

            self.tokens = tokens
            self.record = RunRecord(precision="bf16-mixed", precision_plugin="FP32BatchNormPrecision")

        def total(self, tag):
            return 0.05 if tag == "compute/mfu" else None

        def mean(self, tag):
            return None

        def last(self, tag):
            return None

        mean_step_ms = None

    gpt = " ".join(advice(FakeRun(tokens=True)))
    image = " ".join(advice(FakeRun(tokens=False)))
    assert "Low MFU" in gpt
    assert "channels-last" not in gpt
    assert "lit-compute tune --config" in gpt
    assert "channels-last weights for the convolutions" in image
