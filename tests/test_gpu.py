"""The CUDA paths of every measuring component, as a user sees them (run by scripts/gpu_checks.sh on a GPU).

On a machine without CUDA these are skipped: the CPU paths are covered by the other test files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from lit_compute import (
    DeviceMonitor,
    FlopsLogger,
    FP32BatchNormPrecision,
    ProfilerWindow,
    StepTimeMonitor,
    peak_flops,
)
from lit_compute.flops.peaks import PEAK_TABLE, chip_for_name

from .conftest import RandomImages, make_trainer, read_events, scalar_values, tiny_model

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _loader(sleep: float = 0.0) -> DataLoader:
    return DataLoader(RandomImages(sleep, n=256, size=64), batch_size=16, num_workers=0)


def _gpu_trainer(tmp_path, **kwargs):
    return make_trainer(tmp_path, accelerator="gpu", limit_val_batches=0, **kwargs)


def test_step_time_on_cuda_sees_the_gpu_wait_for_a_slow_loader(tmp_path):
    monitor = StepTimeMonitor(log_every_n_steps=2, window=6)
    trainer = _gpu_trainer(tmp_path, max_steps=8, limit_train_batches=8, callbacks=[monitor])
    trainer.fit(tiny_model(), train_dataloaders=_loader(sleep=0.005))  # 80 ms of loading per batch
    acc = read_events(trainer.logger.log_dir)
    fractions = [v for _, v in scalar_values(acc, "time/data_wait_fraction")]
    assert fractions, fractions
    assert min(fractions) > 0.5, fractions
    assert min(v for _, v in scalar_values(acc, "time/data_wait_ms")) > 60


def test_device_monitor_reads_nvml_for_the_training_gpu(tmp_path):
    trainer = _gpu_trainer(tmp_path, max_steps=3, callbacks=[DeviceMonitor(log_every_n_steps=1)])
    trainer.fit(tiny_model(), train_dataloaders=_loader())
    acc = read_events(trainer.logger.log_dir)
    total = scalar_values(acc, "device/gpu_memory_total_gb")[-1][1]
    assert total == pytest.approx(torch.cuda.get_device_properties(0).total_memory / 1e9, rel=0.05)
    assert 0 <= scalar_values(acc, "device/gpu_utilization_percent")[-1][1] <= 100
    assert scalar_values(acc, "device/gpu_power_w")[-1][1] > 0
    assert scalar_values(acc, "device/torch_max_memory_allocated_gb")[-1][1] > 0


def test_flops_logger_mfu_against_the_dense_bf16_table_peak(tmp_path):
    table = peak_flops(torch.device("cuda", 0), torch.bfloat16)
    if table is None:
        pytest.skip(f"{torch.cuda.get_device_name(0)} is not in the peak table")
    trainer = _gpu_trainer(
        tmp_path,
        max_steps=6,
        limit_train_batches=6,
        log_every_n_steps=2,
        callbacks=[FlopsLogger(peak="table")],
        plugins=[FP32BatchNormPrecision("bf16-mixed")],
    )
    trainer.fit(tiny_model(), train_dataloaders=_loader())
    acc = read_events(trainer.logger.log_dir)
    assert scalar_values(acc, "compute/peak_tflops")[-1][1] == pytest.approx(table / 1e12)
    mfu = [v for _, v in scalar_values(acc, "compute/mfu")]
    assert mfu
    assert all(0 < v < 1 for v in mfu)


def test_float32_peak_on_cuda_follows_each_tf32_switch(tmp_path):
    chip = chip_for_name(torch.cuda.get_device_name(0))
    if chip is None or "tf32" not in PEAK_TABLE[chip]:
        pytest.skip(f"{torch.cuda.get_device_name(0)} has no TF32 peak in the table")
    fp32, tf32 = PEAK_TABLE[chip]["float32"], PEAK_TABLE[chip]["tf32"]
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True  # torch's defaults
        trainer = _gpu_trainer(tmp_path, max_steps=3, callbacks=[FlopsLogger(peak="table")])
        trainer.fit(tiny_model(), train_dataloaders=_loader())
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    used = scalar_values(read_events(trainer.logger.log_dir), "compute/peak_tflops")[-1][1] * 1e12
    # a ResNet's convolutions run on TF32, its final linear layer in float32: in between, near TF32
    assert fp32 < used < tf32
    assert used > 0.5 * tf32


def test_measured_float32_peak_on_cuda_follows_each_tf32_switch(tmp_path):
    """peak='measure' in float32: the convolutions (cuDNN's TF32 switch, on by default) against the measured TF32
    GEMM peak, the rest against the float32 one (a float32-only peak gave a ResNet an MFU near 100%)."""
    from lit_compute.flops.peaks import cached_peak_flops

    fp32 = cached_peak_flops("cuda", torch.float32, tf32=False).flops
    tf32 = cached_peak_flops("cuda", torch.float32, tf32=True).flops
    assert tf32 > 2 * fp32  # Ampere and later: TF32 tensor cores
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    used = {}
    try:
        for conv_tf32 in (True, False):
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, conv_tf32
            trainer = _gpu_trainer(tmp_path / str(conv_tf32), max_steps=3, callbacks=[FlopsLogger(peak="measure")])
            trainer.fit(tiny_model(), train_dataloaders=_loader())
            peaks = scalar_values(read_events(trainer.logger.log_dir), "compute/peak_tflops")
            used[conv_tf32] = peaks[-1][1] * 1e12
            assert all(0 < v <= 1 for _, v in scalar_values(read_events(trainer.logger.log_dir), "compute/mfu"))
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    assert 0.5 * tf32 < used[True] < tf32  # mostly convolutions: near the TF32 peak
    assert used[False] == pytest.approx(fp32, rel=0.01)


def test_profiler_window_on_cuda_counts_each_step_once_and_measures_gpu_idle(tmp_path):
    window = ProfilerWindow(start_step=3, warmup=1, active=2)
    trainer = _gpu_trainer(tmp_path, max_steps=8, limit_train_batches=8, callbacks=[window])
    trainer.fit(tiny_model(), train_dataloaders=_loader())
    traces = sorted((Path(trainer.log_dir) / "profiler").glob("*.pt.trace.json"))
    assert [t.name for t in traces] == ["window1_steps3-4.pt.trace.json"]
    events = json.loads(traces[0].read_text())["traceEvents"]
    cpu_steps = sorted(
        int(m.group(1))
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
        and (m := re.match(r"^ProfilerStep#(\d+)$", str(e.get("name", ""))))
    )
    assert cpu_steps == [3, 4]
    assert any(e.get("cat") == "kernel" for e in events)  # CUDA activity was recorded
    acc = read_events(trainer.log_dir)
    idle = scalar_values(acc, "profiler/gpu_idle_fraction")
    assert len(idle) == 1
    assert 0.0 <= idle[0][1] < 1.0


def test_fsdp_gpt_logs_mfu_hfu_tokens_and_keeps_layernorm_float32(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import FSDPStrategy

    from lit_compute import FP32BatchNormFSDPPrecision
    from lit_compute.data import TokenDataModule
    from lit_compute.models import GPT, GPTBlock

    seen = {}

    class Look(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if not seen:
                ln = pl_module.blocks[0].ln_1
                # "and None": a forward hook that returns a value replaces the module's output
                ln.register_forward_hook(lambda m, i, o: seen.setdefault("ln", m.weight.dtype) and None)
                seen["hooked"] = True

    trainer = _gpu_trainer(
        tmp_path,
        max_steps=6,
        devices=1,
        strategy=FSDPStrategy(auto_wrap_policy={GPTBlock}),
        plugins=[FP32BatchNormFSDPPrecision("bf16-mixed", fp32_norms=["LayerNorm"])],
        callbacks=[Look(), FlopsLogger(peak="table", log_every_n_steps=2), StepTimeMonitor(log_every_n_steps=2)],
    )
    trainer.fit(
        GPT(block_size=128, n_layer=2, n_head=2, n_embd=64),
        datamodule=TokenDataModule(mode="padded", batch_size=8, seq_len=128, max_tokens=50_000),
    )
    acc = read_events(trainer.logger.log_dir)
    tags = set(acc.Tags()["scalars"])
    assert {"compute/mfu", "compute/hfu", "time/tokens_per_sec", "compute/padding_fraction"} <= tags
    assert seen["ln"] == torch.float32


def test_lstm_on_cudnn_is_counted(tmp_path):
    from torch import nn

    from lit_compute import count_flops

    lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True).cuda()
    x = torch.randn(4, 10, 16, device="cuda")
    count = count_flops(lstm, x, count_on="real")
    forward = 2 * 4 * 10 * (4 * 32 * 16 + 4 * 32 * 32) + 2 * 4 * 10 * (4 * 32 * 32 * 2)
    assert "aten._cudnn_rnn" in count.by_op
    assert count.forward == forward
    assert count.backward == 2 * forward


def test_fsdp2_on_one_gpu_keeps_norms_float32_and_counts_the_step(tmp_path):
    """ModelParallelStrategy (FSDP2 over NCCL) on one GPU with fully_shard_fp32_norms: norms in float32 inside
    forward, the rest in bf16; FlopsLogger's global FLOPs equal its own on one device."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch import nn

    from lit_compute import fully_shard_fp32_norms

    seen = {}

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 256), nn.LayerNorm(256), nn.Linear(256, 4))
            # "and None": a forward hook that returns a value replaces the module's output
            self.net[1].register_forward_hook(
                lambda m, i, o: seen.setdefault("ln", (i[0].dtype, m.weight.dtype)) and None
            )
            self.net[2].register_forward_hook(lambda m, i, o: seen.setdefault("fc", m.weight.dtype) and None)

        def configure_model(self):
            fully_shard_fp32_norms(self.net, self.device_mesh["data_parallel"], param_dtype=torch.bfloat16)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return self.net(x).float().square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = DataLoader(torch.utils.data.TensorDataset(torch.randn(256, 64)), batch_size=32)
    trainer = _gpu_trainer(
        tmp_path,
        max_steps=6,
        devices=1,
        strategy=ModelParallelStrategy(),
        callbacks=[FlopsLogger(peak="table", log_every_n_steps=2)],
    )
    trainer.fit(Net(), train_dataloaders=data)
    assert seen["ln"] == (torch.float32, torch.float32)
    assert seen["fc"] == torch.bfloat16
    acc = read_events(trainer.logger.log_dir)
    local = scalar_values(acc, "compute/flops_per_step")[-1][1]
    # forward, then backward: both grads of the last layer, only the weight grad of the first (its input needs none)
    assert scalar_values(acc, "compute/global_flops_per_step")[-1][1] == local == 2 * 32 * (2 * 64 * 256 + 3 * 256 * 4)


