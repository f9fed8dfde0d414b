"""What ``lit-compute bench gpu`` checks of ``whatif`` on a GPU: its predictions against Lightning runs measured
there, cuDNN's transposes both ways, a CPU run's folder priced on the GPU against a run there, and the fit rows
measured for the next fit."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import lightning.pytorch as pl
import torch

from lit_compute.bench._common import emit, markdown
from lit_compute.bench.whatif import training, zoo
from lit_compute.files import write_whole
from lit_compute.formatting import typed_line
from lit_compute.speedup.channels_last import ChannelsLast

#: tables a check adds below the checks' table in --markdown's file
SECTIONS: list[str] = []

#: the whatif check fails when any prediction misses the measured rate by more than this (percent)
WHATIF_GOAL = 30.0

#: what the whatif check trains here: (model as bench.whatif.zoo builds it, micro-batch, precision)
WHATIF_RUNS = [
    ("resnet50", 256, "bf16-mixed"),
    ("resnet50", 256, "tf32"),
    ("gpt", 16, "bf16-mixed"),
    ("gpt", 16, "tf32"),
]

WHATIF_NAMES = {
    "resnet50": "torchvision ResNet-50 (224 px, SGD)",
    "gpt": "lit_compute GPT (12 layers, 768 wide, 1,024 tokens, AdamW)",
}


class _StepOnDevice(pl.LightningModule):
    """A model trained on inputs made on the device inside the step: no loader in the measurement, the rate is the
    step's own (what the prediction prices when the run's loader kept up)."""

    def __init__(self, net: Any, step: Callable[[Any, int], Any], batch: int, model: str) -> None:
        super().__init__()
        self.net, self.step_fn, self.batch, self.model = net, step, batch, model

    def training_step(self, index: Any, batch_idx: int) -> Any:
        with torch.device(self.device):
            return self.step_fn(self.net, self.batch)

    def configure_optimizers(self) -> Any:

        return zoo.zoo_optimizer(self.model, self.net)  # the one the prediction's traced step counted


class _RateClock(pl.Callback):
    """Samples per second over the steps after ``warmup`` (the device synchronized at both ends)."""

    def __init__(self, warmup: int, batch: int) -> None:
        self.warmup, self.batch, self.start, self.rate = warmup, batch, 0.0, 0.0

    def _now(self) -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx + 1 == self.warmup:
            self.start = self._now()
        elif batch_idx + 1 == trainer.max_steps:
            self.rate = self.batch * (batch_idx + 1 - self.warmup) / (self._now() - self.start)


def measure_rate(
    model: str,
    batch: int,
    precision: str,
    steps: int = 40,
    warmup: int = 10,
    accelerator: str = "gpu",
    layout: str | None = None,
) -> float:
    """Samples/s of ``model`` (as ``lit-compute bench whatif`` traces it) trained by Lightning at ``batch`` and
    ``precision`` ("tf32": float32 with TF32 matmuls and convolutions), cuDNN autotuned, the convolutional nets
    channels-last (``layout`` "contiguous" or "channels_last" to choose), each with the optimizer its source trains
    with."""
    from torch.utils.data import DataLoader

    net, step = zoo.zoo_model(model)
    if (layout or memory_format(model)) == "channels_last":
        net = ChannelsLast().convert_module(net)
    clock = _RateClock(warmup, batch)
    tf32 = precision == "tf32"
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        trainer = pl.Trainer(
            accelerator=accelerator,
            devices=1,
            max_steps=steps,
            logger=False,
            benchmark=True,
            precision="32-true" if tf32 else precision,  # type: ignore[arg-type]
            callbacks=[clock],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(_StepOnDevice(net, step, batch, model), DataLoader(cast(Any, range(steps))))
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    return clock.rate


def memory_format(model: str) -> str:
    """How :func:`measure_rate` lays out ``model``: the convolutional nets channels-last, as NVIDIA's
    DeepLearningExamples ran them in mixed precision (published_gpu.csv's memory_format column)."""
    return "channels_last" if model in ("resnet50", "resnext101-32x4d", "efficientnet-b0") else ""


def check_whatif(tmp: str) -> str:
    """``lit-compute whatif``'s prediction for this GPU from the step counted on fake tensors (no GPU involved; the
    default efficiencies, which were fitted on published V100 and A100 results, not on this chip) against the samples/s
    that a Lightning run measures here at the same micro-batch and precision."""
    from lit_compute.hardware.chips import find_chip
    from lit_compute.hardware.this_machine import host_dispatch_seconds
    from lit_compute.planning.whatif import Scenario, default_calibration, predict

    chip = find_chip(torch.cuda.get_device_name(0))
    dispatch = host_dispatch_seconds()  # this machine's CPU is the host, as whatif prices a user's run by default
    rows, errors = [], []
    for model, batch, precision in WHATIF_RUNS:
        facts = zoo.traced_facts(model, batch, memory_format(model) or "contiguous")
        predicted = predict(
            facts, Scenario(chip, precision, batch, host_dispatch_s=dispatch), default_calibration()
        ).samples_per_s
        measured = measure_rate(model, batch, precision)
        errors.append(100 * (predicted / measured - 1))
        rows.append(
            [
                f"{WHATIF_NAMES[model]} on {chip.name}, {precision}, batch {batch}",
                f"{predicted:,.0f}",
                f"{measured:,.0f}",
                f"{errors[-1]:+.1f}%",
            ]
        )
        emit(f"  {rows[-1]}")
    table = markdown(["workload", "predicted samples/s", "measured samples/s", "error"], rows)
    emit(table)
    SECTIONS.append(
        f"\n### lit-compute whatif on {chip.name}: predicted from the step counted on fake tensors, at "
        f"the default efficiencies, vs measured here\n\n{table}\n"
    )
    within = sum(abs(e) <= WHATIF_GOAL for e in errors)
    result = f"table above: {within} of {len(errors)} within {WHATIF_GOAL:.0f}%, worst {max(errors, key=abs):+.1f}%"
    if within < len(errors):  # a miss is a failed check, never a pass with a number in it
        raise AssertionError(f"{result}: a prediction missed by more than {WHATIF_GOAL:.0f}%")
    return result


#: the transposes' check: (model, micro-batch, precision) trained channels-first and channels-last; the predicted
#: ratio of the two rates must come within TRANSPOSES_GOAL percent of the measured one
TRANSPOSES_RUN = ("resnet50", 128, "bf16-mixed")

TRANSPOSES_GOAL = 15.0


def check_transposes(tmp: str) -> str:
    """What ``whatif`` says cuDNN's transposes cost (a channels-first convolution at 16 bits is transposed in and out
    for the tensor cores) against what they cost here: ResNet-50 trained channels-first and channels-last on this
    GPU, the measured ratio of the two rates beside the ratio ``whatif`` predicts from the two steps counted on fake
    tensors (the published rows check it on other chips: Lambda's channels-first runs against NVIDIA's
    channels-last ones)."""
    from lit_compute.hardware.chips import find_chip
    from lit_compute.hardware.this_machine import host_dispatch_seconds
    from lit_compute.planning.whatif import Scenario, default_calibration, predict

    model, batch, precision = TRANSPOSES_RUN
    chip = find_chip(torch.cuda.get_device_name(0))
    scenario = Scenario(chip, precision, batch, host_dispatch_s=host_dispatch_seconds())
    predicted = {
        layout: predict(zoo.traced_facts(model, batch, layout), scenario, default_calibration()).samples_per_s
        for layout in ("contiguous", "channels_last")
    }
    measured = {layout: measure_rate(model, batch, precision, layout=layout) for layout in predicted}
    ratio_p, ratio_m = (d["channels_last"] / d["contiguous"] for d in (predicted, measured))
    error = 100 * (ratio_p / ratio_m - 1)
    rows = [
        [
            f"{WHATIF_NAMES[model]} on {chip.name}, {precision}, batch {batch}, {layout}",
            f"{predicted[layout]:,.0f}",
            f"{measured[layout]:,.0f}",
        ]
        for layout in predicted
    ]
    rows.append(["channels-last over channels-first", f"{ratio_p:.2f}x", f"{ratio_m:.2f}x"])
    table = markdown(["workload", "predicted samples/s", "measured samples/s"], rows)
    emit(table)
    SECTIONS.append(
        f"\n### cuDNN's transposes on {chip.name}: channels-first against channels-last, predicted and "
        f"measured\n\n{table}\n"
    )
    result = f"channels-last over channels-first: predicted {ratio_p:.2f}x, measured {ratio_m:.2f}x ({error:+.1f}%)"
    if abs(error) > TRANSPOSES_GOAL:  # a miss is a failed check, never a pass with a number in it
        raise AssertionError(f"{result}: the predicted ratio missed by more than {TRANSPOSES_GOAL:.0f}%")
    return result


def _whatif_json(args: list[str]) -> dict[str, Any]:
    """``lit-compute whatif ARGS --json``'s one row, as a user's command prints it."""
    import contextlib
    import io
    import json

    from lit_compute.planning.whatif_cli import main as whatif

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = whatif([*args, "--json"])
    if code:
        raise RuntimeError(f"lit-compute whatif {' '.join(args)} exited {code}: {err.getvalue().strip()[-400:]}")
    rows = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    if len(rows) != 1:
        raise RuntimeError(f"lit-compute whatif {' '.join(args)} printed {len(rows)} rows, not one")
    return rows[0]


def check_whatif_runs(
    tmp: str,
    accelerator: str = "gpu",
    micro_batch: int = 64,
    cpu_batch: int = 4,
    steps: tuple[int, int] = (40, 10),
    arch: str = "resnet50",
    image_size: int = 112,
) -> str:
    """#50 item 4 the way a user takes it: configs/baseline.yaml (a torchvision ResNet-50 at 112 px, its loader in the
    process) trained with ``lit-compute fit`` on this GPU in bf16-mixed at ``micro_batch``, and on this machine's
    CPU in float32 at ``cpu_batch``, each with FlopsLogger and StepTimeMonitor. ``lit-compute whatif CPU_RUN
    --hardware <this chip> --precision bf16-mixed --micro-batch <micro_batch>`` is checked against the GPU run's
    measured step (a miss beyond :data:`WHATIF_GOAL` fails); ``whatif GPU_RUN`` on its own chip (calibrated on it)
    and on an H100 SXM are printed beside it."""
    from lit_compute.planning.whatif import read_run

    base = [
        "--config",
        "configs/baseline.yaml",
        *training.SHORT_RUN,
        f"--model.init_args.arch={arch}",
        f"--data.init_args.image_size={image_size}",
        training.MEASURING_CALLBACKS,
    ]
    device_run = training.fit_run(
        [
            *base,
            f"--trainer.accelerator={accelerator}",
            "--trainer.precision=bf16-mixed",
            f"--data.init_args.batch_size={micro_batch}",
            f"--trainer.max_steps={steps[0]}",
        ],
        str(Path(tmp, "whatif_device")),
    )
    cpu_run = training.fit_run(
        [
            *base,
            "--trainer.accelerator=cpu",
            "--trainer.precision=32-true",
            f"--data.init_args.batch_size={cpu_batch}",
            f"--trainer.max_steps={steps[1]}",
        ],
        str(Path(tmp, "whatif_cpu")),
    )
    measured = read_run(device_run).step_s
    if not measured:
        raise RuntimeError(f"{device_run}: no measured step (time/step_ms)")
    own = _whatif_json([str(device_run)])
    chip = own["hardware"]
    predicted = _whatif_json(
        [str(cpu_run), "--hardware", chip, "--precision", "bf16-mixed", "--micro-batch", str(micro_batch)]
    )
    h100 = _whatif_json([str(device_run), "--hardware", "h100-sxm"])
    error = 100 * (predicted["step_time_s"] / measured - 1)
    result = (
        f"{arch} {image_size} px, loader in the process: the CPU run (micro-batch {cpu_batch}, 32-true) priced "
        f"on {chip} at bf16-mixed, micro-batch {micro_batch}: {predicted['step_time_s'] * 1e3:.1f} ms a step "
        f"({predicted['bottleneck']}-bound) against the {chip} run's measured {measured * 1e3:.1f} ms, "
        f"{error:+.1f}%; the {chip} run on its own chip {own['step_time_s'] * 1e3:.1f} ms (calibrated), on "
        f"h100-sxm {h100['step_time_s'] * 1e3:.1f} ms"
    )
    emit(f"  {result}")
    if abs(error) > WHATIF_GOAL:
        raise AssertionError(f"{result}: the CPU run's prediction missed by more than {WHATIF_GOAL:.0f}%")
    return result


#: rows for the fit set of published_gpu.csv, measured on the lent GPU: the fit set's own models other than ResNet-50
#: (whose rows on this chip are check rows, as are the GPT's), at the batch sizes their A100 rows ran at. Chosen before
#: any was measured, so that a chip generation the published fit rows lack (Hopper) has fit rows of its own; never
#: compared with as validation. (model as bench.whatif.zoo builds it, micro-batch, precision)
FIT_RUNS = [
    ("resnext101-32x4d", 128, "bf16-mixed"),
    ("resnext101-32x4d", 128, "tf32"),
    ("efficientnet-b0", 256, "bf16-mixed"),
    ("efficientnet-b0", 256, "tf32"),
    ("bert-large", 256, "bf16-mixed"),
    ("bert-large", 128, "tf32"),
]

#: where check_fit_rows writes its rows (published_gpu.csv's columns); scripts/gpu_checks.sh sets it under $OUT
FIT_ROWS_ENV = "LIT_COMPUTE_FIT_ROWS"


def fit_rows(rates: list[tuple[str, int, str, float]], chip: str, source: str) -> str:
    """published_gpu.csv's lines (set "fit") for measured ``(model, batch, precision, samples/s)``."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for model, batch, precision, rate in rates:
        writer.writerow(["fit", model, chip, precision, memory_format(model), batch, f"{rate:.0f}", source])
    return out.getvalue()


def check_fit_rows(tmp: str) -> str:
    """Measures :data:`FIT_RUNS` here as a Lightning run does (the same code as the whatif check's rates) and writes
    them as fit rows of published_gpu.csv to ``$LIT_COMPUTE_FIT_ROWS`` (default ``fit_rows.csv`` here): the next
    ``lit-compute bench whatif --fit-defaults`` can then fit on this chip's generation too. Nothing here is a
    prediction checked: the figures are data. A workload that fails (out of memory) is named and the others kept."""
    from lit_compute.figures import commit_description
    from lit_compute.hardware.chips import find_chip

    name = torch.cuda.get_device_name(0)
    chip = find_chip(name).name
    source = (
        f"this project: lit-compute bench gpu --only fit (commit {commit_description()}, "
        f"{time.strftime('%Y-%m-%d')}), 1x {name}, eager, torch {torch.__version__.split('+')[0]}"
    )
    rates, failed = [], []
    for model, batch, precision in FIT_RUNS:
        try:
            rates.append((model, batch, precision, measure_rate(model, batch, precision)))
        except Exception as err:  # noqa: BLE001 - one workload's failure (memory) keeps the others' rows
            failed.append(f"{model} {precision} batch {batch}: {typed_line(err)[:200]}")
            emit(f"  fit row failed: {failed[-1]}")
            torch.cuda.empty_cache()
            continue
        emit(f"  fit row: {model} on {chip}, {precision}, batch {batch}: {rates[-1][-1]:,.0f} samples/s")
    lines = fit_rows(rates, chip, source)
    path = Path(os.environ.get(FIT_ROWS_ENV) or "fit_rows.csv")
    write_whole(path, lines)
    SECTIONS.append(
        f"\n### Fit rows measured on {chip} (published_gpu.csv's columns; data to fit on, not a check)"
        f"\n\n```\n{lines}```\n"
    )
    result = f"{len(rates)} of {len(FIT_RUNS)} fit rows written to {path}"
    if failed:
        raise RuntimeError(f"{result}; failed: {'; '.join(failed)}")
    return result
