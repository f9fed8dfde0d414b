"""The ``gpu`` part: published GPU training throughputs (``published_gpu.csv``) against the predictions from the
models' steps counted on fake tensors, at the default efficiencies; the sets' summaries and the check rows' file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lit_compute.bench._common import emit
from lit_compute.bench.whatif import zoo
from lit_compute.bench.whatif.training import error_text

PUBLISHED_FILE = Path(__file__).with_name("published_gpu.csv")


def published_rows() -> list[dict[str, Any]]:
    """The rows of ``published_gpu.csv``: set ("fit", "check" or "sealed"), model, chip, precision, memory_format
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


def predicted_rate(row: dict[str, Any], cal: Any) -> float:
    from lit_compute.hardware.chips import find_chip
    from lit_compute.planning.whatif import Scenario, predict

    facts = zoo.traced_facts(row["model"], row["batch"], row["memory_format"])
    return predict(facts, Scenario(find_chip(row["chip"]), row["precision"], row["batch"]), cal).samples_per_s


#: the sets ``bench whatif --only gpu`` prices; ``--sealed`` adds the sealed set (published_gpu.csv's header says why)
SETS = ("fit", "check")


def gpu_predictions(sets: tuple[str, ...] = SETS) -> list[dict[str, Any]]:
    """The rows of published_gpu.csv in ``sets``, each with its prediction at the default efficiencies
    (``predicted``), in the order of ``sets``."""
    from lit_compute.planning.whatif import default_calibration

    cal, rows = default_calibration(), []
    chosen = [row for row in published_rows() if row["set"] in sets]
    for row in sorted(chosen, key=lambda r: sets.index(r["set"])):
        emit(f"  {row['model']} at batch {row['batch']} on {row['chip']}, {row['precision']} ...")
        rows.append({**row, "predicted": predicted_rate(row, cal)})
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
                error_text(row["predicted"], row["samples_per_s"]),
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
        facts = zoo.traced_facts(row["model"], row["batch"], row["memory_format"])
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
    for name in ("fit", "check", "sealed"):
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
