"""``lit-compute bench whatif --fit-defaults``: the default efficiencies fitted on the fit set of
``published_gpu.csv``."""

from __future__ import annotations

from typing import Any

from lit_compute.bench.whatif import gpu

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


def fit_defaults() -> dict[str, float]:
    """The default efficiencies that fit the rows of the fit set best: the sum of the squared log errors over them
    minimized one parameter at a time (golden-section search in log space within :data:`FITTED`'s bounds), six
    sweeps; bandwidth and network held at their defaults. The check rows take no part."""
    import math

    from lit_compute.planning import whatif

    rows = [r for r in gpu.published_rows() if r["set"] == "fit"]
    fitted = dict(whatif.DEFAULT_EFFICIENCY)
    for key, (low, high) in FITTED.items():  # start in the middle of each range: the result never depends on the
        fitted[key] = math.sqrt(low * high)  # defaults in the code, which it is checked against

    def loss(values: dict[str, float]) -> float:
        cal = _calibration(values)
        return sum(math.log(gpu.predicted_rate(r, cal) / r["samples_per_s"]) ** 2 for r in rows)

    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(6):
        for key, (low, high) in FITTED.items():
            a, b = math.log(low), math.log(high)
            for _ in range(40):
                c, d = b - ratio * (b - a), a + ratio * (b - a)
                if loss({**fitted, key: math.exp(c)}) <= loss({**fitted, key: math.exp(d)}):
                    b = d
                else:
                    a = c
            fitted[key] = math.exp((a + b) / 2)
    return {k: float(f"{v:.3g}") if k in FITTED else v for k, v in fitted.items()}
