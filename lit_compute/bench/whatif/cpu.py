"""The ``cpu`` part: calibrated on one measured run of this CPU, predicting other runs measured here."""

from __future__ import annotations

import dataclasses
from typing import Any

from lit_compute.bench._common import emit
from lit_compute.bench.whatif import training
from lit_compute.bench.whatif.training import GPT_ARGS, IMAGE_ARGS, MEASURING_CALLBACKS, error_text, median_run


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
    resnet50 = [
        a.replace("arch=resnet18", "arch=resnet50").replace("batch_size=16", "batch_size=8") for a in IMAGE_ARGS
    ]
    rows = []
    for family, base, deeper in (
        ("ResNet-18 64 px", IMAGE_ARGS, ["--model.init_args.arch=resnet34"]),
        ("GPT 2 layers", GPT_ARGS, ["--model.init_args.n_layer=4"]),
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
                runs[name].append(read_run(training.fit_run([*base, *extra, MEASURING_CALLBACKS], out)))
        base_run = with_loader_cost(median_run(runs["calibration"]))
        calibration = ", ".join(f"{r.step_s * 1e3:.0f}" for r in sorted(runs["calibration"], key=lambda r: r.step_s))
        cal = calibrate(base_run, chip)
        bare_cal = calibrate(base_run, without)  # the same run calibrated with the set-up left in
        for precision in sorted({t[3] for t in targets} - {base_run.precision}):
            with_counts_at(base_run, precision)  # as lit-compute whatif RUN --precision does for a CPU target
        for name, _, micro, precision in targets[1:]:
            measured = median_run(runs[name])
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
                    f"({error_text(bare.step_time_s, measured.step_s)})"
                )
            rows.append(
                [
                    family,
                    what,
                    f"{p.step_time_s * 1e3:.1f}",
                    f"{measured.step_s * 1e3:.1f}",
                    error_text(p.step_time_s, measured.step_s),
                ]
            )
    return rows
