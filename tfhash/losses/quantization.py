"""Hoelder quantization loss of SCDH (Sec. IV-C, docs/design.md s.4)."""

from __future__ import annotations

import tensorflow as tf

from tfhash.losses.reduction import reduce_per_example

__all__ = ["quantization_per_example", "quantization_loss"]


_EPSILON = 1e-12


def quantization_per_example(codes, p: float = 3.0) -> tf.Tensor:
    """l_q(f) = 1 - sum_k |f_k| / ( ||1||_q * ||f||_p ), with 1/p + 1/q = 1 (p = 3, q = 1.5).

    By Hoelder's inequality 0 <= l_q <= 1, and l_q = 0 exactly when all |f_k| are equal, i.e. when
    f is a scaled binary code.

    Args:
        codes: ``(n, K)`` continuous codes.
        p: the norm of f; q = p / (p - 1).

    Returns:
        ``(n,)``: l_q of each code.
    """
    if p <= 1.0:
        raise ValueError(f"p must be > 1, got {p}")
    codes = tf.cast(codes, tf.float32)
    bits = tf.cast(tf.shape(codes)[-1], tf.float32)
    q = p / (p - 1.0)
    magnitude = tf.abs(codes)
    l1 = tf.reduce_sum(magnitude, axis=-1)
    lp = tf.pow(tf.reduce_sum(tf.pow(magnitude, p), axis=-1) + _EPSILON, 1.0 / p)
    ones_q = tf.pow(bits, 1.0 / q)
    return 1.0 - l1 / (ones_q * lp)


def quantization_loss(codes, p: float = 3.0, sample_weight=None) -> tf.Tensor:
    """Scalar: the mean of :func:`quantization_per_example` over the batch (weighted by
    ``sample_weight`` as Keras does, :func:`tfhash.losses.reduce_per_example`)."""
    return reduce_per_example(quantization_per_example(codes, p), sample_weight)
