"""Keras metrics of a training batch, for ``model.compile(metrics=...)`` (docs/design.md s.3)."""

from __future__ import annotations

import keras
from keras import ops

__all__ = ["ClassAccuracy", "PrecisionAtRadius", "METRIC_NAMES"]


def _query_weights(labels, sample_weight):
    """Each row's weight as a query: 0 for a row without a label, else its sample weight."""
    weights = ops.cast(ops.sum(labels, axis=-1) > 0, "float32")
    if sample_weight is not None:
        weights = weights * ops.reshape(ops.cast(sample_weight, "float32"), (-1,))
    return weights


class _WeightedMean(keras.metrics.Metric):
    """A mean of per-row values weighted by the rows' query weights."""

    def __init__(self, name: str, dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def row_values(self, labels, y_pred):
        raise NotImplementedError

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels = ops.cast(y_true, "float32")
        weights = _query_weights(labels, sample_weight)
        self.total.assign_add(ops.sum(weights * self.row_values(labels, y_pred)))
        self.count.assign_add(ops.sum(weights))

    def result(self):
        return ops.divide_no_nan(self.total, self.count)

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)


@keras.saving.register_keras_serializable(package="tfhash")
class ClassAccuracy(_WeightedMean):
    """Share of labelled rows whose highest class score is one of their labels; ``y_true`` the
    ``(n, C)`` multi-hot labels, ``y_pred`` the ``(n, C)`` class scores."""

    def __init__(self, name: str = "accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype)

    def row_values(self, labels, y_pred):
        top = ops.argmax(y_pred, axis=-1)
        return ops.sum(labels * ops.one_hot(top, ops.shape(labels)[-1]), axis=-1)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype}


@keras.saving.register_keras_serializable(package="tfhash")
class PrecisionAtRadius(_WeightedMean):
    """P@H<=``radius`` within the batch (below); ``y_true`` the ``(n, C)`` multi-hot
    labels, ``y_pred`` the ``(n, K)`` continuous codes.

    They follow :mod:`tfhash.metrics`'s definitions on the batch instead of a query set against a
    database: every row of a batch is a query, the other rows are its database. Rows without a label
    (MT-SCDH's unlabelled rows) are no query and, having no class, are relevant to nothing.

    * :class:`ClassAccuracy` (``"accuracy"``): the share of rows whose top-scored class is one of
      theirs, on a model's class scores (the classifier, proxy or centre logits); for single-label
      data, Keras's categorical accuracy.
    * :class:`PrecisionAtRadius` (``"precision_h2"``): P@H<=r of the batch, on the continuous codes
      binarised with sign(0) = +1 (docs/design.md s.2); an empty ball scores 0, as in the report.

    ``sample_weight`` weights each query (a row of weight 0 is no query).
    """

    def __init__(self, radius: int = 2, name: str | None = None, dtype=None):
        if isinstance(radius, bool) or not isinstance(radius, int) or radius < 0:
            raise ValueError(f"radius must be an integer >= 0, got {radius!r}")
        super().__init__(name=name or f"precision_h{radius}", dtype=dtype)
        self.radius = radius

    def row_values(self, labels, y_pred):
        codes = ops.where(ops.cast(y_pred, "float32") >= 0, 1.0, -1.0)
        bits = ops.cast(ops.shape(codes)[-1], "float32")
        distances = (bits - ops.matmul(codes, ops.transpose(codes))) / 2.0
        others = 1.0 - ops.eye(ops.shape(codes)[0])
        ball = ops.cast(distances <= self.radius + 0.5, "float32") * others
        relevant = ops.cast(ops.matmul(labels, ops.transpose(labels)) > 0, "float32")
        return ops.divide_no_nan(ops.sum(ball * relevant, axis=-1), ops.sum(ball, axis=-1))

    def get_config(self):
        return {"radius": self.radius, "name": self.name, "dtype": self.dtype}


#: What ``compile(metrics=[...])`` accepts by name, each with the metric it makes.
METRIC_NAMES = {"accuracy": ClassAccuracy, "acc": ClassAccuracy, "precision_h2": PrecisionAtRadius}
