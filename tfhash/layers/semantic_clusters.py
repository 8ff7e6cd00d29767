"""Semantic cluster centres c_1..c_C and the distances D_is = ||F_i - c_s||_2 (SCDH Sec. IV)."""

from __future__ import annotations

import keras
from keras import ops

__all__ = ["negative_distances", "SemanticClusters"]


_MIN_SQUARED = 1e-12


def negative_distances(codes, centres):
    """-D: ``(n, K)`` codes and ``(C, K)`` centres -> ``(n, C)`` negative Euclidean distances
    (not squared; docs/design.md s.4). The squared distance is floored at 1e-12 so that the gradient
    of the square root stays finite."""
    squared = (
        ops.sum(ops.square(codes), axis=-1, keepdims=True)
        - 2.0 * ops.matmul(codes, ops.transpose(centres))
        + ops.expand_dims(ops.sum(ops.square(centres), axis=-1), 0)
    )
    return -ops.sqrt(ops.maximum(squared, _MIN_SQUARED))


@keras.saving.register_keras_serializable(package="tfhash")
class SemanticClusters(keras.layers.Layer):
    """Holds the C cluster centres (init N(0, 0.5^2)) and returns -D, ``(n, C)``.

    One instance may be called on several towers (cross-modal JCCH): the centres are shared.

    Args:
        num_classes: C.
        bits: K, the code length the centres live in.
        centre_initializer: defaults to N(0, 0.5^2) (SCDH Sec. IV-D).
        similarity: ``"euclidean"`` returns -D (SCDH); ``"dot"`` returns the dot products F.c_s,
            the softmax-on-dot-products ablation SCDH-S (SCDH Sec. VI-D).
    """

    def __init__(self, num_classes: int, bits: int, centre_initializer=None, similarity: str = "euclidean", **kwargs):
        super().__init__(**kwargs)
        if int(num_classes) <= 0 or int(bits) <= 0:
            raise ValueError("num_classes and bits must be positive")
        if similarity not in ("euclidean", "dot"):
            raise ValueError(f"similarity must be 'euclidean' or 'dot', got {similarity!r}")
        self.similarity = similarity
        self.num_classes = int(num_classes)
        self.bits = int(bits)
        self.centre_initializer = keras.initializers.get(
            centre_initializer or keras.initializers.RandomNormal(stddev=0.5)
        )
        self.centres = self.add_weight(
            name="centres",
            shape=(self.num_classes, self.bits),
            initializer=self.centre_initializer,
            trainable=True,
        )

    def build(self, input_shape):
        if input_shape[-1] is not None and input_shape[-1] != self.bits:
            raise ValueError(f"SemanticClusters expects codes of {self.bits} bits, got {input_shape[-1]}")

    def call(self, codes):
        if self.similarity == "dot":
            return ops.matmul(codes, ops.transpose(self.centres))
        return negative_distances(codes, self.centres)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.num_classes)

    def get_config(self):
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "bits": self.bits,
            "similarity": self.similarity,
            "centre_initializer": keras.initializers.serialize(self.centre_initializer),
        }
