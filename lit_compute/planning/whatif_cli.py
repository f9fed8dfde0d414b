"""``lit-compute whatif RUN | --config C [--hardware h100-sxm,a100,this] [--precision bf16-mixed] [--micro-batch 256]
[--nodes 1,8,64] [--devices-per-node 8] [--network 25gbps,100gbps] [--prices FILE] [--hardware-file FILE]
[--calibration RUN] [--host-dispatch-us US] [--json]``: the run's step on other hardware, node counts and networks
(lit_compute.whatif)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lit_compute.formatting import human, markdown_table, percent
from lit_compute.hardware.chips import (
    CHIPS,
    LINKS,
    Chip,
    HardwareError,
    find_chip,
    find_link,
    load_hardware_file,
)
from lit_compute.hardware.dtypes import Float32Math
from lit_compute.planning.whatif import (
    Prediction,
    RunFacts,
    Scenario,
    WhatifError,
    calibrate,
    checked_on,
    default_calibration,
    predict,
    read_run,
    with_loader_cost,
)

__all__ = ["PRECISIONS", "main", "load_prices", "sweep"]

#: the precisions a target can be priced in (Lightning's strings; ``tf32``: float32 on TF32 tensor cores)
PRECISIONS = ("32-true", "32", "tf32", "bf16-mixed", "16-mixed", "bf16-true", "16-true")


def load_prices(path: str | Path, chips: dict[str, Chip]) -> dict[str, float]:
    """``{chip: price per device-hour}`` from a YAML file (``prices: {h100-sxm: 2.99, ...}``); a row naming an
    unknown chip or a price that is not a positive number is refused with its name."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise WhatifError(f"--prices {path}: {getattr(err, 'strerror', None) or str(err).splitlines()[0]}") from None
    prices = data.get("prices") if isinstance(data, dict) else None
    if not isinstance(prices, dict):
        raise WhatifError(f"--prices {path}: expected a prices: section of chip: price per device-hour")
    out = {}
    for chip, price in prices.items():
        if str(chip).lower() not in chips and str(chip).lower() != "this":
            raise WhatifError(f"--prices {path}: prices.{chip}: no such chip ({', '.join(sorted(chips))})")
        try:
            value = float(price)
        except (TypeError, ValueError):
            value = math_nan()
        if not value > 0:
            raise WhatifError(f"--prices {path}: prices.{chip} is {price!r}; give a positive price per device-hour")
        out[str(chip).lower()] = value
    return out


def math_nan() -> float:
    return float("nan")


def sweep(
    run: RunFacts,
    chips: list[Chip],
    precision: str,
    micro_batch: int,
    nodes: list[int],
    devices: int,
    networks: list[Any],
    prices: dict[str, float],
    calibration_run: RunFacts | None = None,
    host_dispatch_s: float = 0.0,
    float32_math: Float32Math | None = None,
) -> list[Prediction]:
    """A prediction per chip x node count x network (one node: the chip's own link); ``host_dispatch_s``: the host's
    eager cost per kernel on an accelerator target; ``float32_math``: ``--tf32``'s answer (None: the run's own)."""
    rows = []
    for chip in chips:
        source = calibration_run or run
        own = source.runs_on(chip)
        cal = calibrate(source, chip) if own else default_calibration()
        for n in nodes:
            for network in networks if n > 1 else [None]:
                scenario = Scenario(
                    chip,
                    precision,
                    micro_batch,
                    n,
                    devices,
                    network,
                    prices.get(chip.name),
                    host_dispatch_s,
                    float32_math,
                )
                row = predict(run, scenario, cal, measured_links=own and n == 1)
                if own:
                    row.notes.append(
                        f"{chip.name} is the hardware {source.path.name} ran on: calibrated on its measured "
                        f"step ({cal.source})"
                    )
                elif (
                    chip.kind != "cpu"
                    and chip == CHIPS.get(chip.name)  # the table's row, not a --hardware-file one
                    and (checked := checked_on(chip.name, precision))
                ):
                    row.notes.append(checked)
                rows.append(row)
    return rows


def row_notes(rows: list[Prediction]) -> list[str]:
    """The rows' notes, each once, in the order first met: a note of every row as it is, a note of some rows after
    the rows it is about (``a100 1 x 8, a100 8 x 8 over 100gbps: ...``)."""
    labels: dict[str, list[str]] = {}
    for row in rows:
        for note in row.notes:
            labels.setdefault(note, []).append(row.label)
    return [note if len(names) == len(rows) else f"{', '.join(names)}: {note}" for note, names in labels.items()]


def enough_up_to(
    run: RunFacts,
    chip: Chip,
    precision: str,
    micro_batch: int,
    devices: int,
    network: Any,
    calibration_run: RunFacts | None = None,
    host_dispatch_s: float = 0.0,
    float32_math: Float32Math | None = None,
) -> int:
    """The largest node count (doubling up to 1024) at which ``network`` is not the bottleneck."""
    source = calibration_run or run
    cal = calibrate(source, chip) if source.runs_on(chip) else default_calibration()
    best, n = 1, 2
    while n <= 1024:
        scenario = Scenario(chip, precision, micro_batch, n, devices, network, None, host_dispatch_s, float32_math)
        p = predict(run, scenario, cal)
        if p.bottleneck == "communication":
            break
        best, n = n, n * 2
    return best


