"""The ``run`` part: a CPU run of a user's own ResNet-50 priced with ``lit-compute whatif`` on NVIDIA's published V100
and A100 results, the path a user takes."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from lit_compute.bench._common import emit
from lit_compute.bench.whatif import gpu, training
from lit_compute.bench.whatif.training import error_text


def run_part(out: str) -> list[list[Any]]:
    """The path a user takes from a CPU run to a GPU answer: torchvision's ResNet-50 trained a few steps on this CPU in
    a LightningModule of its own (224 px, micro-batch 8, SGD with momentum, batches ready-made in memory: the loader
    costs next to nothing; channels-last by ``lit_compute.speedup.ChannelsLast``, as NVIDIA's mixed-precision runs
    convolved), then ``lit-compute whatif RUN --hardware CHIP --precision P --micro-batch B --json`` for each of
    NVIDIA's published ResNet-50 v1.5 rows on V100 and A100 in published_gpu.csv (a row run channels-first at 16 bits
    is left out: cuDNN's transposes are priced from a channels-first run, and this one has none); the A100's TF32 row
    is also asked as ``--precision 32-true`` with no ``--tf32``, as a user asks for float32 (torch convolves float32 on
    TF32 tensor cores by default, and the run recorded that it would). Those rows are in
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
        "--model=lit_compute.bench.whatif.run.TorchvisionResNet50",
        "--data=lit_compute.bench.whatif.run.ReadyImages",
        "--data.init_args.batch_size=8",
        "--trainer.callbacks=[{class_path: lit_compute.FlopsLogger, init_args: {peak: none}}, "
        "{class_path: lit_compute.StepTimeMonitor, init_args: {window: 4}}, {class_path: lit_compute.MemoryMonitor}, "
        "{class_path: lit_compute.speedup.ChannelsLast}]",
    ]
    emit("  torchvision ResNet-50 at 224 px, micro-batch 8, channels-last, 12 steps on this CPU ...")
    run = training.fit_run(args, out)
    rows = []
    for row in gpu.published_rows():
        if row["model"] != "resnet50" or row["chip"] not in ("v100-sxm", "a100"):
            continue
        if row["memory_format"] == "contiguous" and pays_transposes(find_chip(row["chip"]), row["precision"]):
            continue  # a channels-first run at 16 bits: this channels-last run has no transposes to price it with
        # a TF32 result is also asked as a user asks for float32, with no flag: torch's TF32 convolutions by default
        for precision in [row["precision"], *(["32-true"] if row["precision"] == "tf32" else [])]:
            argv = [str(run), "--hardware", row["chip"], "--precision", precision, "--micro-batch", str(row["batch"])]
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                code = whatif_main([*argv, "--json"])
            if code:
                raise RuntimeError(f"lit-compute whatif {' '.join(argv)} exited {code}")
            answer = json.loads(printed.getvalue().splitlines()[-1])
            asked = "" if precision == row["precision"] else f" asked as {precision}"
            rows.append(
                [
                    f"resnet50 on {row['chip']}, {row['precision']}{asked}, batch {row['batch']}",
                    f"{answer['bottleneck']}; step {answer['step_time_s'] * 1e3:.0f} ms: compute "
                    f"{answer['compute_s'] * 1e3:.0f} ms, host {answer['host_s'] * 1e3:.1f} ms input + "
                    f"{answer['dispatch_s'] * 1e3:.1f} ms dispatch; {row['source']}",
                    f"{answer['samples_per_s']:,.0f}",
                    f"{row['samples_per_s']:,.0f}",
                    error_text(answer["samples_per_s"], row["samples_per_s"]),
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
