"""``lit-compute bench whatif [--markdown FILE] [--only PARTS] [--errors FILE]``: lit-compute whatif's predictions
beside measurements.

Seven parts, each a table (predicted vs measured with the error, unless said otherwise):

- ``cpu``: calibrated on one measured run of this CPU, the runs at twice the micro-batch, in bf16-mixed instead of
  float32, both, and a deeper model of the same family, each trained and measured here (ResNet-18, the GPT, and
  ResNet-50 held out);
- ``comm``: two gloo ranks (DDP, and FSDP2 under ModelParallelStrategy) - the collectives' time per step predicted
  from the model's gradient (or parameter) bytes and the run's CommBenchmark bandwidth against the time the
  profiler measured in collectives;
- ``gpu``: published GPU training throughputs (``published_gpu.csv``: NVIDIA DeepLearningExamples, Lambda's
  benchmark, this project's H200 runs, each row cited) against the prediction from the model's step counted on fake
  tensors at the published batch, at the default efficiencies; the fit set (the rows ``--fit-defaults`` sets the
  defaults on) and the check set (never fitted on) each with its median and largest error; ``--errors`` also writes
  the check rows as JSON, which ``whatif`` quotes beside a prediction on their chips;
- ``input``: an input-bound run (a loader decoding 224 px images in the training process) calibrated at one
  micro-batch and predicting two others on this CPU, measured (the loader's cost per batch and per sample timed
  apart from the run);
- ``run``: a CPU ResNet-50 run priced on NVIDIA's published V100 and A100 results, the path a user takes;
- ``scaling``: twice the micro-batch outside Lightning, measured only (the ratios the CPU rows are read against);
- ``setup``: the convolutions' set-up on this CPU measured in a fresh process, after a warmed allocator and inside a
  Lightning run, measured only.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lit_compute.bench._common import emit, figure_header, machine_line, markdown
from lit_compute.speedup.channels_last import ChannelsLast

ROOT = Path(__file__).resolve().parents[2]
_LOGGER = (
    "--trainer.logger=[{class_path: lightning.pytorch.loggers.TensorBoardLogger, init_args: {save_dir: %s, "
    "name: runs}}]"
)
_IMAGE = [
    "--config",
    "configs/baseline.yaml",
    "--trainer.max_steps=50",
    "--trainer.max_epochs=null",
    "--trainer.log_every_n_steps=5",
    "--trainer.limit_val_batches=0",
    "--trainer.num_sanity_val_steps=0",
    "--trainer.enable_progress_bar=false",
    "--data.init_args.image_size=64",
    "--data.init_args.num_workers=0",
    "--model.init_args.arch=resnet18",
    "--data.init_args.batch_size=16",
]
_GPT = [
    "--config",
    "configs/gpt_baseline.yaml",
    "--trainer.max_steps=50",
    "--trainer.max_epochs=null",
    "--trainer.log_every_n_steps=5",
    "--trainer.limit_val_batches=0",
    "--trainer.num_sanity_val_steps=0",
    "--trainer.enable_progress_bar=false",
    "--data.init_args.mode=packed",
    "--data.init_args.seq_len=128",
    "--data.init_args.max_tokens=300000",
    "--model.init_args.block_size=128",
    "--model.init_args.n_layer=2",
    "--data.init_args.batch_size=8",
]
MEASURING_CALLBACKS = (
    "--trainer.callbacks=[{class_path: lit_compute.FlopsLogger, init_args: {peak: measure}}, "
    "{class_path: lit_compute.StepTimeMonitor, init_args: {window: 10}}, "
    "{class_path: lit_compute.MemoryMonitor}]"
)


def fit_run(args: list[str], out: str, timeout: float = 900) -> Path:
    """Train with ``lit-compute fit`` in a fresh process; the run's TensorBoard folder."""
    command = [sys.executable, "-m", "lit_compute.cli", "fit", *args, _LOGGER % out]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"lit-compute fit {' '.join(args[:2])} failed: {done.stderr[-1500:]}")
    return max(Path(out, "runs").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))


def _error(predicted: float, measured: float) -> str:
    return f"{100 * (predicted / measured - 1):+.1f}%"


