"""``lit-compute bench whatif --fit-defaults``: the default efficiencies fitted on the fit set of
``published_gpu.csv``, and the traced steps they were fitted on, kept beside this module (``fit_facts.json``) so a
test ties the defaults in the code to the fit without tracing every model again."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from lit_compute.bench.whatif import gpu, zoo

#: the parameters --fit-defaults fits (each within its bounds); bandwidth and network stay at their defaults
FITTED = {
    "tensor": (0.05, 1.0),
    "vector": (0.05, 1.0),
    "tf32": (0.05, 1.0),
    "conv_tensor": (0.05, 1.0),
    "conv_vector": (0.05, 1.0),
    "conv_tf32": (0.05, 1.0),
    "grouped": (0.02, 1.0),
    "depthwise": (0.02, 1.0),
    "launch_s": (1e-6, 3e-5),
    "sm": (0.1, 100.0),
}
#: the fit set's traced steps as ``--fit-defaults`` last fitted on them
FACTS_FILE = Path(__file__).with_name("fit_facts.json")

Key = tuple[str, int, str]  # model, batch, memory format


def _calibration(values: dict[str, float]) -> Any:
    from lit_compute.planning import whatif

    return whatif.Calibration(
        values["tensor"],
        values["vector"],
        values["bandwidth"],
        values["launch_s"],
        values["network"],
        "fit",
        values["conv_tensor"],
        values["conv_vector"],
        values["tf32"],
        values["conv_tf32"],
        values["grouped"],
        values["depthwise"],
        values["sm"],
    )


def fit_rows() -> list[dict[str, Any]]:
    return [r for r in gpu.published_rows() if r["set"] == "fit"]


def _key(row: dict[str, Any]) -> Key:
    return (row["model"], row["batch"], row["memory_format"])


def traced_fit_facts() -> dict[Key, Any]:
    """Each fit row's step counted on fake tensors now (:func:`zoo.traced_facts`)."""
    return {_key(r): zoo.traced_facts(*_key(r)) for r in fit_rows()}


def facts_record(facts: Any) -> dict[str, Any]:
    """What pricing reads of a traced step, as JSON."""
    return {
        "by_class": {k: list(v) for k, v in sorted(facts.by_class.items())},
        "samples": facts.samples,
        "model_flops": facts.model_flops,
        "trainable": facts.trainable,
        "conv_weights": facts.conv_weights,
        "channels_first": list(facts.channels_first),
        "kernels": [list(k) for k in facts.kernels],
    }


def write_fit_facts(facts: dict[Key, Any], path: Path = FACTS_FILE) -> None:
    rows = [{"model": m, "batch": b, "memory_format": f, **facts_record(v)} for (m, b, f), v in sorted(facts.items())]
    path.write_text(json.dumps(rows, indent=0) + "\n")


def kept_fit_facts(path: Path = FACTS_FILE) -> dict[Key, Any]:
    """The fit set's traced steps as :func:`write_fit_facts` kept them, as run facts."""
    from lit_compute.planning.whatif import RunFacts

    out = {}
    for row in json.loads(path.read_text()):
        key = (row.pop("model"), row.pop("batch"), row.pop("memory_format"))
        out[key] = RunFacts(
            path=Path(f"{key[0]} traced at batch {key[1]}"),
            parameters=row["trainable"],
            precision="32-true",
            device="traced",
            loader_workers=None,
            **row,
        )
    return out


def loss(values: dict[str, float], facts: dict[Key, Any], rows: list[dict[str, Any]] | None = None) -> float:
    """The sum over the fit rows (``rows``: read from the file when None) of the squared log of predicted over
    published throughput at ``values``."""
    from lit_compute.hardware.chips import find_chip
    from lit_compute.planning.whatif import Scenario, predict

    cal = _calibration(values)
    total = 0.0
    for row in fit_rows() if rows is None else rows:
        scenario = Scenario(find_chip(row["chip"]), row["precision"], row["batch"])
        total += math.log(predict(facts[_key(row)], scenario, cal).samples_per_s / row["samples_per_s"]) ** 2
    return total


def on_bounds(values: dict[str, float]) -> set[str]:
    """The fitted parameters within 1% of a bound of :data:`FITTED`: where the fit wanted to go further."""
    return {k for k, (low, high) in FITTED.items() if values[k] <= low * 1.01 or values[k] >= high / 1.01}


def fit_defaults(facts: dict[Key, Any] | None = None) -> dict[str, float]:
    """The default efficiencies that fit the rows of the fit set best: the sum of the squared log errors over them
    (:func:`loss`) minimized one parameter at a time (golden-section search in log space within :data:`FITTED`'s
    bounds), six sweeps; bandwidth and network held at their defaults. The check rows take no part. ``facts``: the
    fit rows' traced steps (traced now when None)."""
    from lit_compute.planning import whatif

    facts = traced_fit_facts() if facts is None else facts
    rows = fit_rows()
    fitted = dict(whatif.DEFAULT_EFFICIENCY)
    for key, (low, high) in FITTED.items():  # start in the middle of each range: the result never depends on the
        fitted[key] = math.sqrt(low * high)  # defaults in the code, which it is checked against

    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(6):
        for key, (low, high) in FITTED.items():
            a, b = math.log(low), math.log(high)
            for _ in range(40):
                c, d = b - ratio * (b - a), a + ratio * (b - a)
                if loss({**fitted, key: math.exp(c)}, facts, rows) <= loss({**fitted, key: math.exp(d)}, facts, rows):
                    b = d
                else:
                    a = c
            fitted[key] = math.exp((a + b) / 2)
    return {k: float(f"{v:.3g}") if k in FITTED else v for k, v in fitted.items()}
