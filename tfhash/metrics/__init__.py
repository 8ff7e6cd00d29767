"""Retrieval metrics: the one definition every other part of tfhash calls (docs/design.md s.2-3).

Plots live in :mod:`tfhash.metrics.plots` (matplotlib, imported on use). The Keras metrics of a
training batch (:class:`ClassAccuracy`, :class:`PrecisionAtRadius`, for ``compile(metrics=...)``)
live in :mod:`tfhash.metrics.keras_metrics` and are imported on first use, so that this package
stays free of TensorFlow.
"""

import importlib

from tfhash.metrics.geometry import class_distances
from tfhash.metrics.retrieval import (
    RetrievalReport,
    average_precision,
    cross_modal_mean_average_precision,
    evaluate_retrieval,
    evaluate_retrieval_sharded,
    mean_average_precision,
    mean_average_precision_tie_aware,
    pr_curve_by_radius,
    precision_at_hamming_radius,
    precision_at_n,
    precision_at_n_curve,
)

_KERAS_METRICS = ("ClassAccuracy", "PrecisionAtRadius")


def __getattr__(name: str):
    if name in _KERAS_METRICS:
        return getattr(importlib.import_module("tfhash.metrics.keras_metrics"), name)
    raise AttributeError(f"module 'tfhash.metrics' has no attribute {name!r}")


__all__ = [
    "ClassAccuracy",
    "PrecisionAtRadius",
    "RetrievalReport",
    "average_precision",
    "class_distances",
    "cross_modal_mean_average_precision",
    "evaluate_retrieval",
    "evaluate_retrieval_sharded",
    "mean_average_precision",
    "mean_average_precision_tie_aware",
    "pr_curve_by_radius",
    "precision_at_hamming_radius",
    "precision_at_n",
    "precision_at_n_curve",
]
