"""``lit-compute bench gpu``: every check a CPU-only machine cannot run, in one command, one table.

On a machine without an NVIDIA GPU it says so and exits 0 without running anything. Otherwise it runs, in a
few minutes: the recipe on ResNet-50 at 224 px with GPU DALI decode; MFU of ResNet-50 and ViT-B/16 training
in bf16 against the table peak and a measured one; the GPU DALI vs torchvision loader ratio;
FP32BatchNormPrecision in 16-mixed with its GradScaler; a profiler window's gpu_idle_fraction; and a
single-process NCCL TunedDDPStrategy start-up with its settings applied; a GPT under FSDPStrategy with
FP32BatchNormFSDPPrecision (MFU, HFU, tokens/s, float32 LayerNorms); ``lit-compute whatif``'s predictions for this
GPU, from steps counted on fake tensors and from a CPU run of the baseline config against a run of it here (run
folders, as a user prices one); the cost ``whatif`` gives cuDNN's transposes of channels-first convolutions against
ResNet-50 trained both ways here. Exits non-zero if any check fails. ``--only 'fit rows'`` measures rows for
whatif's fit set instead (:func:`check_fit_rows`).
Without NVIDIA DALI the two DALI checks fail and say so (the recipe still prints its other rows).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lit_compute.bench._common import emit, figure_header, machine_line, markdown
from lit_compute.bench.whatif.on_gpu import (
    SECTIONS,
    check_fit_rows,
    check_transposes,
    check_whatif,
    check_whatif_runs,
)
from lit_compute.data.dali_datamodule import dali_available
from lit_compute.files import write_whole


def _fit(tmp: str, name: str, model: Any, data: Any, steps: int, **kwargs: Any) -> Any:
    import lightning.pytorch as pl

    logger = pl.loggers.TensorBoardLogger(tmp, name=name, version=0)
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=1,
        max_steps=steps,
        limit_val_batches=0,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=5,
        **kwargs,
    )
    trainer.fit(model, datamodule=data)
    return trainer, logger.log_dir


def _scalars(log_dir: str, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def check_mfu(tmp: str) -> str:
    from lit_compute import FlopsLogger, FP32BatchNormPrecision, ImageClassifier, TorchvisionImageDataModule

    parts = []
    for arch in ("resnet50", "vit_b_16"):
        for peak in ("table", "measure"):
            data = TorchvisionImageDataModule(batch_size=128, image_size=224, synthetic_images_per_class=128)
            _, log_dir = _fit(
                tmp,
                f"mfu_{arch}_{peak}",
                ImageClassifier(arch, num_classes=10, channels_last=arch == "resnet50"),
                data,
                30,
                callbacks=[FlopsLogger(peak=peak, log_every_n_steps=5)],
                plugins=[FP32BatchNormPrecision("bf16-mixed")],
            )
            mfu, pk = _scalars(log_dir, "compute/mfu"), _scalars(log_dir, "compute/peak_tflops")
            if not mfu:
                raise RuntimeError(f"{arch} peak={peak}: no compute/mfu logged")
            parts.append(f"{arch} {peak}: MFU {100 * mfu[-1]:.1f}% of {pk[-1]:.0f} TFLOP/s")
    return "; ".join(parts)


NO_DALI = "NVIDIA DALI is not installed (pip install 'lit-compute[dali]')"


def check_recipe(tmp: str) -> str:
    from lit_compute.bench import recipe

    argv = [
        "--image-size",
        "224",
        "--batch-size",
        "128",
        "--steps",
        "30",
        "--images-per-class",
        "128",
        "--log-dir",
        str(Path(tmp) / "recipe"),
    ]
    if not dali_available():  # the rows that need no DALI still run and print their table
        recipe.main([*argv, "--no-dali"])
        raise RuntimeError(f"{NO_DALI}: the recipe ran with --no-dali (table above), its GPU DALI row did not")
    recipe.main(argv)
    return "table above"


def check_loaders(tmp: str) -> str:
    from lit_compute.bench import loaders

    if not dali_available():
        raise RuntimeError(f"{NO_DALI}: nothing to compare")
    loaders.main(["--image-size", "224", "--batch-size", "128", "--images-per-class", "128", "--rounds", "2"])
    return "table above"


def check_fp16(tmp: str) -> str:
    from lit_compute import (
        FP32BatchNormPrecision,
        ImageClassifier,
        LossScaleMonitor,
        TorchvisionImageDataModule,
    )
    from lit_compute._compat import BatchNormBase

    plugin = FP32BatchNormPrecision("16-mixed")
    model = ImageClassifier("resnet50", num_classes=10)
    data = TorchvisionImageDataModule(batch_size=64, image_size=128, synthetic_images_per_class=64)
    _, log_dir = _fit(tmp, "fp16", model, data, 20, plugins=[plugin], callbacks=[LossScaleMonitor(log_every_n_steps=5)])
    norms = [m for m in model.modules() if isinstance(m, BatchNormBase)]
    if any(
        m.weight.dtype != torch.float32 or (m.running_var is not None and m.running_var.dtype != torch.float32)
        for m in norms
    ):
        raise RuntimeError("a BatchNorm is not float32")
    scale = _scalars(log_dir, "amp/loss_scale")
    if plugin.scaler is None or not scale:
        raise RuntimeError("no GradScaler / no amp/loss_scale")
    return f"{len(norms)} BatchNorms float32, loss scale {scale[-1]:.0f}"


def check_profiler(tmp: str) -> str:
    from lit_compute import ImageClassifier, ProfilerWindow, TorchvisionImageDataModule

    data = TorchvisionImageDataModule(batch_size=64, image_size=128, synthetic_images_per_class=64)
    _, log_dir = _fit(
        tmp,
        "profiler",
        ImageClassifier("resnet50", num_classes=10),
        data,
        12,
        callbacks=[ProfilerWindow(start_step=5, warmup=2, active=3)],
    )
    idle = _scalars(log_dir, "profiler/gpu_idle_fraction")
    if not idle or not 0.0 <= idle[-1] <= 1.0:
        raise RuntimeError(f"profiler/gpu_idle_fraction missing or out of range: {idle}")
    return f"gpu_idle_fraction {idle[-1]:.3f}"


def check_nccl(tmp: str) -> str:
    import lightning.pytorch as pl
    import torch.distributed as dist

    from lit_compute import ImageClassifier, NCCLSettings, TorchvisionImageDataModule, TunedDDPStrategy

    class Seen(pl.Callback):
        """What the process looked like once training started (the group is destroyed at teardown)."""

        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.backend = dist.get_backend() if dist.is_initialized() else "none"
            self.env = {k: os.environ.get(k) for k in ("NCCL_ALGO", "NCCL_PROTO")}

    nccl_log = Path(tmp) / "nccl.log"
    strategy = TunedDDPStrategy(
        nccl=NCCLSettings(
            algo="Ring", proto="Simple", debug="INFO", debug_subsys="INIT,ENV", extra={"NCCL_DEBUG_FILE": str(nccl_log)}
        ),
        process_group_backend="nccl",
        bucket_cap_mb=50,
        comm_hook="bf16",
    )
    seen = Seen()
    data = TorchvisionImageDataModule(batch_size=32, image_size=64, synthetic_images_per_class=32)
    _fit(tmp, "nccl", ImageClassifier("resnet18", num_classes=10), data, 5, strategy=strategy, callbacks=[seen])
    if seen.backend != "nccl":
        raise RuntimeError(f"process group backend {seen.backend!r}, expected 'nccl'")
    if seen.env != {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}:
        raise RuntimeError(f"NCCL settings not in the environment during training: {seen.env}")
    config = strategy.effective_config("nccl")
    # NCCL reads its variables when its first communicator starts; its own log says what it saw
    logged = nccl_log.read_text(errors="replace") if nccl_log.exists() else ""
    confirmed = [
        line.split("NCCL INFO", 1)[-1].strip()
        for line in logged.splitlines()
        if "NCCL_ALGO" in line or "NCCL_PROTO" in line
    ]
    return (
        f"backend {seen.backend}, NCCL {config['nccl_version']}, NCCL_ALGO=Ring NCCL_PROTO=Simple set before "
        f"init, bucket {config['bucket_cap_mb']:.0f} MiB, bf16 hook; NCCL's log: "
        f"{'; '.join(confirmed[:2]) if confirmed else 'no line naming NCCL_ALGO/NCCL_PROTO'}"
    )


def check_fsdp(tmp: str) -> str:
    """A GPT under Lightning's FSDPStrategy with FP32BatchNormFSDPPrecision: MFU/HFU and tokens/s logged, LayerNorm
    weights float32 inside the forward while the matmuls run in bf16."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import FSDPStrategy

    from lit_compute import FlopsLogger, FP32BatchNormFSDPPrecision, StepTimeMonitor
    from lit_compute.data import TokenDataModule
    from lit_compute.models import GPT, GPTBlock

    seen: dict[str, Any] = {}

    def see_ln(module: Any, args: Any, output: Any) -> None:  # a forward hook returning None keeps the output
        seen.setdefault("ln", str(module.weight.dtype))

    def see_qkv(module: Any, args: Any, output: Any) -> None:
        seen.setdefault("qkv", str(output.dtype))

    class Look(pl.Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if "hook" not in seen:
                seen["hook"] = pl_module.blocks[0].ln_1.register_forward_hook(see_ln)
                pl_module.blocks[0].qkv.register_forward_hook(see_qkv)

    model = GPT(block_size=1024, n_layer=12, n_head=12, n_embd=768)
    data = TokenDataModule(mode="packed", batch_size=8, seq_len=1024, max_tokens=1_000_000)
    _, log_dir = _fit(
        tmp,
        "fsdp_gpt",
        model,
        data,
        30,
        strategy=FSDPStrategy(auto_wrap_policy={GPTBlock}),
        plugins=[FP32BatchNormFSDPPrecision("bf16-mixed", fp32_norms=["LayerNorm"])],
        callbacks=[Look(), FlopsLogger(peak="table", log_every_n_steps=5), StepTimeMonitor(log_every_n_steps=5)],
    )
    mfu, hfu, tokens = (_scalars(log_dir, t) for t in ("compute/mfu", "compute/hfu", "time/tokens_per_sec"))
    if not (mfu and hfu and tokens):
        raise RuntimeError(f"FSDP run logged mfu={mfu[-1:]}, hfu={hfu[-1:]}, tokens/s={tokens[-1:]}")
    if seen.get("ln") != "torch.float32" or seen.get("qkv") != "torch.bfloat16":
        raise RuntimeError(f"LayerNorm weight {seen.get('ln')}, qkv output {seen.get('qkv')} (want float32, bfloat16)")
    return (
        f"GPT 124M-class, FSDP 1 GPU, bf16 with float32 LayerNorms: MFU {100 * mfu[-1]:.1f}%, HFU "
        f"{100 * hfu[-1]:.1f}%, {tokens[-1]:,.0f} tokens/s"
    )


CHECKS: list[tuple[str, Callable[[str], str]]] = [
    ("whatif predicted vs measured on this GPU", check_whatif),
    ("whatif from a CPU run vs a run on this GPU (run folders)", check_whatif_runs),
    ("MFU ResNet-50 / ViT-B/16 bf16 (table, measure)", check_mfu),
    ("FSDPStrategy GPT + FP32BatchNormFSDPPrecision", check_fsdp),
    ("FP32BatchNormPrecision 16-mixed + GradScaler", check_fp16),
    ("ProfilerWindow gpu_idle_fraction", check_profiler),
    ("TunedDDPStrategy single-process NCCL", check_nccl),
    ("recipe, ResNet-50 @224, GPU DALI", check_recipe),
    ("DALI GPU vs torchvision loader", check_loaders),
    ("whatif's transposes: channels-first vs channels-last", check_transposes),  # last: within BENCH_TIMEOUT's end
]
#: measurements run only when --only names them (scripts/gpu_checks.sh runs them last, under their own timeout)
ON_REQUEST: list[tuple[str, Callable[[str], str]]] = [("fit rows of published_gpu.csv measured here", check_fit_rows)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lit-compute bench gpu", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--only",
        nargs="*",
        help="run only the checks whose names contain these words (the fit "
        "rows' measurement runs only when named: --only 'fit rows')",
    )
    parser.add_argument(
        "--markdown",
        default=None,
        help="also write the checks' table, with the figure header, to this file (rewritten after "
        "each check: a run stopped part-way leaves the checks it finished)",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        emit("lit-compute bench gpu: no NVIDIA GPU on this machine (torch.cuda.is_available() is False); nothing run.")
        return 0
    emit(f"# bench gpu: {torch.cuda.get_device_name(0)}, {time.strftime('%Y-%m-%d')}\n# {machine_line()}\n")
    rows, failed = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, check in CHECKS + (ON_REQUEST if args.only else []):
            if args.only and not any(w.lower() in name.lower() for w in args.only):
                continue
            start = time.perf_counter()
            try:
                result, ok = check(tmp), "pass"
            except (Exception, SystemExit) as err:  # noqa: BLE001 - one failing check must not hide the others
                result, ok = f"{type(err).__name__}: {err}", "FAIL"
                failed += 1
                emit(traceback.format_exc())
            rows.append([name, ok, result, f"{time.perf_counter() - start:.0f}s"])
            emit(f"{name}: {ok} ({rows[-1][-1]}): {result}")
            if args.markdown:
                write_whole(
                    args.markdown,
                    figure_header("lit-compute bench gpu", machine_line())
                    + markdown(["check", "status", "result", "time"], rows)
                    + "\n"
                    + "".join(SECTIONS),
                )
    emit(markdown(["check", "status", "result", "time"], rows))
    return 1 if failed else 0