def this_chip(chips: dict[str, Chip]) -> Chip:
    """This machine (:func:`~lit_compute.hardware.this_machine.this_machine`): the CUDA device as its table row
    where there is one, else this CPU, measured."""
    from lit_compute.hardware.this_machine import this_machine

    chip = this_machine()
    chips.setdefault(chip.name, chip)
    return chip


def own_hardware(run: RunFacts, chips: dict[str, Chip]) -> Chip:
    """The chip a run ran on: a GPU run's table row (by its recorded key or its device name), a CPU run's this
    machine's CPU (measured here: the same CPU when the run was made here)."""
    if run.device.lower() in ("cpu", "this"):
        return this_chip(chips)
    if run.device == "traced":
        raise WhatifError("a config has run nowhere yet: name the target with --hardware (h100-sxm, a100, this, ...)")
    try:
        return find_chip(run.chip or run.device, chips)
    except HardwareError:
        raise WhatifError(
            f"{run.path} ran on {run.device!r}, which is not in the hardware table: name the target "
            "with --hardware (h100-sxm, a100, ...) or add the device's row with --hardware-file"
        ) from None


def _host_dispatch(microseconds: float | None, run: RunFacts, targets: list[Chip]) -> tuple[float, str | None]:
    """(the host's eager cost per kernel for accelerator targets, a note naming the host): ``--host-dispatch-us``,
    else measured on this CPU (:func:`~lit_compute.hardware.this_machine.host_dispatch_seconds`) when a target is an
    accelerator the run did not run on (on its own chip the measured step already holds it)."""
    if microseconds is not None:
        if not microseconds >= 0:
            raise WhatifError(
                f"--host-dispatch-us {microseconds}: give the host's cost per kernel in microseconds, "
                ">= 0 (0 leaves it out)"
            )
        return microseconds * 1e-6, (
            f"the host: {microseconds:.3g} us per eager kernel (--host-dispatch-us)" if microseconds else None
        )
    if not any(chip.kind != "cpu" and not run.runs_on(chip) for chip in targets):
        return 0.0, None
    from lit_compute.hardware.this_machine import cpu_name, host_dispatch_seconds

    seconds = host_dispatch_seconds()
    return seconds, (
        f"the host: this CPU ({cpu_name()}), {seconds * 1e6:.3g} us per eager kernel measured here "
        "(--host-dispatch-us for another host)"
    )


def _with_conv_setup(targets: list[Chip], run: RunFacts, precision: str) -> list[Chip]:
    """This CPU among ``targets`` with its convolutions' set-up cost measured (cached) in the run's and the target's
    compute dtypes (:func:`~lit_compute.hardware.this_machine.with_conv_setup`), for a run that convolves."""
    if not run.conv_weights or not any(chip.kind == "cpu" for chip in targets):
        return targets
    from lit_compute.hardware.dtypes import compute_dtype
    from lit_compute.hardware.this_machine import with_conv_setup

    dtypes = tuple(sorted({compute_dtype(p) for p in (run.precision, precision)} & {"float32", "bfloat16"}))
    return [with_conv_setup(chip, dtypes) for chip in targets]


