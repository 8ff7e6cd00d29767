"""Pairwise-likelihood baseline loss (DPSH: Li, Wang and Kang, "Feature Learning based Deep
Supervised Hashing with Pairwise Labels", IJCAI 2016, Eq. 3 and 5).

It is here as the O(n^2) reference the unary losses are measured against (SCDH Sec. III): each
example of a batch is paired with every training example through a memory of the latest
continuous codes, so one epoch touches all n^2 pairs.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from tfhash.losses.reduction import reduce_per_example

__all__ = ["pairwise_similarity", "check_cosine_scale", "check_pairwise_weight", "pairwise_likelihood_per_example", "in_batch_pairwise_per_example", "pairwise_likelihood_loss"]


def pairwise_similarity(labels, other_labels):
    """s_ij = 1 when examples i and j share at least one label, else 0 (float32, ``(n, m)``)."""
    labels = tf.cast(labels, tf.float32)
    other_labels = tf.cast(other_labels, tf.float32)
    return tf.cast(tf.matmul(labels, other_labels, transpose_b=True) > 0, tf.float32)


def _finite_number(value) -> bool:
    """A finite real number (a bool, a string or an array is not)."""
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value)


def check_cosine_scale(scale, name: str = "cosine_scale", allow_none: bool = False) -> float | None:
    """``scale`` as a float when it is a finite number > 0 (``None`` passes when ``allow_none``:
    DPSH's inner product), else ValueError naming ``name`` and the value."""
    if scale is None and allow_none:
        return None
    if not (_finite_number(scale) and scale > 0):
        none = "None (DPSH's u_i . u_j / 2) or " if allow_none else ""
        raise ValueError(f"{name} must be {none}a finite number > 0 (the scale of the codes' cosine, e.g. 2), got {scale!r}")
    return float(scale)


def check_pairwise_weight(weight, published: str) -> float:
    """``weight`` of the in-batch pairwise term (:func:`in_batch_pairwise_per_example`) as a float
    when it is a finite number >= 0, else ValueError naming ``pairwise_weight`` (0 leaves the
    ``published`` method as it is)."""
    if not (_finite_number(weight) and weight >= 0):
        raise ValueError(f"pairwise_weight must be a finite number >= 0 (0: {published} as published), got {weight!r}")
    return float(weight)


def pairwise_likelihood_per_example(codes, other_codes, similarity, eta: float = 0.01, other_taking_part=None,
                                     cosine_scale: float | None = None):  # fmt: skip
    """DPSH's objective per example of a batch against a set of codes (the memory U of DPSH's
    Algorithm 1):

    L_i = mean_j [ log(1 + exp(theta_ij)) - s_ij theta_ij ] + eta * ||u_i - sign(u_i)||^2,
    theta_ij = u_i . u_j / 2 (Eq. 3 with the relaxation of Eq. 5).

    DPSH sums over pairs; we take means so the learning rate does not depend on n (our choice).
    Against DPSH's sums, a weight eta here equals eta * m in DPSH's form.

    With ``cosine_scale`` a, theta_ij = a * cosine(u_i, u_j) instead (ours): HashNet's likelihood
    (Cao et al., ICCV 2017: a sigmoid of alpha <h_i, h_j>) on normalised codes, so it ranks by
    angle alone and is bounded in [-a, a]. It is the form that joins a loss of cosines such as
    HyP2's, which leaves the code norm free; ``eta`` is then usually 0
    (:func:`in_batch_pairwise_per_example`).

    Args:
        codes: ``(n, K)`` continuous codes u of the batch.
        other_codes: ``(m, K)`` codes to pair with (the memory, or ``codes`` itself).
        similarity: ``(n, m)`` 0/1 pair labels (:func:`pairwise_similarity`).
        eta: weight of the quantization term.
        other_taking_part: optional ``(m,)`` bool: the mean over j runs over these only (in-batch
            pairs with sample weights, :func:`tfhash.losses.rows_taking_part`).
        cosine_scale: None for DPSH's theta = u_i . u_j / 2; a > 0 for theta = a cosine(u_i, u_j).

    Returns:
        ``(n,)``: L_i.
    """
    codes = tf.cast(codes, tf.float32)
    other_codes = tf.cast(other_codes, tf.float32)
    if cosine_scale is None:
        theta = 0.5 * tf.matmul(codes, other_codes, transpose_b=True)
    else:
        theta = float(cosine_scale) * tf.matmul(tf.math.l2_normalize(codes, axis=-1), tf.math.l2_normalize(other_codes, axis=-1),
                                                transpose_b=True)  # fmt: skip
    pair_values = tf.nn.softplus(theta) - tf.cast(similarity, tf.float32) * theta
    if other_taking_part is None:
        likelihood = tf.reduce_mean(pair_values, axis=-1)
    else:
        columns = tf.cast(other_taking_part, tf.float32)
        likelihood = tf.math.divide_no_nan(tf.reduce_sum(pair_values * columns[None, :], axis=-1), tf.reduce_sum(columns))
    signs = tf.where(codes >= 0.0, 1.0, -1.0)
    return likelihood + eta * tf.reduce_sum(tf.square(codes - signs), axis=-1)


def in_batch_pairwise_per_example(codes, labels, cosine_scale: float, taking_part=None):
    """The pairwise likelihood over every pair of a batch, on ``cosine_scale`` x the codes' cosine
    (ours; :func:`pairwise_likelihood_per_example` with ``other_codes = codes``, eta 0): the
    ``pairwise_weight`` term of :class:`tfhash.models.HyP2Model` and :class:`tfhash.models.HCLMModel`.
    Proxy losses pull each code to its class proxies (and HyP2 pushes apart pairs that share
    nothing); this term also orders every pair against the others, which mAP over a whole
    database counts.

    Args:
        codes: ``(n, K)`` continuous codes of the batch.
        labels: ``(n, C)`` multi-hot labels (pairs sharing one are similar).
        cosine_scale: a > 0 in theta_ij = a cosine(u_i, u_j).
        taking_part: optional ``(n,)`` bool: rows paired with (:func:`tfhash.losses.rows_taking_part`).

    Returns:
        ``(n,)``: each example's mean likelihood over its pairs.
    """
    return pairwise_likelihood_per_example(codes, codes, pairwise_similarity(labels, labels), 0.0, taking_part, cosine_scale)


def pairwise_likelihood_loss(codes, other_codes, similarity, eta: float = 0.01, sample_weight=None):
    """DPSH's objective of the batch: the mean of :func:`pairwise_likelihood_per_example` over the
    batch's examples (weighted by ``sample_weight`` as Keras does), i.e.
    mean_ij [ log(1 + exp(theta_ij)) - s_ij theta_ij ] + eta * mean_i ||u_i - sign(u_i)||^2."""
    return reduce_per_example(pairwise_likelihood_per_example(codes, other_codes, similarity, eta), sample_weight)
