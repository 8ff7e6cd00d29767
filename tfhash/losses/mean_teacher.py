"""Mean-Teacher consistency for MT-SCDH (SCDH Eq. 21; Tarvainen and Valpola, 2017)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfhash.losses.reduction import reduce_per_example

__all__ = ["softmax_squared_distance", "mean_teacher_consistency_per_example", "mean_teacher_consistency", "sigmoid_rampup"]


def softmax_squared_distance(student_logits, teacher_logits) -> tf.Tensor:
    """d(u, v) = ||softmax(u) - softmax(v)||^2 per example: ``(n,)``. The teacher side is a constant
    (no gradient flows into the teacher)."""
    student = tf.nn.softmax(tf.cast(student_logits, tf.float32), axis=-1)
    teacher = tf.stop_gradient(tf.nn.softmax(tf.cast(teacher_logits, tf.float32), axis=-1))
    return tf.reduce_sum(tf.square(student - teacher), axis=-1)


def mean_teacher_consistency_per_example(student_logits, teacher_logits, student_neg_distances, teacher_neg_distances,
                                         mu) -> tf.Tensor:  # fmt: skip
    """mu * d(a_i, a_i^T) + d(e_i, e_i^T) of every example, labelled or not, with a the classifier
    logits and e = -D (SCDH Eq. 21 without the ramp weight w): ``(n,)``."""
    return mu * softmax_squared_distance(student_logits, teacher_logits) + softmax_squared_distance(
        student_neg_distances, teacher_neg_distances
    )


def mean_teacher_consistency(student_logits, teacher_logits, student_neg_distances, teacher_neg_distances, mu,
                             sample_weight=None) -> tf.Tensor:  # fmt: skip
    """Mean over labelled and unlabelled examples of :func:`mean_teacher_consistency_per_example`
    (weighted by ``sample_weight`` as Keras does, :func:`tfhash.losses.reduce_per_example`)."""
    return reduce_per_example(
        mean_teacher_consistency_per_example(student_logits, teacher_logits, student_neg_distances, teacher_neg_distances, mu),
        sample_weight,
    )


def sigmoid_rampup(current: float, rampup_length: float) -> float:
    """Mean Teacher's ramp-up exp(-5 (1 - t)^2), t = current / rampup_length clipped to [0, 1]."""
    if rampup_length <= 0:
        return 1.0
    t = float(np.clip(current / rampup_length, 0.0, 1.0))
    return float(np.exp(-5.0 * (1.0 - t) ** 2))
