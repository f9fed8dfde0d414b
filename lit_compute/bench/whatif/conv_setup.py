"""The ``setup`` part: the convolutions' set-up on this CPU measured in a fresh process, after a warmed allocator
and inside a Lightning run, measured only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lit_compute.bench._common import emit
from lit_compute.bench.whatif import training
from lit_compute.bench.whatif.training import IMAGE_ARGS


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
        training.fit_run(
            [
                *IMAGE_ARGS,
                "--trainer.max_steps=22",
                "--trainer.callbacks=[{class_path: "
                f"lit_compute.bench.whatif.conv_setup.SetupProbe, init_args: {{path: {probe}}}}}]",
            ],
            out,
        )
        found[names[2]].append(float(json.loads(probe.read_text())[0]))
    return [
        [name, ", ".join(f"{v * 1e9:.2f}" for v in values), f"{sorted(values)[len(values) // 2] * 1e9:.2f}"]
        for name, values in found.items()
    ]
