"""The efficiencies a prediction prices at: :class:`Calibration` (fractions of a chip's peaks, frozen, with where they
came from), :data:`DEFAULT_EFFICIENCY` (fitted on published results, for hardware a run did not run on) and what
those defaults missed on each chip (:func:`checked_on`, from the data file beside this module)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from lit_compute.flops.kernel_shapes import GEMM_CLASSES
from lit_compute.hardware.dtypes import compute_dtype

__all__ = [
    "CHECKED_FILE",
    "DEFAULT_EFFICIENCY",
    "TENSOR_CORE_CLASSES",
    "Calibration",
    "checked_on",
    "default_calibration",
    "precision_class",
]

#: Fractions of the datasheet peaks a well-fed chip reaches, and the launch cost of one kernel, used for hardware the
#: run did not run on. The FLOP fractions and the launch cost were fitted by ``lit-compute bench whatif --fit-defaults``
#: on the fit set of ``lit_compute/bench/whatif/published_gpu.csv`` (16 published V100 and A100 results of NVIDIA
#: DeepLearningExamples: ResNet-50, ResNeXt-101-32x4d, EfficientNet-B0, BERT-large; least squares on the log of
#: the throughput): ``tensor``/``vector``/``tf32`` for matmuls and attention on half-precision tensor cores, without
#: them and on TF32 ones; ``conv_*`` the same for convolutions; ``grouped`` the fraction of that a grouped convolution
#: reaches, ``depthwise`` the fraction of the vector peak and of the bandwidth a depthwise one reaches; ``sm`` the
#: multiple of :func:`sm_rate` at which a tensor-core op's FLOPs pass through the SMs (V100: 1,024 tensor FLOP per SM
#: and clock, A100 2,048, Hopper 4,096, the GeForce cards 512: the fit's two generations set it). The file's
#: check set (other models, eight other chips, this project's H200 runs) is never fitted on; docs/whatif.md quotes
#: its errors. ``bandwidth`` is what BabelStream-class copies reach of HBM (about 85%); ``network`` what a ring
#: all-reduce reaches of a link (NCCL's tests: about 80%).
DEFAULT_EFFICIENCY = {
    "tensor": 0.925,
    "vector": 0.923,
    "tf32": 1.0,
    "conv_tensor": 0.578,
    "conv_vector": 0.809,
    "conv_tf32": 0.284,
    "grouped": 0.156,
    "depthwise": 0.375,
    "bandwidth": 0.85,
    "network": 0.8,
    "launch_s": 1.05e-06,
    "sm": 6.73,
}
#: the op classes that run on tensor cores (not depthwise convolutions): the GEMMs the counter keeps shapes of
TENSOR_CORE_CLASSES = GEMM_CLASSES


@dataclass(frozen=True)
class Calibration:
    """Fractions of the peaks: measured on the run's own hardware (one factor for FLOPs and bytes alike), or the
    defaults."""

    tensor: float
    vector: float
    bandwidth: float
    launch_s: float
    network: float
    source: str
    conv_tensor: float | None = None  # convolutions' own fractions (None: those of the matmuls)
    conv_vector: float | None = None
    tf32: float | None = None  # matmuls on TF32 tensor cores (None: the half-precision fraction)
    conv_tf32: float | None = None  # convolutions on TF32 tensor cores (None: conv_tensor)
    grouped: float = 1.0  # grouped convolutions reach this fraction of what dense ones reach
    depthwise: float = 1.0  # depthwise convolutions reach this fraction of the vector fraction and of the bandwidth
    #: the SMs' own work around a tensor-core op: its FLOPs at this multiple of :func:`sm_rate`, on top of the
    #: tensor cores' time (None: not priced, as on a run's own hardware, where one measured factor holds it)
    sm: float | None = None
    #: predictions add a CPU's convolution set-up apart (:func:`conv_setup_seconds`); False where the run's measured
    #: compute was not more than that set-up, so calibration could not take it out and the one factor holds it
    conv_setup: bool = True

    def efficiency(self, kind: str, tensor_cores: bool, tf32: bool = False) -> float:
        """The fraction of the FLOP peak an op class reaches: convolutions and matmuls each their own, on tensor
        cores (half precision, or TF32 when ``tf32``) or without (float32); grouped convolutions a fraction of the
        dense ones'; depthwise ones (no tensor cores) a fraction of the vector one; every other class the vector
        one."""
        if kind == "conv_depthwise":
            return self.vector * self.depthwise
        if kind in ("conv", "conv_grouped"):
            value = self.conv_tensor if tensor_cores else self.conv_vector
            if tensor_cores and tf32 and self.conv_tf32 is not None:
                value = self.conv_tf32
            if value is not None:
                return value * (self.grouped if kind == "conv_grouped" else 1.0)
        if tensor_cores and kind in TENSOR_CORE_CLASSES:
            return self.tf32 if tf32 and self.tf32 is not None else self.tensor
        return self.vector


def default_calibration() -> Calibration:
    """:data:`DEFAULT_EFFICIENCY` as a calibration, its source saying where it was set."""
    d = DEFAULT_EFFICIENCY
    return Calibration(
        d["tensor"],
        d["vector"],
        d["bandwidth"],
        d["launch_s"],
        d["network"],
        "defaults (docs/whatif.md: fitted on the fit set of published GPU results)",
        d["conv_tensor"],
        d["conv_vector"],
        d["tf32"],
        d["conv_tf32"],
        d["grouped"],
        d["depthwise"],
        d["sm"],
    )


#: the check rows of ``published_gpu.csv`` priced at :data:`DEFAULT_EFFICIENCY`, as ``lit-compute bench whatif --only
#: gpu --errors`` wrote them (their command, commit and efficiencies inside): what :func:`checked_on` quotes
CHECKED_FILE = Path(__file__).resolve().parent / "published_gpu_errors.json"


def precision_class(precision: str) -> str:
    """What decides which of a chip's peaks a precision runs at: "16 bits" (fp16 or bf16), "TF32" or "float32"."""
    dtype = compute_dtype(precision)
    return "16 bits" if dtype in ("float16", "bfloat16") else "TF32" if dtype == "tf32" else "float32"


