"""Predicting FLOP counts of new batch shapes from counted ones: variable-length batches at no counting cost.

Batches of one *structure* (the same tensors, dtypes and ranks) differ only in their dimensions. A
transformer's FLOPs are exactly a polynomial in them (linear in the batch size, quadratic in the sequence
length); a CNN's, with strided layers rounding sizes down, usually are not. :class:`ShapePredictor` fits, per
structure, a polynomial in the dimensions that varied among the counted batches (each exponent <= 2, total
degree <= 3; dimensions that always vary together are one variable) and trusts it only once it reproduces
every counted batch exactly (relative error below 1e-9) with at least two counts more than it has terms.
Until then, and for every batch whose shape it cannot place, the caller counts for real; it also keeps
counting one new shape in ``verify_every`` to check the fit, and a miss beyond ``tolerance`` stops
prediction for that structure for good.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_EXACT = 1e-9


def structure_of(sig: tuple) -> tuple:
    """The structure of a signature ``(stage, leaves, *rest)`` (leaves from :func:`lit_compute._batch.signature`):
    paths, ranks and dtypes, and whatever else the signature holds (the model's state key): only batches of one
    structure and one model state are fitted together."""
    stage, leaves, *rest = sig
    return (stage, tuple((path, len(shape), dtype) for path, shape, dtype in leaves), *rest)


def dims_of(sig: tuple) -> tuple[int, ...]:
    return tuple(int(d) for _, shape, _ in sig[1] for d in shape)


@dataclass
class _Fit:
    groups: list[list[int]]  # each variable: the dimension positions that carry it
    fixed: dict[int, int]  # positions that never varied -> their value
    exponents: list[tuple[int, ...]]
    coefficients: np.ndarray  # (terms, values)
    scale: np.ndarray  # per variable


@dataclass
class _Structure:
    points: list[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)  # (dims, values)
    fit: _Fit | None = None
    broken: bool = False
    predicted: int = 0


def _monomials(n_vars: int) -> list[tuple[int, ...]]:
    out = [e for e in itertools.product(range(3), repeat=n_vars) if sum(e) <= 3]
    return sorted(out, key=lambda e: (sum(e), e))


class ShapePredictor:
    """Per-structure polynomial fits of integer counts (several values per batch: model forward, backward,
    hardware...).

    Args:
        verify_every: Count one new shape for real in every ``verify_every`` predicted ones.
        tolerance: Relative miss of a verification that stops prediction for the structure.
        max_vars: Most varying dimensions a fit may have.
    """

    def __init__(self, verify_every: int = 25, tolerance: float = 1e-3, max_vars: int = 3) -> None:
        self.verify_every = verify_every
        self.tolerance = tolerance
        self.max_vars = max_vars
        self._structures: dict[tuple, _Structure] = {}

    def add(self, sig: tuple, values: tuple[int, ...]) -> bool:
        """Record a real count. Returns False when it contradicts the structure's fit (prediction stops there)."""
        entry = self._structures.setdefault(structure_of(sig), _Structure())
        dims = dims_of(sig)
        agreed = True
        if entry.fit is not None:
            guess = self._evaluate(entry.fit, dims)
            if guess is not None and any(abs(g - v) > self.tolerance * max(1, abs(v)) for g, v in zip(guess, values)):
                entry.broken, entry.fit, agreed = True, None, False
        entry.points.append((dims, tuple(int(v) for v in values)))
        if not entry.broken:
            entry.fit = self._fit(entry.points)
        return agreed

    def predict(self, sig: tuple) -> tuple[int, ...] | None:
        """The predicted values for a new signature, or None (count it): no trusted fit, a shape outside the fit,
        or a verification turn."""
        entry = self._structures.get(structure_of(sig))
        if entry is None or entry.fit is None:
            return None
        guess = self._evaluate(entry.fit, dims_of(sig))
        if guess is None:
            return None
        entry.predicted += 1
        if self.verify_every and entry.predicted % self.verify_every == 0:
            return None
        return guess

    # -- fitting -------------------------------------------------------------------------------------
    def _fit(self, points: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> _Fit | None:
        dims = np.array([p[0] for p in points], dtype=np.float64)
        values = np.array([p[1] for p in points], dtype=np.float64)
        varying = [j for j in range(dims.shape[1]) if len(set(dims[:, j])) > 1]
        groups: list[list[int]] = []
        for j in varying:  # positions whose values are equal in every point carry one variable
            for group in groups:
                if np.array_equal(dims[:, group[0]], dims[:, j]):
                    group.append(j)
                    break
            else:
                groups.append([j])
        if not groups or len(groups) > self.max_vars:
            return None
        exponents = _monomials(len(groups))
        if len(points) < len(exponents) + 2:
            return None
        scale = np.array([dims[:, g[0]].max() for g in groups])
        design = self._design(dims[:, [g[0] for g in groups]] / scale, exponents)
        coefficients, *_ = np.linalg.lstsq(design, values, rcond=None)
        fitted = design @ coefficients
        if np.any(np.abs(fitted - values) > _EXACT * np.maximum(1.0, np.abs(values))):
            return None
        fixed = {j: int(dims[0, j]) for j in range(dims.shape[1]) if j not in varying}
        return _Fit(groups, fixed, exponents, coefficients, scale)

    @staticmethod
    def _design(x: np.ndarray, exponents: list[tuple[int, ...]]) -> np.ndarray:
        return np.stack([np.prod(x ** np.array(e), axis=1) for e in exponents], axis=1)

    def _evaluate(self, fit: _Fit, dims: tuple[int, ...]) -> tuple[int, ...] | None:
        if any(j >= len(dims) or dims[j] != v for j, v in fit.fixed.items()):
            return None
        variables = []
        for group in fit.groups:
            values = {dims[j] for j in group}
            if len(values) != 1:
                return None
            variables.append(values.pop())
        x = np.array([variables], dtype=np.float64) / fit.scale
        out = self._design(x, fit.exponents) @ fit.coefficients
        return tuple(int(round(v)) for v in out[0])

    def state(self) -> list[Any]:  # pragma: no cover - introspection
        return [(k, len(v.points), v.fit is not None, v.broken) for k, v in self._structures.items()]
