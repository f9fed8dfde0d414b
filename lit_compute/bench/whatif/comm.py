"""The ``comm`` part: the collectives' time per step on two gloo ranks, predicted and measured in both ranks' traces."""

from __future__ import annotations

from typing import Any

from lit_compute.bench._common import emit
from lit_compute.bench.whatif import training
from lit_compute.bench.whatif.training import GPT_ARGS, IMAGE_ARGS, MEASURING_CALLBACKS, error_text


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
        (
            "DDP, 2 gloo ranks",
            [*IMAGE_ARGS, "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.accelerator=cpu"],
        ),
        (
            "FSDP2, 2 gloo ranks",
            [
                "--config",
                "configs/gpt_model_parallel.yaml",
                *GPT_ARGS[2:],
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
            folder = training.fit_run([*args, callbacks], out)
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
                error_text(predicted, transfer),
            ]
        )
    return rows
