"""Before paying for compute: will a config fit (:func:`estimate`), and what would it cost elsewhere."""

from lit_compute.planning.estimate import EstimateError, EstimateRow, Plan, estimate

__all__ = ["EstimateError", "EstimateRow", "Plan", "estimate"]
