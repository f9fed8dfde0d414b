"""Numbers as people read them, and the one Markdown table: the ground floor every other module may use.

Pure standard library: the training callbacks, the benchmarks and ``lit-compute report`` format with the same
functions, so a figure reads the same in TensorBoard's text tab, a bench table and a report.
"""

from __future__ import annotations

import math
import signal
from typing import Any


def human(value: float | None, digits: int = 3) -> str:
    """A number without scientific notation: ``14,200``, ``3.14``, ``0.00251``; ``n/a`` for None/NaN."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    v = float(value)
    if v == 0:
        return "0"
    magnitude = abs(v)
    if magnitude >= 10**digits:
        return f"{v:,.0f}"
    decimals = max(0, digits - 1 - math.floor(math.log10(magnitude)))
    text = f"{v:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


#: FLOP/s units from the largest down: ``(scale in TFLOP/s, unit)``.
FLOP_RATE_UNITS = ((1.0, "TFLOP/s"), (1e-3, "GFLOP/s"), (1e-6, "MFLOP/s"), (1e-9, "kFLOP/s"))


def first_line(err: BaseException, limit: int | None = 300) -> str:
    """An exception in one line for a note: its message's first line (its type's name when it has none), at most
    ``limit`` characters (None: the whole line)."""
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:limit]


def exit_status(returncode: int) -> str:
    """How a child process ended, as a person reads it: ``exit status 2``, or ``killed by SIGSEGV`` for the negative
    status ``subprocess`` gives a process a signal ended.

    >>> exit_status(2), exit_status(-11)
    ('exit status 2', 'killed by SIGSEGV')
    """
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def typed_line(err: BaseException) -> str:
    """``Type: first line`` of an exception (``Type: `` when it has no message)."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def flops_rate_unit(tflops: float) -> tuple[float, str]:
    """The unit that fits a FLOP/s figure given in TFLOP/s: ``(scale in TFLOP/s, unit)``."""
    return next(((s, u) for s, u in FLOP_RATE_UNITS if abs(tflops) >= s), FLOP_RATE_UNITS[-1])


def flops_rate(tflops: float | None) -> str:
    """A FLOP/s figure in a unit that fits: ``312 TFLOP/s``, ``2.5 GFLOP/s`` (a CPU), ``40 MFLOP/s``."""
    if tflops is None or not math.isfinite(tflops):
        return "n/a"
    scale, unit = flops_rate_unit(tflops)
    return f"{human(tflops / scale)} {unit}"


def percent(value: float | None) -> str:
    """A fraction as a percentage with one decimal (``0.123`` -> ``12.3%``); ``n/a`` for None/NaN."""
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


def markdown_table(header: list[str], rows: list[list[Any]], aligned: bool = False) -> str:
    """A Markdown table.

    Plain (the default): cells as ``str()``, what TensorBoard's text plugin and the report render. ``aligned``:
    for a terminal (the benchmarks): floats through :func:`human` with 4 significant digits, columns padded,
    numbers right-aligned."""
    if not aligned:
        lines = ["| " + " | ".join(str(c) for c in header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        return "\n".join(lines)
    cells = [[str(c) for c in header]] + [
        [human(c, 4) if isinstance(c, float) else str(c) for c in row] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths)) + " |"]
    out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    out += ["| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |" for r in cells[1:]]
    return "\n".join(out)


def read_key_value_table(text: str) -> dict[str, str]:
    """The rows of a two-column :func:`markdown_table` (``key | value``) as a dict, the header and rule left out:
    how ``lit-compute report`` reads back the run-info table the writer wrote."""
    out: dict[str, str] = {}
    for line in text.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2:
            out.setdefault(cells[0], cells[1])
    return out
