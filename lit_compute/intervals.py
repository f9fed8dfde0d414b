"""Student t intervals: the one table of 95% quantiles every interval lit_compute prints uses (the tune's trial and
paired intervals, the benches' ratios, the straggler test), and the lower bound of a mean."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["half_width", "mean_lower_bound", "t95"]

#: two-sided 95% Student t quantiles by degrees of freedom (beyond 30: the normal's 1.96 is within 2%)
_T95 = {
    1: 12.71,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    25: 2.060,
    30: 2.042,
}


def t95(dof: int) -> float:
    """The 95% two-sided Student t quantile for ``dof`` degrees of freedom; between rows of the table, the next
    smaller tabulated one (a wider interval, never a narrower one); infinite below 1.

    >>> t95(7), t95(11), t95(100)
    (2.365, 2.228, 1.96)
    """
    if dof < 1:
        return math.inf
    if dof > 30:
        return 1.96
    return _T95[max(k for k in _T95 if k <= dof)]


def half_width(values: Sequence[float]) -> float:
    """The half width of the two-sided 95% Student t interval of the mean of ``values``; infinite with fewer than
    two.

    >>> round(half_width([1.0, 1.2, 0.8, 1.0]), 3)
    0.26
    """
    if len(values) < 2:
        return math.inf
    return t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def mean_lower_bound(values: Sequence[float]) -> float:
    """The lower end of the two-sided 95% Student t interval of the mean of ``values`` (a one-sided 97.5% bound);
    ``-inf`` with fewer than two.

    >>> round(mean_lower_bound([1.0, 1.2, 0.8, 1.0]), 3)
    0.74
    """
    if len(values) < 2:
        return -math.inf
    return statistics.fmean(values) - half_width(values)