# -- this CPU ---------------------------------------------------------------------------------------------------
def _median_run(runs: list[Any]) -> Any:
    """The run of median step time (the facts of one real run, not an average of several)."""
    return sorted(runs, key=lambda r: r.step_s)[len(runs) // 2]


def cpu_part(out: str, repeats: int = 5) -> list[list[Any]]:
    """Each configuration trained ``repeats`` times, the rounds interleaved (every configuration once per round, so a
    slow spell of the machine touches them all alike); each figure is the run of median step time. ResNet-50 is
    held out: it was added after the convolutions' set-up was priced, to check it on a net that chose nothing. A
    convolutional row also gives the prediction without the set-up (the same runs, the term left out)."""
    from lit_compute.hardware.this_machine import this_machine, with_conv_setup
    from lit_compute.planning.config_facts import with_counts_at
    from lit_compute.planning.whatif import Scenario, calibrate, predict, read_run, with_loader_cost

    chip = with_conv_setup(this_machine())  # as lit-compute whatif RUN --hardware this measures it
    without = dataclasses.replace(chip, conv_setup={})
    resnet50 = [a.replace("arch=resnet18", "arch=resnet50").replace("batch_size=16", "batch_size=8") for a in _IMAGE]
    rows = []
    for family, base, deeper in (
        ("ResNet-18 64 px", _IMAGE, ["--model.init_args.arch=resnet34"]),
        ("GPT 2 layers", _GPT, ["--model.init_args.n_layer=4"]),
        ("ResNet-50 64 px (held out)", resnet50, None),
    ):
        size = int(next(a for a in base if "batch_size" in a).split("=")[1])
        targets = [
            ("calibration", [], size, "32-true"),
            (f"micro-batch {2 * size}", [f"--data.init_args.batch_size={2 * size}"], 2 * size, "32-true"),
            ("bf16-mixed", ["--trainer.precision=bf16-mixed"], size, "bf16-mixed"),
            (
                f"bf16-mixed, micro-batch {2 * size}",
                [f"--data.init_args.batch_size={2 * size}", "--trainer.precision=bf16-mixed"],
                2 * size,
                "bf16-mixed",
            ),
            *([("deeper model (its own counts)", deeper, size, "32-true")] if deeper else []),
        ]
        runs: dict[str, list[Any]] = {name: [] for name, *_ in targets}
        for round_ in range(repeats):
            # the order turns each round: no configuration is always the first run (or the one after the deepest)
            for name, extra, _, _ in targets[round_ % len(targets) :] + targets[: round_ % len(targets)]:
                emit(f"  {family}: {name} (round {round_ + 1} of {repeats}) ...")
                runs[name].append(read_run(fit_run([*base, *extra, MEASURING_CALLBACKS], out)))
        base_run = with_loader_cost(_median_run(runs["calibration"]))
        calibration = ", ".join(f"{r.step_s * 1e3:.0f}" for r in sorted(runs["calibration"], key=lambda r: r.step_s))
        cal = calibrate(base_run, chip)
        bare_cal = calibrate(base_run, without)  # the same run calibrated with the set-up left in
        for precision in sorted({t[3] for t in targets} - {base_run.precision}):
            with_counts_at(base_run, precision)  # as lit-compute whatif RUN --precision does for a CPU target
        for name, _, micro, precision in targets[1:]:
            measured = _median_run(runs[name])
            source = measured if "deeper" in name else base_run
            p = predict(source, Scenario(chip, precision, micro), cal)
            spread = [r.step_s * 1e3 for r in runs[name]]
            what = (
                f"calibrated on micro-batch {size}, 32-true (runs: {calibration} ms); predicts {name} (measured "
                f"runs: {', '.join(f'{v:.0f}' for v in sorted(spread))} ms)"
            )
            if base_run.conv_weights:
                bare = predict(source, Scenario(without, precision, micro), bare_cal)
                what += (
                    f"; without the convolutions' set-up {bare.step_time_s * 1e3:.1f} ms "
                    f"({_error(bare.step_time_s, measured.step_s)})"
                )
            rows.append(
                [
                    family,
                    what,
                    f"{p.step_time_s * 1e3:.1f}",
                    f"{measured.step_s * 1e3:.1f}",
                    _error(p.step_time_s, measured.step_s),
                ]
            )
    return rows


# -- collectives on two gloo ranks ------------------------------------------------------------------------------
def comm_part(out: str, repeats: int = 3) -> list[list[Any]]:
    """Each layout trained ``repeats`` times, the rounds interleaved; the row is the run of median measured time
    (its prediction from its own facts), the other runs' measured times printed beside it."""
    from lit_compute.hardware.this_machine import this_machine
    from lit_compute.planning.whatif import Scenario, calibrate, host_contention, predict, read_run
    from lit_compute.profiling.trace_summary import transfer_time_per_step

    chip = this_machine()
    profiler = (
        "{class_path: lit_compute.ProfilerWindow, init_args: {start_step: 12, warmup: 2, active: 6}}, "
        "{class_path: lit_compute.CommBenchmark, init_args: {max_mb: 16, seconds: 4}}"
    )
    callbacks = MEASURING_CALLBACKS[:-1] + ", " + profiler + "]"
    layouts = (
        ("DDP, 2 gloo ranks", [*_IMAGE, "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.accelerator=cpu"]),
        (
            "FSDP2, 2 gloo ranks",
            [
                "--config",
                "configs/gpt_model_parallel.yaml",
                *_GPT[2:],
                "--trainer.strategy.init_args.data_parallel_size=2",
                "--trainer.strategy.init_args.tensor_parallel_size=1",
                "--trainer.accelerator=cpu",
            ],
        ),
    )
    measured: dict[str, list[tuple[float, Any, Any]]] = {name: [] for name, _ in layouts}
    for round_ in range(repeats):
        for name, args in layouts:
            emit(f"  {name} (round {round_ + 1} of {repeats}) ...")
            folder = fit_run([*args, callbacks], out)
            run = read_run(folder)
            traces = sorted(folder.rglob("*.pt.trace.json"))
            transfer = transfer_time_per_step(traces) if len(traces) == run.world_size else None
            if run.comm_fraction and run.curves and run.step_s and transfer is not None:
                scenario = Scenario(chip, run.precision, run.samples, 1, run.world_size)
                measured[name].append(
                    (transfer, run, predict(run, scenario, calibrate(run, chip), measured_links=True))
                )
    rows = []
    for name, _ in layouts:
        if not measured[name]:
            rows.append([name, "the run measured no collective time or bandwidth", "n/a", "n/a", "n/a"])
            continue
        # each run predicts from its own CommBenchmark curve and overlap: the row is the median of the predictions
        # against the median of the measurements, every run's pair shown
        runs = measured[name]
        predicted = sorted(p.comm_total_s for _, _, p in runs)[len(runs) // 2]
        transfer, run, _ = sorted(runs, key=lambda m: m[0])[len(runs) // 2]
        scenario = Scenario(chip, run.precision, run.samples, 1, run.world_size)
        pairs = ", ".join(f"{p.comm_total_s * 1e3:.1f}/{m * 1e3:.1f}" for m, _, p in runs)
        overlaps = ", ".join(f"{100 * (r.comm_overlap or 0):.0f}%" for _, r, _ in runs)
        rows.append(
            [
                name,
                f"the collectives' own time per step: each one's shortest duration over the ranks, from "
                f"both ranks' traces (runs, predicted/measured: {pairs} ms; in flight on rank 0, waiting for "
                f"the other rank included: {run.comm_fraction * run.step_s * 1e3:.1f} ms); "
                f"{run.trainable / 1e6:.3g} M parameters, messages priced at CommBenchmark's measured bandwidth "
                f"for their size; {overlaps} of them overlapped the backward, at "
                f"{host_contention(run, scenario):.2g}x their idle time ({run.torch_threads} compute thread(s) "
                f"and gloo's on {run.cpu_cores} core(s) for {run.devices_per_node} ranks)",
                f"{predicted * 1e3:.1f}",
                f"{transfer * 1e3:.1f}",
                _error(predicted, transfer),
            ]
        )
    return rows


# -- published GPU results --------------------------------------------------------------------------------------
PUBLISHED_FILE = Path(__file__).with_name("published_gpu.csv")


def published_rows() -> list[dict[str, Any]]:
    """The rows of ``published_gpu.csv``: set ("fit" or "check"), model, chip, precision, memory_format
    ("channels_last" when the source convolved channels-last, else "contiguous"), batch, samples_per_s, source (the
    file's header says how the sets were chosen)."""
    import csv

    lines = [line for line in PUBLISHED_FILE.read_text().splitlines() if line and not line.startswith("#")]
    rows = []
    for row in csv.DictReader(lines):
        rows.append(
            {
                **row,
                "batch": int(row["batch"]),
                "samples_per_s": float(row["samples_per_s"]),
                "memory_format": row.get("memory_format") or "contiguous",
            }
        )
    return rows


@functools.cache
def traced_facts(model: str, batch: int, memory_format: str = "contiguous") -> Any:
    """The op-class counts of one training step of ``model`` at ``batch``, counted on fake tensors (shapes only)
    the way FlopsLogger counts a real step: forward, loss, backward, the optimizer's step; the network's weights
    channels-last when ``memory_format`` says so (its convolutions then run channels-last, as the source's did)."""
    import torch

    from lit_compute import _compat
    from lit_compute.flops.counting import SafeFlopCounterMode
    from lit_compute.planning.estimate import fake_tensors
    from lit_compute.planning.whatif import ChannelsFirst, OpCost, RunFacts

    fake_mode = _compat.fake_tensor_mode()
    with torch.device("meta"):
        net, step = zoo_model(model)
        if memory_format == "channels_last":  # as lit_compute.speedup.ChannelsLast lays out a run's module
            net = ChannelsLast().convert_module(net)
    fake_tensors(net, fake_mode, torch.device("cpu"))
    optimizer = zoo_optimizer(model, net)
    counter = SafeFlopCounterMode(display=False, depth=99, module_paths=net, hookless=True)
    with fake_mode, counter:
        step(net, batch).backward()
        counter.in_optimizer_step = True
        optimizer.step()
    count = counter.result()
    trainable = sum(p.numel() for p in net.parameters())
    return RunFacts(
        path=Path(f"{model} traced at batch {batch}"),
        by_class={kind: OpCost.of(cost) for kind, cost in count.by_class.items()},
        samples=batch,
        model_flops=count.total,
        trainable=trainable,
        parameters=trainable,
        precision="32-true",
        device="traced",
        loader_workers=None,
        conv_weights=float(count.conv_weights),
        channels_first=ChannelsFirst(*(float(n) for n in count.channels_first)),
    )


def zoo_optimizer(model: str, net: Any) -> Any:
    """The optimizer each source trains with: SGD with momentum (DLE's ResNets), RMSprop (DLE's EfficientNets),
    AdamW (BERT, the GPT)."""
    import torch

    if model.startswith(("resnet", "resnext", "se-resnext")):
        return torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.875, foreach=True)
    if model.startswith("efficientnet"):
        return torch.optim.RMSprop(net.parameters(), lr=0.01, alpha=0.9, eps=0.01, momentum=0.9, foreach=True)
    return torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=True)


def _image_step(size: int) -> Any:
    def step(net: Any, batch: int) -> Any:
        x, y = torch.randn(batch, 3, size, size), torch.zeros(batch, dtype=torch.long)
        return torch.nn.functional.cross_entropy(net(x), y)

    return step


#: how NVIDIA's BERT (DeepLearningExamples' modeling.py, which the fit rows and Lambda's SQuAD rows ran) attends: two
#: batched matmuls around a scale, the padding mask added, a softmax and a dropout, each its own kernel, the scores
#: written out in between; not a fused (flash) kernel, which transformers would choose by default
_DLE_ATTENTION = "eager"


def zoo_model(name: str) -> tuple[Any, Any]:
    """``(network, step)`` for a model of published_gpu.csv: ``step(net, batch)`` returns the loss of one batch of
    the shape the source trained on (224 px images, 380 px for EfficientNet-B4; 128 tokens for BERT pre-training, 384
    for SQuAD; 1,024 for the GPT)."""
    import torchvision

    if name == "resnet50":
        return torchvision.models.resnet50(), _image_step(224)
    if name == "resnext101-32x4d":  # torchvision's ResNeXt-101 is 32x8d; 32x4d is the same blocks, half as wide
        from torchvision.models.resnet import Bottleneck, ResNet

        return ResNet(Bottleneck, [3, 4, 23, 3], groups=32, width_per_group=4), _image_step(224)
    if name == "se-resnext101-32x4d":
        try:
            import timm
        except ImportError as err:  # pragma: no cover - timm is in the dev extra
            raise RuntimeError("SE-ResNeXt-101-32x4d is built with timm: pip install 'lit-compute[dev]'") from err
        return timm.create_model("seresnext101_32x4d", pretrained=False), _image_step(224)
    if name in ("efficientnet-b0", "efficientnet-b4"):
        size = 224 if name.endswith("b0") else 380
        return torchvision.models.get_model(name.replace("-", "_"), weights=None), _image_step(size)
    if name == "gpt":
        from lit_compute.models import GPT

        def gpt_step(net: Any, batch: int) -> Any:
            return net._loss({"input_ids": torch.zeros(batch, 1024, dtype=torch.long)})

        return GPT(block_size=1024, n_layer=12, n_head=12, n_embd=768), gpt_step
    if name in ("bert-large-squad", "bert-base-squad"):
        return _bert_squad(large=name.startswith("bert-large"))
    if name != "bert-large":
        raise ValueError(f"no model {name!r} in lit-compute bench whatif")
    from transformers import BertConfig, BertModel

    config = BertConfig(
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
        vocab_size=30528,
        attn_implementation=_DLE_ATTENTION,
    )
    encoder = BertModel(config, add_pooling_layer=True)
    heads = torch.nn.ModuleDict(
        {
            "transform": torch.nn.Linear(1024, 1024),
            "norm": torch.nn.LayerNorm(1024),
            "decoder": torch.nn.Linear(1024, 30528),
            "nsp": torch.nn.Linear(1024, 2),
        }
    )
    net = torch.nn.ModuleDict({"bert": encoder, "heads": heads})

    def bert_step(model: Any, batch: int) -> Any:
        # the masked-LM head on the masked positions only (20 of 128, as NVIDIA's pre-training gathers them)
        ids = torch.zeros(batch, 128, dtype=torch.long)
        out = model["bert"](input_ids=ids, attention_mask=torch.ones(batch, 128, dtype=torch.long))
        masked = out.last_hidden_state[:, :20]
        h = model["heads"]["norm"](torch.nn.functional.gelu(model["heads"]["transform"](masked)))
        logits = model["heads"]["decoder"](h)
        mlm = torch.nn.functional.cross_entropy(logits.reshape(-1, 30528), torch.zeros(batch * 20, dtype=torch.long))
        nsp = torch.nn.functional.cross_entropy(
            model["heads"]["nsp"](out.pooler_output), torch.zeros(batch, dtype=torch.long)
        )
        return mlm + nsp

    return net, bert_step


def _bert_squad(large: bool) -> tuple[Any, Any]:
    """BERT fine-tuned on SQuAD as NVIDIA's run_squad.py does it: the encoder, a start/end head, 384 tokens."""
    from transformers import BertConfig, BertForQuestionAnswering

    width, layers, heads = (1024, 24, 16) if large else (768, 12, 12)
    config = BertConfig(
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        vocab_size=30522,
        attn_implementation=_DLE_ATTENTION,
    )
    net = BertForQuestionAnswering(config)

    def squad_step(model: Any, batch: int) -> Any:
        ids = torch.zeros(batch, 384, dtype=torch.long)
        target = torch.zeros(batch, dtype=torch.long)
        return model(
            input_ids=ids, attention_mask=torch.ones_like(ids), start_positions=target, end_positions=target
        ).loss

    return net, squad_step


#: the parameters --fit-defaults fits (each within its bounds); bandwidth and network stay at their defaults
FITTED = {
    "tensor": (0.05, 1.0),
    "vector": (0.05, 1.0),
    "tf32": (0.05, 1.0),
    "conv_tensor": (0.05, 1.0),
    "conv_vector": (0.05, 1.0),
    "conv_tf32": (0.05, 1.0),
    "grouped": (0.02, 1.0),
    "depthwise": (0.02, 1.0),
    "launch_s": (1e-6, 3e-5),
    "sm": (0.1, 100.0),
}


def _calibration(values: dict[str, float]) -> Any:
    from lit_compute.planning import whatif

    return whatif.Calibration(
        values["tensor"],
        values["vector"],
        values["bandwidth"],
        values["launch_s"],
        values["network"],
        "fit",
        values["conv_tensor"],
        values["conv_vector"],
        values["tf32"],
        values["conv_tf32"],
        values["grouped"],
        values["depthwise"],
        values["sm"],
    )


def _predicted(row: dict[str, Any], cal: Any) -> float:
    from lit_compute.hardware.chips import find_chip
    from lit_compute.planning.whatif import Scenario, predict

    facts = traced_facts(row["model"], row["batch"], row["memory_format"])
    return predict(facts, Scenario(find_chip(row["chip"]), row["precision"], row["batch"]), cal).samples_per_s


def gpu_predictions() -> list[dict[str, Any]]:
    """Every row of published_gpu.csv with its prediction at the default efficiencies (``predicted``), the fit rows
    first."""
    from lit_compute.planning.whatif import default_calibration

    cal, rows = default_calibration(), []
    for row in sorted(published_rows(), key=lambda r: r["set"] != "fit"):
        emit(f"  {row['model']} at batch {row['batch']} on {row['chip']}, {row['precision']} ...")
        rows.append({**row, "predicted": _predicted(row, cal)})
    return rows


def gpu_part(predictions: list[dict[str, Any]] | None = None) -> list[list[Any]]:
    """The table of :func:`gpu_predictions`: set, workload, source, predicted, published, error."""
    rows = []
    for row in gpu_predictions() if predictions is None else predictions:
        layout = ", channels-last" if row["memory_format"] == "channels_last" else ""
        rows.append(
            [
                row["set"],
                f"{row['model']} on {row['chip']}, {row['precision']}{layout}, batch {row['batch']}",
                row["source"],
                f"{row['predicted']:,.0f}",
                f"{row['samples_per_s']:,.0f}",
                _error(row["predicted"], row["samples_per_s"]),
            ]
        )
    return rows


def write_check_errors(predictions: list[dict[str, Any]], path: str | Path, command: str) -> None:
    """The check rows of :func:`gpu_predictions` as JSON (chip, precision, model, batch, layout, predicted,
    published), with the command, the commit and the default efficiencies they were priced at: what ``whatif``
    quotes beside a prediction on one of those chips (:func:`lit_compute.planning.whatif.checked_on`)."""
    import datetime
    import json

    from lit_compute.figures import commit_description
    from lit_compute.planning.whatif import DEFAULT_EFFICIENCY

    data = {
        "command": command,
        "commit": commit_description(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "efficiencies": dict(DEFAULT_EFFICIENCY),
        "fitted_on": sorted({(row["chip"], row["precision"]) for row in predictions if row["set"] == "fit"}),
        "rows": [
            {k: row[k] for k in ("chip", "precision", "model", "batch", "memory_format", "predicted")}
            | {"published": row["samples_per_s"]}
            for row in predictions
            if row["set"] == "check"
        ],
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def transposes_summary(predictions: list[dict[str, Any]]) -> str:
    """The check rows of :func:`gpu_predictions` whose convolutions ran channels-first at 16 bits, as priced (the
    transposes cuDNN adds around its tensor-core convolutions among them: ``whatif``'s ``transpose`` class) and
    priced again with the transposes left out: what that one term is worth against results it was not fitted on.
    Empty when no row has such convolutions."""
    import dataclasses
    import statistics

    from lit_compute.hardware.chips import find_chip
    from lit_compute.planning.whatif import ChannelsFirst, Scenario, default_calibration, pays_transposes, predict

    cal = default_calibration()
    errors: dict[str, list[float]] = {"priced": [], "left out": []}
    for row in predictions:
        chip = find_chip(row["chip"])
        if row["set"] != "check" or not pays_transposes(chip, row["precision"]):
            continue
        facts = traced_facts(row["model"], row["batch"], row["memory_format"])
        if not facts.channels_first[2]:
            continue
        scenario = Scenario(chip, row["precision"], row["batch"])
        without = predict(dataclasses.replace(facts, channels_first=ChannelsFirst(0.0, 0.0, 0.0)), scenario, cal)
        errors["priced"].append(abs(row["predicted"] / row["samples_per_s"] - 1) * 100)
        errors["left out"].append(abs(without.samples_per_s / row["samples_per_s"] - 1) * 100)
    if not errors["priced"]:
        return ""
    return (
        f"- **check rows convolving channels-first at 16 bits** ({len(errors['priced'])} rows): median absolute "
        f"error {statistics.median(errors['priced']):.1f}% with cuDNN's transposes priced, "
        f"{statistics.median(errors['left out']):.1f}% with them left out"
    )


def summary(rows: list[list[Any]]) -> str:
    """Each set's median and largest absolute error and how many rows are within 30% (from the rows' error column)."""
    lines = []
    for name in ("fit", "check"):
        errors = sorted(abs(float(r[-1].rstrip("%"))) for r in rows if r[0] == name)
        if not errors:
            continue
        median = (
            errors[len(errors) // 2]
            if len(errors) % 2
            else (errors[len(errors) // 2 - 1] + errors[len(errors) // 2]) / 2
        )
        lines.append(
            f"- **{name} set** ({len(errors)} rows): median absolute error {median:.1f}%, largest "
            f"{errors[-1]:.1f}%, {sum(e <= 30 for e in errors)} of {len(errors)} within 30%"
        )
    return "\n".join(lines)


def generation(chip: str) -> str:
    """The architecture of a table key (``h100-sxm``: Hopper, the hardware table's ``Chip.architecture``), or the key
    itself where the table names none."""
    from lit_compute.hardware.chips import CHIPS

    row = CHIPS.get(chip)
    return row.architecture if row is not None and row.architecture else chip


def generations_summary(predictions: list[dict[str, Any]]) -> str:
    """The check rows' signed errors by chip generation (Volta, Ampere, Ada, Hopper) and precision class (16 bits,
    TF32, float32): each group's median and range, where the defaults fitted on Volta and Ampere lean fast or slow.
    Empty without check rows."""
    import statistics

    from lit_compute.planning.whatif import precision_class

    by: dict[tuple[str, str], list[float]] = {}
    for row in predictions:
        if row["set"] == "check":
            key = (generation(row["chip"]), precision_class(row["precision"]))
            by.setdefault(key, []).append(100 * (row["predicted"] / row["samples_per_s"] - 1))
    order = ["Volta", "Ampere", "Ada", "Hopper", "Blackwell"]
    parts = [
        f"{name} at {bits}: {len(errors)} row(s), median {statistics.median(errors):+.1f}% "
        f"({min(errors):+.1f}% to {max(errors):+.1f}%)"
        for (name, bits), errors in sorted(
            by.items(), key=lambda kv: (order.index(kv[0][0]) if kv[0][0] in order else len(order), kv[0])
        )
    ]
    return (
        f"- **check set by generation** (signed: + predicted faster than published): {'; '.join(parts)}"
        if parts
        else ""
    )


def fit_defaults() -> dict[str, float]:
    """The default efficiencies that fit the rows of the fit set best: the sum of the squared log errors over them
    minimized one parameter at a time (golden-section search in log space within :data:`FITTED`'s bounds), six
    sweeps; bandwidth and network held at their defaults. The check rows take no part."""
    import math

    from lit_compute.planning import whatif

    rows = [r for r in published_rows() if r["set"] == "fit"]
    fitted = dict(whatif.DEFAULT_EFFICIENCY)
    for key, (low, high) in FITTED.items():  # start in the middle of each range: the result never depends on the
        fitted[key] = math.sqrt(low * high)  # defaults in the code, which it is checked against

    def loss(values: dict[str, float]) -> float:
        cal = _calibration(values)
        return sum(math.log(_predicted(r, cal) / r["samples_per_s"]) ** 2 for r in rows)

    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(6):
        for key, (low, high) in FITTED.items():
            a, b = math.log(low), math.log(high)
            for _ in range(40):
                c, d = b - ratio * (b - a), a + ratio * (b - a)
                if loss({**fitted, key: math.exp(c)}) <= loss({**fitted, key: math.exp(d)}):
                    b = d
                else:
                    a = c
            fitted[key] = math.exp((a + b) / 2)
    return {k: float(f"{v:.3g}") if k in FITTED else v for k, v in fitted.items()}


# -- why a larger micro-batch on this CPU leans slow -------------------------------------------------------------
def scaling_part(out: str, rounds: int = 5, steps: int = 6) -> list[list[Any]]:
    """The CPU rows at twice the micro-batch, taken apart outside Lightning: torchvision's ResNet-18 and ResNet-34 at
    64 px (as the CPU rows train them) and ResNet-18's last 3x3 convolution alone (512 channels on 2x2 px), forward
    and backward only (no optimizer, no loader), at micro-batches 16 and 32; the rounds interleaved, each figure a
    round's median step. The FLOPs double with the batch; each round's ratio is printed, since the machine's other
    work and the allocator's state move them."""
    import statistics
    import time

    import torchvision

    conv = torch.nn.Conv2d(512, 512, 3, padding=1, bias=False)
    nets = [
        ("ResNet-18 64 px, forward + backward", torchvision.models.resnet18(num_classes=10), 64, 3),
        ("ResNet-34 64 px, forward + backward", torchvision.models.resnet34(num_classes=10), 64, 3),
        ("ResNet-18's last 3x3 convolution (512 channels, 2x2 px), forward + backward", conv, 2, 512),
    ]
    times: dict[tuple[int, int], list[float]] = {}
    for _ in range(rounds):
        for index, (_, net, pixels, channels) in enumerate(nets):
            for batch in (16, 32):
                x = torch.randn(batch, channels, pixels, pixels)
                net(x).sum().backward()  # warm: oneDNN's primitives for this shape
                steps_s = []
                for _ in range(steps):
                    start = time.perf_counter()
                    net(x).sum().backward()
                    steps_s.append(time.perf_counter() - start)
                times.setdefault((index, batch), []).append(statistics.median(steps_s) * 1e3)
    rows = []
    for index, (name, *_rest) in enumerate(nets):
        small, large = times[(index, 16)], times[(index, 32)]
        ratios = sorted(b / a for a, b in zip(small, large))
        rows.append(
            [
                name,
                f"{statistics.median(small):.1f} / {statistics.median(large):.1f}",
                ", ".join(f"{r:.2f}" for r in ratios),
                f"{statistics.median(ratios):.2f}",
            ]
        )
    return rows


class SetupProbe(pl.Callback):
    """Measures the convolutions' set-up (:func:`~lit_compute.hardware.measure.measure_conv_setup`, float32) inside
    the training process after ``step`` optimizer steps, once, and writes ``[seconds per byte, quiet]`` as JSON to
    ``path``: the state of the allocator a Lightning run is in, which ``whatif`` prices with."""

    def __init__(self, path: str, step: int = 20) -> None:
        self.path, self.step, self.done = path, step, False

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        from lit_compute.hardware.measure import measure_conv_setup

        if trainer.global_step >= self.step and not self.done:
            self.done = True
            found = measure_conv_setup(torch.float32)
            Path(self.path).write_text(json.dumps([found.seconds_per_byte, found.quiet]))


def setup_part(out: str, rounds: int = 3) -> list[list[Any]]:
    """Where the convolutions' set-up is measured (float32, ns a weight byte), ``rounds`` interleaved rounds: in a
    fresh process (what ``whatif`` caches), in a fresh process that first took and freed 24 MiB (glibc's malloc then
    serves the reorders' buffers from its heap), and inside a Lightning run of the CPU rows' ResNet-18 after 20
    steps (:class:`SetupProbe`): which of the two states training is in."""
    from lit_compute.hardware.this_machine import conv_setup_in_fresh_process

    found: dict[str, list[float]] = {
        "a fresh process (what whatif measures)": [],
        "a fresh process that first took and freed 24 MiB": [],
        "inside a Lightning run of the CPU rows' ResNet-18, after 20 steps": [],
    }
    names = list(found)
    for round_ in range(rounds):
        emit(f"  the convolutions' set-up (round {round_ + 1} of {rounds}) ...")
        found[names[0]].append(conv_setup_in_fresh_process(torch.float32).seconds_per_byte)
        warm = "torch.empty(24 << 20, dtype=torch.uint8).fill_(0)"
        found[names[1]].append(conv_setup_in_fresh_process(torch.float32, prelude=warm).seconds_per_byte)
        probe = Path(out, f"setup_{round_}.json")
        fit_run(
            [
                *_IMAGE,
                "--trainer.max_steps=22",
                "--trainer.callbacks=[{class_path: "
                f"lit_compute.bench.whatif_bench.SetupProbe, init_args: {{path: {probe}}}}}]",
            ],
            out,
        )
        found[names[2]].append(float(json.loads(probe.read_text())[0]))
    return [
        [name, ", ".join(f"{v * 1e9:.2f}" for v in values), f"{sorted(values)[len(values) // 2] * 1e9:.2f}"]
        for name, values in found.items()
    ]


# -- an input-bound run -----------------------------------------------------------------------------------------
def input_part(out: str, repeats: int = 3) -> list[list[Any]]:
    """A linear probe on 224 px images whose loader decodes in the training process (no workers): calibrated on a
    run at micro-batch 8, its loader timed apart at two batch sizes, predicting the runs at micro-batch 4 and 32 on
    this CPU, each measured (``repeats`` rounds interleaved; the run of median step time)."""
    from lit_compute.hardware.this_machine import this_machine
    from lit_compute.planning.whatif import Scenario, calibrate, predict, read_run, with_loader_cost

    chip = this_machine()
    args = [
        *_IMAGE,
        "--data.init_args.num_workers=0",
        "--data.init_args.image_size=224",
        "--model=lit_compute.bench.whatif_bench.LinearProbe",
        MEASURING_CALLBACKS,
    ]
    sizes = (8, 4, 32)
    runs: dict[int, list[Any]] = {size: [] for size in sizes}
    for round_ in range(repeats):
        for size in sizes:
            emit(
                f"  a linear probe decoding 224 px images in the training process, micro-batch {size} "
                f"(round {round_ + 1} of {repeats}) ..."
            )
            runs[size].append(read_run(fit_run([*args, f"--data.init_args.batch_size={size}"], out)))
    base = with_loader_cost(_median_run(runs[8]))
    cal = calibrate(base, chip)
    loader = (
        f"its loader timed apart: {base.loader.per_batch * 1e3:.2f} ms a batch + {base.loader.per_sample * 1e3:.2f} "
        "ms a sample"
        if base.loader is not None
        else "its loader not timed apart"
    )
    rows = []
    waits = 100 * (base.wait_s or 0.0) / (base.step_s or 1.0)
    for size in sizes[1:]:
        measured = _median_run(runs[size])
        step_times = sorted(r.step_s for r in runs[size])
        p = predict(base, Scenario(chip, "32-true", size), cal)
        rows.append(
            [
                f"a linear probe on 224 px images, loader in the process (waits {waits:.0f}"
                f"% of the step at micro-batch 8)",
                f"calibrated on micro-batch 8, {loader}; predicts micro-batch "
                f"{size} on this CPU (measured runs: {', '.join(f'{s * 1e3:.0f}' for s in step_times)} ms)",
                f"{p.step_time_s * 1e3:.1f}",
                f"{measured.step_s * 1e3:.1f}",
                _error(p.step_time_s, measured.step_s),
            ]
        )
    return rows


class LinearProbe(pl.LightningModule):
    """A linear classifier over the pixels: next to no compute, so its loader sets the pace (the input-bound case)."""

    def __init__(self, num_classes: int = 10, image_size: int = 224) -> None:
        super().__init__()
        self.head = torch.nn.Linear(3 * image_size * image_size, num_classes)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.head(x.flatten(1)), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run_part(out: str) -> list[list[Any]]:
    """The path a user takes from a CPU run to a GPU answer: torchvision's ResNet-50 trained a few steps on this CPU in
    a LightningModule of its own (224 px, micro-batch 8, SGD with momentum, batches ready-made in memory: the loader
    costs next to nothing; channels-last by ``lit_compute.speedup.ChannelsLast``, as NVIDIA's mixed-precision runs
    convolved), then ``lit-compute whatif RUN --hardware CHIP --precision P --micro-batch B --json`` for each of
    NVIDIA's published ResNet-50 v1.5 rows on V100 and A100 in published_gpu.csv (a row run channels-first at 16 bits
    is left out: cuDNN's transposes are priced from a channels-first run, and this one has none). Those rows are in
    the fit set: this checks the run-to-answer path (the run's counts, its host's input and dispatch), not the
    defaults."""
    import contextlib
    import io
    import json

    from lit_compute.hardware.chips import find_chip
    from lit_compute.planning.whatif import pays_transposes
    from lit_compute.planning.whatif_cli import main as whatif_main

    args = [
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.max_steps=12",
        "--trainer.max_epochs=null",
        "--trainer.log_every_n_steps=2",
        "--trainer.limit_val_batches=0",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_checkpointing=false",
        "--model=lit_compute.bench.whatif_bench.TorchvisionResNet50",
        "--data=lit_compute.bench.whatif_bench.ReadyImages",
        "--data.init_args.batch_size=8",
        "--trainer.callbacks=[{class_path: lit_compute.FlopsLogger, init_args: {peak: none}}, "
        "{class_path: lit_compute.StepTimeMonitor, init_args: {window: 4}}, {class_path: lit_compute.MemoryMonitor}, "
        "{class_path: lit_compute.speedup.ChannelsLast}]",
    ]
    emit("  torchvision ResNet-50 at 224 px, micro-batch 8, channels-last, 12 steps on this CPU ...")
    run = fit_run(args, out)
    rows = []
    for row in published_rows():
        if row["model"] != "resnet50" or row["chip"] not in ("v100-sxm", "a100"):
            continue
        if row["memory_format"] == "contiguous" and pays_transposes(find_chip(row["chip"]), row["precision"]):
            continue  # a channels-first run at 16 bits: this channels-last run has no transposes to price it with
        argv = [
            str(run),
            "--hardware",
            row["chip"],
            "--precision",
            row["precision"],
            "--micro-batch",
            str(row["batch"]),
            "--json",
        ]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = whatif_main(argv)
        if code:
            raise RuntimeError(f"lit-compute whatif {' '.join(argv)} exited {code}")
        answer = json.loads(printed.getvalue().splitlines()[-1])
        rows.append(
            [
                f"resnet50 on {row['chip']}, {row['precision']}, batch {row['batch']}",
                f"{answer['bottleneck']}; step {answer['step_time_s'] * 1e3:.0f} ms: compute "
                f"{answer['compute_s'] * 1e3:.0f} ms, host {answer['host_s'] * 1e3:.1f} ms input + "
                f"{answer['dispatch_s'] * 1e3:.1f} ms dispatch; {row['source']}",
                f"{answer['samples_per_s']:,.0f}",
                f"{row['samples_per_s']:,.0f}",
                _error(answer["samples_per_s"], row["samples_per_s"]),
            ]
        )
    return rows


class TorchvisionResNet50(pl.LightningModule):
    """A user's own LightningModule around torchvision's ResNet-50 (1,000 classes, SGD with momentum as NVIDIA's
    ResNet-50 v1.5 recipe trains it)."""

    def __init__(self) -> None:
        super().__init__()
        import torchvision

        self.net = torchvision.models.resnet50()

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.875, weight_decay=3.05e-5)


class ReadyImages(pl.LightningDataModule):
    """224 px images made once in memory: every batch is ready-made (the loader costs next to nothing)."""

    def __init__(self, batch_size: int = 8, samples: int = 128) -> None:
        super().__init__()
        self.batch_size, self.samples = batch_size, samples

    def train_dataloader(self) -> Any:
        generator = torch.Generator().manual_seed(0)
        images = torch.randn(self.samples, 3, 224, 224, generator=generator)
        labels = torch.randint(0, 1000, (self.samples,), generator=generator)
        return torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(images, labels),
            batch_size=self.batch_size,
            shuffle=True,
            generator=generator,
        )


_PARTS = ("cpu", "comm", "gpu", "input", "run", "scaling", "setup")


def _parts(text: str) -> list[str]:
    """``--only cpu,comm``: the parts named, in the order they run; an unknown name is an error naming the choices."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in _PARTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: the parts are {', '.join(_PARTS)} (comma-separated)")
    return [name for name in _PARTS if name in names]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lit-compute bench whatif", description=__doc__)
    parser.add_argument("--markdown", default=None, help="also write the tables, with their header, to this file")
    parser.add_argument(
        "--only",
        default=None,
        type=_parts,
        help="run these parts, comma-separated (cpu, comm, gpu, input, run, scaling, setup; default all)",
    )
    parser.add_argument(
        "--errors",
        default=None,
        help="also write the check rows' predictions as JSON to this file (whatif quotes "
        "lit_compute/planning/whatif/published_gpu_errors.json beside a prediction on their chips)",
    )
    parser.add_argument(
        "--fit-defaults",
        action="store_true",
        help="print the default efficiencies fitted on published_gpu.csv's fit set and exit",
    )
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    warnings.simplefilter("ignore")
    if args.fit_defaults:
        emit(f"fitted defaults: {fit_defaults()}")
        return 0
    command = "lit-compute bench whatif" + (f" --only {','.join(args.only)}" if args.only else "")
    if args.errors and args.only and "gpu" not in args.only:
        parser.error(f"--errors {args.errors}: the check rows' errors come from the gpu part; add gpu to --only")
    predictions: list[dict[str, Any]] = []  # the gpu part's, kept for --errors

    def gpu(_: str) -> list[list[Any]]:
        predictions.extend(gpu_predictions())
        return gpu_part(predictions)

    sections = []
    with tempfile.TemporaryDirectory() as out:
        parts: list[tuple[str, str, Callable[[str], list[list[Any]]]]] = [
            ("cpu", "This CPU: calibrated on one run, predicting others (step time, ms)", cpu_part),
            ("comm", "Collectives on two gloo ranks (ms per step)", comm_part),
            ("gpu", "Published GPU training throughputs (samples/s)", gpu),
            ("input", "An input-bound run, its loader in the process, on this CPU (step time, ms)", input_part),
            ("run", "A CPU run priced on NVIDIA's published ResNet-50 v1.5 GPUs (samples/s)", run_part),
            (
                "scaling",
                "Twice the micro-batch on this CPU, outside Lightning: the FLOPs double, the time does not",
                scaling_part,
            ),
            (
                "setup",
                "The convolutions' set-up on this CPU, by where it is measured (ns a float32 weight byte)",
                setup_part,
            ),
        ]
        for name, title, part in parts:
            if args.only and name not in args.only:
                continue
            emit(f"{title} ...")
            rows = part(out)
            if name == "run":
                table = markdown(["workload", "what whatif said", "predicted", "published", "error"], rows)
            elif name == "scaling":
                table = markdown(
                    [
                        "workload",
                        "median step at micro-batch 16 / 32 (ms)",
                        "32 over 16, each round",
                        "median (the FLOPs: 2)",
                    ],
                    rows,
                )
            elif name == "setup":
                table = markdown(["measured in", "each round", "median"], rows)
            elif name == "gpu":
                table = markdown(["set", "workload", "source", "predicted", "published", "error"], rows)
                table += "\n\n" + "\n".join(
                    line
                    for line in (summary(rows), generations_summary(predictions), transposes_summary(predictions))
                    if line
                )
            else:
                table = markdown(["workload", "what", "predicted", "measured", "error"], rows)
            sections.append(f"### {title}\n\n{table}\n")
            emit(table)
    text = "\n".join(sections)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(figure_header(command, machine_line()) + text)
        emit(f"written: {args.markdown}")
    if args.errors:  # after the figure: the file is in the package, whose commit the figure's header names
        write_check_errors(predictions, args.errors, command + f" --errors {args.errors}")
        emit(f"written: {args.errors}")
    return 0
