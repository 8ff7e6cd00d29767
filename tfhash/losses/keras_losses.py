"""Keras ``Loss`` wrappers over the pure loss functions, registered under package "tfhash".

``y_true`` of :class:`SemanticClusterUnaryLoss` is either the ``(n, C)`` labels or the
concatenation ``[labels, q, u]`` of shape ``(n, 3C)`` carrying JCCH coefficients.
"""

from __future__ import annotations

import keras

from tfhash.losses.quantization import quantization_loss
from tfhash.losses.semantic_cluster import classifier_cross_entropy, semantic_cluster_unary_loss


def split_label_coefficients(y_true, num_classes: int):
    """Split ``y_true`` into (labels, q, u): ``(n, C)`` gives (labels, None, None), ``(n, 3C)``
    gives the three blocks. Any other width is an error."""
    width = y_true.shape[-1]
    if width == num_classes:
        return y_true, None, None
    if width == 3 * num_classes:
        return y_true[:, :num_classes], y_true[:, num_classes : 2 * num_classes], y_true[:, 2 * num_classes :]
    raise ValueError(
        f"y_true has width {width}; expected the {num_classes} labels or labels+q+u ({3 * num_classes})"
    )


@keras.saving.register_keras_serializable(package="tfhash")
class SemanticClusterUnaryLoss(keras.losses.Loss):
    """SCUL on the ``-D`` output of :class:`tfhash.layers.SemanticClusters` (SCDH Eq. 10/16)."""

    def __init__(self, lam: float = 0.005, name: str = "semantic_cluster_unary_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.lam = float(lam)

    def call(self, y_true, y_pred):
        labels, q, u = split_label_coefficients(y_true, y_pred.shape[-1])
        return semantic_cluster_unary_loss(labels, y_pred, self.lam, q, u)

    def get_config(self):
        return {**super().get_config(), "lam": self.lam}


@keras.saving.register_keras_serializable(package="tfhash")
class QuantizationLoss(keras.losses.Loss):
    """Hoelder quantization loss on continuous codes (``y_true`` is ignored)."""

    def __init__(self, p: float = 3.0, name: str = "quantization_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.p = float(p)

    def call(self, y_true, y_pred):
        del y_true
        return quantization_loss(y_pred, self.p)

    def get_config(self):
        return {**super().get_config(), "p": self.p}


@keras.saving.register_keras_serializable(package="tfhash")
class ClassifierCrossEntropy(keras.losses.Loss):
    """Multi-label-aware softmax cross-entropy of the classifier head (SCDH l_1)."""

    def __init__(self, name: str = "classifier_cross_entropy", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        return classifier_cross_entropy(y_true, y_pred)


__all__ = ["ClassifierCrossEntropy", "QuantizationLoss", "SemanticClusterUnaryLoss", "split_label_coefficients"]