def checked_on(chip: str, precision: str, path: Path = CHECKED_FILE) -> str | None:
    """What the default efficiencies missed the published results of ``chip`` at ``precision`` (16 bits, TF32 or
    float32) they were not fitted on by: a note for a prediction at the defaults on that chip (whose label the note
    follows), which is only as good as those. Says so too when the defaults were fitted on that chip and precision,
    or when no result checks them there. None when the file is missing or was written at other efficiencies."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("efficiencies") != DEFAULT_EFFICIENCY:
        return None
    bits = precision_class(precision)
    rows = [r for r in data["rows"] if r["chip"] == chip and precision_class(r["precision"]) == bits]
    fitted = any(c == chip and precision_class(p) == bits for c, p in data.get("fitted_on", []))
    where = f"at {bits}, whatif's default efficiencies"
    source = f"lit-compute bench whatif at {data['commit']}, docs/whatif.md"
    fitted_here = " were fitted on this chip's published results" if fitted else ""
    if not rows:
        return (
            f"{where}{fitted_here}; no other result checks them there ({source})"
            if fitted
            else f"at {bits}, no published result checks whatif's default efficiencies on this chip ({source}): take "
            "the figures as unchecked"
        )
    errors = sorted(((r["predicted"] / r["published"] - 1) * 100, r["model"]) for r in rows)
    if len(errors) <= 4:
        found = ", ".join(f"{model} {error:+.1f}%" for error, model in errors)
    else:
        found = (
            f"median {statistics.median(e for e, _ in errors):+.1f}%, from {errors[0][0]:+.1f}% "
            f"({errors[0][1]}) to {errors[-1][0]:+.1f}% ({errors[-1][1]})"
        )
    missed = (
        f"{fitted_here}; they missed {len(rows)} other(s) they were not fitted on by"
        if fitted
        else f" missed {len(rows)} published result(s) of this chip they were not fitted on by"
    )
    return f"{where}{missed}: {found} (+: predicted faster than published; {source})"
