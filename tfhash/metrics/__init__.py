"""Retrieval metrics: the one definition every other part of tfhash calls (docs/design.md s.2-3).

Plots live in :mod:`tfhash.metrics.plots` (matplotlib, imported on use).
"""

from tfhash.metrics.geometry import class_distances
from tfhash.metrics.retrieval import (
    RetrievalReport,
    average_precision,
    cross_modal_mean_average_precision,
    evaluate_retrieval,
    mean_average_precision,
    mean_average_precision_tie_aware,
    pr_curve_by_radius,
    precision_at_hamming_radius,
    precision_at_n,
    precision_at_n_curve,
)

__all__ = [
    "RetrievalReport",
    "average_precision",
    "class_distances",
    "cross_modal_mean_average_precision",
    "evaluate_retrieval",
    "mean_average_precision",
    "mean_average_precision_tie_aware",
    "pr_curve_by_radius",
    "precision_at_hamming_radius",
    "precision_at_n",
    "precision_at_n_curve",
]
