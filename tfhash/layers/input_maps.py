"""Input maps of a feature-vector tower: standardisation, or RBF kernel features on anchors drawn
from the training rows, each with its statistics learned from the training rows only (``adapt``)
and saved in the model, so that an exported signature takes the raw vectors.

The shallow cross-modal methods (SePH, SCM, SDMCH) map each modality through such a kernel before
their hash functions; here it is one more lever that validation can choose (:data:`INPUT_MAPS`).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from tfhash.towers import INPUT_MAPS

__all__ = ["anchor_gamma", "rbf_kernel", "RBFFeatures", "input_map_layers"]


def squared_distances(x, anchors):
    """``||x_i - a_j||^2`` for every row ``x_i`` and anchor ``a_j``: ``(n, d)`` and ``(m, d)`` ->
    ``(n, m)``, through the dot product and floored at 0."""
    squared = ops.sum(x * x, axis=-1, keepdims=True) - 2.0 * ops.matmul(x, ops.transpose(anchors)) + ops.sum(anchors * anchors, axis=-1)
    return ops.maximum(squared, 0.0)


def anchor_gamma(anchors):
    """The kernel's ``gamma = 1 / (2 sigma^2)``, ``sigma`` the mean distance between two distinct
    anchors ``(m, d)``, m >= 2 (the anchors being drawn from the training rows, an estimate of the
    mean distance between training rows): a function of the anchors alone, so the pipeline's
    Transform and :class:`RBFFeatures` compute it alike."""
    m = ops.shape(anchors)[0]
    distances = ops.sqrt(squared_distances(anchors, anchors))
    sigma = ops.sum(distances) / ops.cast(m * (m - 1), distances.dtype)
    return 1.0 / (2.0 * sigma * sigma)


def rbf_kernel(x, anchors, gamma):
    """``exp(-gamma * ||x_i - a_j||^2)`` for every row ``x_i`` and anchor ``a_j``: ``(n, d)`` and
    ``(m, d)`` -> ``(n, m)`` (:func:`squared_distances`)."""
    return ops.exp(-gamma * squared_distances(x, anchors))


def _training_rows(data, name: str) -> np.ndarray:
    rows = np.asarray(data, dtype=np.float32)
    if rows.ndim != 2 or len(rows) < 2:
        raise ValueError(f"{name} adapts to training rows (n, d) with n >= 2; got shape {rows.shape}")
    if not np.isfinite(rows).all():
        bad = np.flatnonzero(~np.isfinite(rows).all(axis=1))[:5].tolist()
        raise ValueError(f"{name} cannot adapt to rows with NaN or infinity (rows {bad}); clean them first")
    return rows


@keras.saving.register_keras_serializable(package="tfhash")
class RBFFeatures(keras.layers.Layer):
    """RBF kernel features (:func:`rbf_kernel`) on ``anchors`` rows drawn from the training rows
    with ``seed`` (all of them when there are fewer), of width the mean distance between two
    anchors (:func:`anchor_gamma`). :meth:`adapt` learns both, and must run
    before the layer does (:func:`input_map_layers` and :class:`tfhash.recipes.Recipe` adapt it);
    a saved model keeps them as weights.

    Args:
        anchors: how many anchors to draw (the features' width), at least 2.
        seed: the draw's seed.
    """

    def __init__(self, anchors: int = 500, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        if isinstance(anchors, bool) or not isinstance(anchors, int) or anchors < 2:
            raise ValueError(f"anchors must be an integer of at least 2 (the width is a distance between two), got {anchors!r}")
        self.anchors, self.seed = int(anchors), int(seed)

    def build(self, input_shape):
        self.anchor_rows = self.add_weight(name="anchors", shape=(self.anchors, int(input_shape[-1])), initializer="zeros", trainable=False)
        self.gamma = self.add_weight(name="gamma", shape=(), initializer="zeros", trainable=False)

    def adapt(self, data) -> RBFFeatures:
        """Draw the anchors from ``data`` (the training rows ``(n, d)``) and set the width; returns the layer.

        Raises:
            ValueError: fewer than two rows, a non-finite value, identical anchors (no width).
        """
        rows = _training_rows(data, "RBFFeatures")
        if self.built and (self.anchor_rows.shape[1] != rows.shape[1] or self.anchors > len(rows)):
            raise ValueError(f"this RBFFeatures was built for {tuple(self.anchor_rows.shape)} anchors; adapt a new layer to rows {rows.shape}")
        self.anchors = min(self.anchors, len(rows))
        chosen = rows[np.sort(np.random.default_rng(self.seed).choice(len(rows), self.anchors, replace=False))]
        gamma = float(ops.convert_to_numpy(anchor_gamma(chosen)))
        if not np.isfinite(gamma):
            raise ValueError(f"the {self.anchors} anchors drawn from these rows are all identical (the kernel would have no "
                             "width); draw more anchors or remove the duplicate rows")  # fmt: skip
        if not self.built:
            self.build((None, rows.shape[1]))
        self.anchor_rows.assign(chosen)
        self.gamma.assign(gamma)
        return self

    def call(self, x):
        return rbf_kernel(ops.cast(x, self.anchor_rows.dtype), self.anchor_rows, self.gamma)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.anchors)

    def get_config(self):
        return {**super().get_config(), "anchors": self.anchors, "seed": self.seed}


def input_map_layers(kind: str, rows, seed: int = 0, anchors: int = 500, name: str = "input") -> list[keras.layers.Layer]:
    """The layers of input map ``kind`` (:data:`INPUT_MAPS`), adapted to the training ``rows``:
    none; a ``keras.layers.Normalization``; or :class:`RBFFeatures` then a Normalization of its
    features. They go in front of a tower (:func:`tfhash.models.mlp`'s ``input_map``).

    Raises:
        ValueError: an unknown kind; rows the maps cannot adapt to.
    """
    if kind not in INPUT_MAPS:
        raise ValueError(f"unknown input map {kind!r}; choose one of {INPUT_MAPS}")
    if kind == "none":
        return []
    rows = _training_rows(rows, f"the {kind!r} input map")
    layers = []
    if kind == "rbf":
        rbf = RBFFeatures(anchors, seed, name=f"{name}_rbf").adapt(rows)
        layers.append(rbf)
        rows = keras.ops.convert_to_numpy(rbf(rows))
    scale = keras.layers.Normalization(axis=-1, name=f"{name}_standardise")
    scale.adapt(rows)
    return [*layers, scale]