def _table(rows: list[Prediction], run: RunFacts) -> str:
    unit = "tokens/s" if run.tokens_per_sample else "samples/s"
    body = [
        [
            r.hardware,
            f"{r.nodes} x {r.devices_per_node}",
            r.network,
            r.precision,
            r.micro_batch,
            human(r.step_time_s * 1e3),
            human(r.tokens_per_s if run.tokens_per_sample else r.samples_per_s),
            percent(r.mfu),
            r.bottleneck,
            "-" if r.fits is None else ("yes" if r.fits else "NO"),
            human(r.peak_memory_bytes / 1e9) if r.peak_memory_bytes else "n/a",
            f"${r.cost_per_million:,.2f}" if r.cost_per_million is not None else "n/a",
        ]
        for r in rows
    ]
    return markdown_table(
        [
            "hardware",
            "nodes x devices",
            "link",
            "precision",
            "micro-batch",
            "step (ms)",
            unit,
            "MFU",
            "bottleneck",
            "fits",
            "peak memory GB",
            f"cost per 1M {unit.split('/')[0]}",
        ],
        body,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lit-compute whatif", description=__doc__)
    parser.add_argument(
        "run",
        nargs="?",
        default=None,
        help="a TensorBoard run folder (lightning_logs/version_N) trained with FlopsLogger",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="instead of a run: a lit-compute fit YAML, its step counted on fake tensors before any run",
    )
    parser.add_argument(
        "--hardware",
        default="run",
        help="chips, comma-separated: table keys (h100-sxm) or device names (NVIDIA A100-SXM4-80GB); "
        "run = the hardware the run ran on (the default), this = this machine",
    )
    parser.add_argument(
        "--precision", default=None, help="32-true, tf32, bf16-mixed, 16-mixed, bf16-true (default: the run's)"
    )
    parser.add_argument(
        "--micro-batch", type=int, default=None, help="samples per device per batch (default: the run's)"
    )
    parser.add_argument(
        "--tf32",
        choices=("on", "off"),
        default=None,
        help="float32 convolutions and matmuls on an Ampere-or-newer GPU's TF32 tensor cores, or not (default: as "
        "the run's torch switches were; torch's own default puts convolutions on TF32 and matmuls in float32)",
    )
    parser.add_argument("--nodes", default="1", help="node counts, comma-separated (1,8,64)")
    parser.add_argument("--devices-per-node", type=int, default=1, help="devices per node (default 1)")
    parser.add_argument("--network", default="25gbps", help="networks between nodes, comma-separated (25gbps,100gbps)")
    parser.add_argument("--prices", default=None, help="YAML: prices: {chip: dollars per device-hour}")
    parser.add_argument("--hardware-file", default=None, help="YAML rows of your own (chips:, links:)")
    parser.add_argument("--calibration", default=None, help="another run of this machine to measure efficiency on")
    parser.add_argument(
        "--host-dispatch-us",
        type=float,
        default=None,
        help="the target host's eager cost per kernel in microseconds (default: measured on this CPU; 0 leaves it out)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON row per prediction")
    args = parser.parse_args(argv)
    try:
        chips, links = load_hardware_file(args.hardware_file) if args.hardware_file else (dict(CHIPS), dict(LINKS))
        names = [n.strip() for n in args.hardware.split(",") if n.strip()]
        if not names:
            raise WhatifError(f"--hardware {args.hardware!r} names no chip; give table keys, device names, run or this")
        if (args.run is None) == (args.config is None):
            raise WhatifError("give a run folder (lit-compute whatif RUN) or a config (--config C), one of the two")
        if args.config is not None:
            from lit_compute.planning.config_facts import config_facts

            run = config_facts(args.config)
        else:
            run = with_loader_cost(read_run(args.run))
        targets = [
            own_hardware(run, chips)
            if n.lower() == "run"
            else this_chip(chips)
            if n.lower() == "this"
            else find_chip(n, chips)
            for n in names
        ]
        networks = [find_link(n, links) for n in args.network.split(",") if n.strip()]
        try:
            nodes = [int(n) for n in args.nodes.split(",") if n.strip()]
        except ValueError:
            raise WhatifError(f"--nodes {args.nodes!r}: give whole numbers, comma-separated (1,8,64)") from None
        if (
            any(n < 1 for n in nodes)
            or args.devices_per_node < 1
            or (args.micro_batch is not None and args.micro_batch < 1)
        ):
            raise WhatifError("--nodes, --devices-per-node and --micro-batch must be >= 1")
        prices = load_prices(args.prices, chips) if args.prices else {}
        calibration_run = with_loader_cost(read_run(args.calibration)) if args.calibration else None
        precision = args.precision or run.precision
        if precision.lower() not in PRECISIONS:
            raise WhatifError(
                f"--precision {precision!r} is not one whatif prices; give one of {', '.join(PRECISIONS)}"
                + (" (fp8 training is not modelled)" if "8" in precision else "")
            )
        micro_batch = args.micro_batch or run.samples
        if args.run is not None and precision != run.precision and any(chip.kind == "cpu" for chip in targets):
            from lit_compute.planning.config_facts import with_counts_at

            run = with_counts_at(run, precision)  # CPU autocast's casts counted, not assumed
        targets = _with_conv_setup(targets, run, precision)
        dispatch, host_note = _host_dispatch(args.host_dispatch_us, run, targets)
        float32_math = None if args.tf32 is None else Float32Math(args.tf32 == "on", args.tf32 == "on")
        rows = sweep(
            run,
            targets,
            precision,
            micro_batch,
            nodes,
            args.devices_per_node,
            networks,
            prices,
            calibration_run,
            dispatch,
            float32_math,
        )
    except (WhatifError, HardwareError) as err:
        sys.stderr.write(f"lit-compute whatif: error: {err}\n")
        return 2
    if args.json:
        for note in [*run.notes, *([host_note] if host_note else [])]:
            sys.stderr.write(f"lit-compute whatif: note: {note}\n")
        for row in rows:
            sys.stdout.write(json.dumps(row.as_json()) + "\n")
        return 0
    lines = [
        f"What {run.path} ({run.samples} samples per device per batch, {run.precision}, "
        f"{run.world_size} device(s)) would do elsewhere:",
        "",
        _table(rows, run),
        "",
    ]
    if max(nodes) > 1:
        for chip in targets:
            for network in networks:
                up_to = enough_up_to(
                    run,
                    chip,
                    precision,
                    micro_batch,
                    args.devices_per_node,
                    network,
                    calibration_run,
                    dispatch,
                    float32_math,
                )
                lines.append(
                    f"- {network.name} is enough up to {up_to} node(s) of {args.devices_per_node} {chip.name} "
                    f"for this model (beyond, the gradient exchange takes longer than the compute)"
                )
    notes = [*run.notes, *([host_note] if host_note else []), *row_notes(rows)]
    lines += [f"- {n}" for n in notes]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