def test_memory_monitor_on_cuda_reads_the_allocators_peak_and_the_models_own_parts(tmp_path):
    from lit_compute import MemoryMonitor

    model = tiny_model()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    trainer = _gpu_trainer(tmp_path, max_steps=4, callbacks=[MemoryMonitor(log_every_n_steps=1)])
    trainer.fit(model, train_dataloaders=_loader())
    acc = read_events(trainer.logger.log_dir)
    peak = scalar_values(acc, "memory/peak_gb")[-1][1]
    # the named parts against the model's own bytes (not against the peak they are part of: "other" is the rest)
    assert scalar_values(acc, "memory/parameters_gb")[-1][1] * 1e9 == pytest.approx(param_bytes, rel=1e-3)
    assert scalar_values(acc, "memory/gradients_gb")[-1][1] * 1e9 == pytest.approx(param_bytes, rel=1e-3)
    assert 0 < peak * 1e9 <= torch.cuda.max_memory_allocated() * 1.001
    capacity = scalar_values(acc, "memory/capacity_gb")[-1][1]
    assert capacity == pytest.approx(torch.cuda.get_device_properties(0).total_memory / 1e9, rel=1e-6)


def test_estimate_on_cuda_is_within_10_percent_of_the_allocators_peak(tmp_path, monkeypatch):
    """lit-compute estimate on fake CUDA tensors against max_memory_allocated of real steps, three micro-batches
    (#49: cuDNN workspaces measured per convolution shape, cuBLAS workspaces and the caching allocator modelled);
    the reserved peak is reported beside it and is at least the allocated one."""
    import yaml

    from lit_compute._lightning_cli import LitComputeCLI
    from lit_compute.planning import estimate

    monkeypatch.chdir(tmp_path)
    config = {
        "trainer": {"accelerator": "gpu", "devices": 1, "logger": False, "enable_checkpointing": False},
        "model": {
            "class_path": "lit_compute.models.ImageClassifier",
            "init_args": {"arch": "resnet50", "num_classes": 10},
        },
        "data": {
            "class_path": "lit_compute.data.TorchvisionImageDataModule",
            "init_args": {"image_size": 128, "num_workers": 0, "batch_size": 16},
        },
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    plan = estimate(tmp_path / "c.yaml", micro_batches=[8, 16, 32])
    for row in plan.rows:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        LitComputeCLI(
            args=[
                "fit",
                "--config",
                "c.yaml",
                f"--data.init_args.batch_size={row.micro_batch}",
                "--trainer.max_steps=3",
                "--trainer.limit_val_batches=0",
                "--trainer.num_sanity_val_steps=0",
                "--trainer.enable_progress_bar=false",
                "--trainer.enable_model_summary=false",
            ]
        )
        measured, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        print(
            f"estimate on CUDA, micro-batch {row.micro_batch}: allocated {row.peak_bytes / 1e6:.1f} MB predicted, "
            f"{measured / 1e6:.1f} MB measured; reserved {row.reserved_bytes / 1e6:.1f} MB predicted, "
            f"{reserved / 1e6:.1f} MB measured"
        )
        assert row.reserved_bytes is not None
        assert row.reserved_bytes >= row.peak_bytes
        assert row.peak_bytes == pytest.approx(measured, rel=0.10), (row.micro_batch, row.peak_bytes, measured)


def test_a_gpu_run_is_priced_against_its_own_chip(tmp_path, capsys):
    """#46 on the device: a run trained here records its device and chip (run.json), and ``lit-compute whatif RUN``
    (its default ``--hardware run``) prices it on that chip, calibrated on its own measured step."""
    from lit_compute.planning.whatif import read_run
    from lit_compute.planning.whatif_cli import main
    from lit_compute.run_record import read_record

    trainer = _gpu_trainer(
        tmp_path,
        max_steps=12,
        limit_train_batches=12,
        log_every_n_steps=2,
        callbacks=[FlopsLogger(log_every_n_steps=2), StepTimeMonitor(log_every_n_steps=2)],
    )
    trainer.fit(tiny_model(), train_dataloaders=_loader())
    run_dir = trainer.logger.log_dir
    record = read_record(run_dir)
    name = torch.cuda.get_device_name(0)
    assert record.device == name
    assert record.chip == chip_for_name(name)
    if record.chip is None:
        pytest.skip(f"{name} is not in the hardware table: no chip to calibrate on")
    facts = read_run(run_dir)
    assert main([run_dir, "--json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["hardware"] == record.chip
    assert row["step_time_s"] == pytest.approx(facts.step_s, rel=1e-6)  # calibrated on the run's own step


def test_nccl_collective_waits_are_timed_on_the_stream(tmp_path):
    """#50 item 5 on a GPU: a one-process NCCL group. A collective's wait returns on the host at once under NCCL; the
    timeline's CUDA events around it (on the current stream) give the stream's time in it, read at the step's end:
    an all-gather of 256 MB queued behind matmuls is timed on the device, inside the forward."""
    import torch.distributed as dist

    from lit_compute.timeline import Timeline

    from .test_timeline import StubTrainer

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    trainer = StubTrainer(world_size=2)  # more than one rank: the timeline watches the collectives
    trainer.strategy.root_device = torch.device("cuda", torch.cuda.current_device())
    timeline = Timeline()
    big = torch.ones(64 * 2**20, device="cuda")
    out = torch.empty_like(big)
    a = torch.randn(4096, 4096, device="cuda")
    records = []
    try:
        timeline.train_start(trainer)
        assert timeline._device_comm
        for _ in range(3):
            timeline.batch_start(trainer, torch.zeros(4, 3))
            for _ in range(10):
                a = a @ a
                a = a / a.norm()
            dist.all_gather_into_tensor(out, big)  # the current stream waits for it; the host does not
            timeline.before_backward()
            trainer.finish_batch()
            records.append(timeline.batch_end(trainer))
    finally:
        timeline.stop_watching()
        dist.destroy_process_group()
    comm, forward_comm, between = records[-1].device_comm_times()
    _, compute = records[-1].device_times()
    assert 0.0 < comm == forward_comm < compute
    assert between == 0.0
    assert torch.equal(out, big)


@pytest.mark.parametrize("model", ["resnet50", "gpt"])
def test_prometheus_labels_are_nvmls_and_gpm_tensor_activity_is_logged_beside_mfu(tmp_path, model):
    """#71 items 1, 2 and 5: the series PrometheusLogger serves carry NVML's gpu index, UUID and name (what DCGM's
    exporter labels); on a GPU with GPM (Hopper and newer) DeviceMonitor logs the tensor pipe's activity beside MFU,
    and the share of that busy time the counted FLOPs explain is printed."""
    import urllib.request

    import pynvml
    from lightning.pytorch.loggers import TensorBoardLogger
    from prometheus_client.parser import text_string_to_metric_families

    from lit_compute import PrometheusLogger
    from lit_compute.data import TokenDataModule
    from lit_compute.models import GPT
    from lit_compute.monitoring.device_labels import nvml_handle

    prom = PrometheusLogger(port=0, keep_serving=True)
    tb_logger = TensorBoardLogger(str(tmp_path), "tb")
    trainer = _gpu_trainer(
        tmp_path,
        max_steps=12,
        limit_train_batches=12,
        precision="bf16-mixed",
        logger=[tb_logger, prom],
        callbacks=[
            FlopsLogger(peak="table", log_every_n_steps=4),
            DeviceMonitor(log_every_n_steps=4),
            StepTimeMonitor(log_every_n_steps=4),
        ],
    )
    try:
        if model == "gpt":
            trainer.fit(
                GPT(block_size=256, n_layer=4, n_head=8, n_embd=512),
                datamodule=TokenDataModule(mode="packed", batch_size=16, seq_len=256, max_tokens=400_000),
            )
        else:
            trainer.fit(tiny_model(arch="resnet50"), train_dataloaders=_loader())
        with urllib.request.urlopen(f"http://127.0.0.1:{prom.port_in_use}/metrics", timeout=10) as response:
            families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    finally:
        prom.close()
    labels = families["lit_compute_compute_mfu"].samples[0].labels
    pynvml.nvmlInit()
    try:
        handle = nvml_handle(pynvml, torch.device("cuda", 0))
        uuid, index, name = (
            pynvml.nvmlDeviceGetUUID(handle),
            pynvml.nvmlDeviceGetIndex(handle),
            pynvml.nvmlDeviceGetName(handle),
        )
        gpm = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    finally:
        pynvml.nvmlShutdown()
    text = lambda v: v.decode() if isinstance(v, bytes) else str(v)  # noqa: E731 - nvidia-ml-py's str or bytes
    assert (labels["UUID"], labels["gpu"], labels["modelName"]) == (text(uuid), str(index), text(name)), labels
    acc = read_events(tb_logger.log_dir)
    mfu = scalar_values(acc, "compute/mfu")[-1][1]
    if not gpm:
        print(f"{model}: MFU {mfu:.3f}; {text(name)} has no GPM: no tensor-pipe activity to set beside it")
        return
    active = scalar_values(acc, "device/prof_pipe_tensor_active")[-1][1]
    assert 0 < active <= 1, active
    print(
        f"{model}: MFU {mfu:.3f}, tensor pipe active {active:.3f} (GPM); counted FLOP/s / (tensor active x dense "
        f"peak) = {mfu / active:.3f}"
    )
