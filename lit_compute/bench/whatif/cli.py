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
  the check rows as JSON, which ``whatif`` quotes beside a prediction on their chips; ``--sealed`` adds the sealed
  set (committed before the per-kernel pricing, priced once after it);
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
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lit_compute.bench._common import emit, figure_header, machine_line, markdown
from lit_compute.bench.whatif import comm, conv_setup, cpu, fit, gpu, input_bound, run, scaling
from lit_compute.bench.whatif.training import ROOT

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
        "--repeats",
        type=int,
        default=5,
        help="the cpu part's runs of each configuration (rounds, interleaved; each figure is the run of median step "
        "time): fewer is faster and noisier, and the header says how many",
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
    parser.add_argument(
        "--sealed",
        action="store_true",
        help="the gpu part also prices published_gpu.csv's sealed set (its header says when: once, after the "
        "per-kernel pricing, the result published as it comes)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give 1 or more runs of each configuration (default 5)")
    if args.sealed and args.only and "gpu" not in args.only:
        parser.error("--sealed: the sealed set is priced by the gpu part; add gpu to --only")
    if args.errors and args.only and "gpu" not in args.only:
        parser.error(f"--errors {args.errors}: the check rows' errors come from the gpu part; add gpu to --only")
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    warnings.simplefilter("ignore")
    if args.fit_defaults:
        facts = fit.traced_fit_facts()
        fitted = fit.fit_defaults(facts)
        emit(f"fitted defaults: {fitted}")
        if bound := fit.on_bounds(fitted):
            emit(f"on a bound of their search range (the fit wanted to go further): {', '.join(sorted(bound))}")
        fit.write_fit_facts(facts)
        emit(f"written: {fit.FACTS_FILE} (the fit rows' traced steps, which a test fits the defaults against)")
        return 0
    command = (
        "lit-compute bench whatif"
        + (f" --only {','.join(args.only)}" if args.only else "")
        + (" --sealed" if args.sealed else "")
        + (f" --repeats {args.repeats}" if args.repeats != 5 else "")
    )
    predictions: list[dict[str, Any]] = []  # the gpu part's, kept for --errors

    def gpu_rows(_: str) -> list[list[Any]]:
        predictions.extend(gpu.gpu_predictions((*gpu.SETS, "sealed") if args.sealed else gpu.SETS))
        return gpu.gpu_part(predictions)

    sections = []
    with tempfile.TemporaryDirectory() as out:
        parts: list[tuple[str, str, Callable[[str], list[list[Any]]]]] = [
            (
                "cpu",
                "This CPU: calibrated on one run, predicting others (step time, ms)",
                lambda out: cpu.cpu_part(out, args.repeats),
            ),
            ("comm", "Collectives on two gloo ranks (ms per step)", comm.comm_part),
            ("gpu", "Published GPU training throughputs (samples/s)", gpu_rows),
            (
                "input",
                "An input-bound run, its loader in the process, on this CPU (step time, ms)",
                input_bound.input_part,
            ),
            ("run", "A CPU run priced on NVIDIA's published ResNet-50 v1.5 GPUs (samples/s)", run.run_part),
            (
                "scaling",
                "Twice the micro-batch on this CPU, outside Lightning: the FLOPs double, the time does not",
                scaling.scaling_part,
            ),
            (
                "setup",
                "The convolutions' set-up on this CPU, by where it is measured (ns a float32 weight byte)",
                conv_setup.setup_part,
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
                    for line in (
                        gpu.summary(rows),
                        gpu.generations_summary(predictions),
                        gpu.transposes_summary(predictions),
                    )
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
        gpu.write_check_errors(predictions, args.errors, command + f" --errors {args.errors}")
        emit(f"written: {args.errors}")
    return 0
