"""The text tables FlopsLogger writes to TensorBoard: model FLOPs by module (with the bytes they move and their
arithmetic intensity) and FLOPs and bytes by op class (whose figures the run's record keeps for ``lit-compute whatif``).

Pure formatting of a :class:`~lit_compute.flops.counting.FlopCount`; no Lightning here.
"""

from __future__ import annotations

from typing import Any

from lit_compute.flops.counting import OP_CLASSES, FlopCount
from lit_compute.formatting import markdown_table

__all__ = ["module_table", "op_class_figures", "op_class_table"]


def _intensity(flops: float, moved: float) -> str:
    return f"{flops / moved:.3g}" if moved else "n/a"


def module_table(count: FlopCount, depth: int, samples: int | None, share: str) -> str:
    """Model FLOPs of one training batch by module (forward, forward + backward, share), with the bytes each
    module's ops read and wrote and their FLOPs per byte."""
    rows = [
        [
            f"`{path}`",
            f"{fwd / 1e9:.4f}",
            f"{tot / 1e9:.4f}",
            f"{100 * tot / count.total:.1f}%",
            f"{count.bytes_by_module.get(path, 0) / 1e6:.3g}",
            _intensity(tot, count.bytes_by_module.get(path, 0)),
        ]
        for path, fwd, tot in count.table(depth)
    ]
    table = markdown_table(["module", "forward GFLOPs", "fwd+bwd GFLOPs", "share", "MB moved", "FLOP/byte"], rows)
    head = (
        f"Model FLOPs of one training batch of {samples or '?'} samples{share}: forward "
        f"{count.forward / 1e9:.4f} GFLOPs, backward {count.backward / 1e9:.4f} GFLOPs, total "
        f"{count.total / 1e9:.4f} GFLOPs (1 multiply-add = 2 FLOPs; no recomputation). Bytes: what each module's "
        "ops read and wrote, forward and backward.\n\n"
    )
    return head + table


def op_class_figures(count: FlopCount, samples: int | None, facts: dict[str, Any]) -> dict[str, Any]:
    """Hardware FLOPs, bytes and kernels of one training batch by op class, with ``facts`` (parameters, precision,
    accumulation, communication): what the run's record keeps for ``lit-compute whatif``."""
    figures = {
        "by_class": {k: list(v) for k, v in count.by_class.items()},
        "samples": samples,
        "model_flops": count.total,
        "hardware_flops": count.hardware,
        **facts,
    }
    if any(count.channels_first):
        figures["channels_first_conv"] = list(count.channels_first)
    if count.conv_weights:
        figures["conv_weights"] = count.conv_weights
    if count.kernels:  # the GEMMs' shapes, priced as tiles and waves on a GPU's SMs
        figures["kernels"] = [list(k) for k in count.kernels]
    return figures


def op_class_table(count: FlopCount, samples: int | None) -> str:
    """Hardware FLOPs and bytes of one training batch (forward, backward and the optimizer's step) by op class, as
    Markdown for people (the figures themselves go to the run's record: :func:`op_class_figures`)."""
    rows = [
        [kind, f"{f / 1e9:.4g}", f"{b / 1e6:.4g}", _intensity(f, b), n]
        for kind in OP_CLASSES
        if kind in count.by_class
        for f, b, n in [count.by_class[kind]]
    ]
    return (
        f"Hardware FLOPs and bytes read and written by one training batch of {samples or '?'} samples (forward, "
        "backward, optimizer step), by op class; FLOP/byte is the arithmetic intensity a roofline prices.\n\n"
        + markdown_table(["op class", "GFLOPs", "MB moved", "FLOP/byte", "ops"], rows)
    )
