"""The ``input`` part: an input-bound run (its loader decoding in the training process) calibrated at one
micro-batch, predicting two others on this CPU."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from lit_compute.bench._common import emit
from lit_compute.bench.whatif import training
from lit_compute.bench.whatif.training import IMAGE_ARGS, MEASURING_CALLBACKS, error_text, median_run


def input_part(out: str, repeats: int = 3) -> list[list[Any]]:
    """A linear probe on 224 px images whose loader decodes in the training process (no workers): calibrated on a
    run at micro-batch 8, its loader timed apart at two batch sizes, predicting the runs at micro-batch 4 and 32 on
    this CPU, each measured (``repeats`` rounds interleaved; the run of median step time)."""
    from lit_compute.hardware.this_machine import this_machine
    from lit_compute.planning.whatif import Scenario, calibrate, predict, read_run, with_loader_cost

    chip = this_machine()
    args = [
        *IMAGE_ARGS,
        "--data.init_args.num_workers=0",
        "--data.init_args.image_size=224",
        "--model=lit_compute.bench.whatif.input_bound.LinearProbe",
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
            runs[size].append(read_run(training.fit_run([*args, f"--data.init_args.batch_size={size}"], out)))
    base = with_loader_cost(median_run(runs[8]))
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
        measured = median_run(runs[size])
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
                error_text(p.step_time_s, measured.step_s),
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
