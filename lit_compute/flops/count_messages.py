"""The one-time warnings a finished FLOP count gives (FlopsLogger warns each once, under its key)."""

from __future__ import annotations

from lit_compute.flops.count_book import Recorded
from lit_compute.flops.counting import FlopCount


def short_signature(sig: tuple) -> str:
    """A batch signature in words: its stage and its first tensors' paths and shapes."""
    stage, leaves = sig[0], sig[1]
    shown = ", ".join(f"{path or 'batch'}: {tuple(shape)}" for path, shape, _ in leaves[:4])
    return f"{stage} [{shown}{', ...' if len(leaves) > 4 else ''}]"


def count_warnings(booked: Recorded, count: FlopCount, sig: tuple, max_failures: int) -> list[tuple[str, str]]:
    """(key, message) for each thing about this count a user must hear of."""
    batches = short_signature(sig)
    if booked.values is None:
        out = [
            (
                "count-failed",
                f"FlopsLogger could not count the FLOPs of batches {batches}: {booked.reason}. Nothing "
                "is logged for them; training goes on.",
            )
        ]
        if booked.exhausted:
            out.append(
                (
                    "count-off",
                    f"FlopsLogger: counting failed for {max_failures} batch shapes; counting is now "
                    "off (FlopsLogger logs nothing more); training goes on.",
                )
            )
        return out
    out = []
    if count.uncounted_ops:
        out.append(
            (
                "uncounted",
                f"FlopsLogger: ops without a FLOP formula ran ({', '.join(count.uncounted_ops)}); "
                "the counts are lower bounds. Register a formula with "
                "torch.utils.flop_counter.register_flop_formula.",
            )
        )
    if count.unnamed_modules:
        named = ", ".join(f"{cls} ({why})" for cls, why in sorted(count.unnamed_modules.items())[:3])
        out.append(
            (
                "unnamed",
                f"FlopsLogger: the module tracker could not name {named}; their FLOPs are in every "
                "total but not under their own names in compute/flops_by_module (the table is incomplete "
                "there).",
            )
        )
    if booked.value_dependent:
        out.append(
            (
                f"value-dependent:{booked.value_dependent}",
                f"FlopsLogger: the FLOPs of batches {batches} depend "
                f"on their values, not only their shapes ({booked.value_dependent}); batches of these shapes "
                "that are not counted for real get the mean of the real counts, an estimate, and "
                "compute/flops_estimated (or compute/val_flops_estimated) is 1 where the logged figure used one.",
            )
        )
    if booked.prediction_missed:
        out.append(
            (
                "prediction-miss",
                f"FlopsLogger: the predicted count of batches {batches} missed the real "
                "count; their shapes are counted for real from now on.",
            )
        )
    return out
