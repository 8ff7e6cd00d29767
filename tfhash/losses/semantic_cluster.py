"""Semantic-cluster unary loss (SCUL) and the classifier term of SCDH (docs/design.md s.4).

Shapes: labels ``(n, C)`` multi-hot (one-hot for single-label), ``neg_distances`` ``(n, C)`` the
negative Euclidean distances -D_is of each code to each centre (what
:class:`tfhash.layers.SemanticClusters` returns). The ``*_per_example`` functions return the
``(n,)`` values L_i; the others reduce them with :func:`tfhash.losses.reduce_per_example` (the mean
over the batch, or Keras's weighted form with ``sample_weight``). Rows without labels contribute 0
(and still count in the mean).
"""

from __future__ import annotations

import tensorflow as tf

from tfhash.losses.reduction import reduce_per_example

__all__ = ["cluster_cross_entropy", "label_weights", "semantic_cluster_unary_per_example", "semantic_cluster_unary_loss", "classifier_cross_entropy_per_example", "classifier_cross_entropy"]


def cluster_cross_entropy(neg_distances: tf.Tensor) -> tf.Tensor:
    """l_c(i, s) = -log( exp(-D_is) / sum_j exp(-D_ij) ) for every (i, s): ``(n, C)``
    (SCDH Eq. 9)."""
    return -tf.nn.log_softmax(neg_distances, axis=-1)


def label_weights(labels: tf.Tensor) -> tf.Tensor:
    """q_is = [s in Y_i] / |Y_i| (0 for rows without labels): the SCUL default, JCCH-B."""
    labels = tf.cast(labels, tf.float32)
    count = tf.reduce_sum(labels, axis=-1, keepdims=True)
    return tf.math.divide_no_nan(labels, count)


def semantic_cluster_unary_per_example(labels, neg_distances, lam, q=None, u=None) -> tf.Tensor:
    """SCUL per example (SCDH Eq. 10 and 16, multi-label form of Sec. IV-B; JCCH Eq. 16 with
    coefficients):

    L_i = sum_{s in Y_i} q_is l_c(i, s) + lam * sum_{s in Y_i} u_is D_is,

    with q_is = 1/|Y_i| and u_is = 1 by default, which is
    (1/|Y_i|) sum_{s in Y_i} l_c(i, s) + lam * sum_{s in Y_i} D_is.

    Args:
        labels: ``(n, C)`` multi-hot / one-hot labels.
        neg_distances: ``(n, C)`` -D.
        lam: weight of the distance (compactness) term.
        q, u: optional ``(n, C)`` JCCH coefficients (only entries with a label count).

    Returns:
        ``(n,)``: L_i.
    """
    labels = tf.cast(labels, tf.float32)
    neg_distances = tf.cast(neg_distances, tf.float32)
    q = label_weights(labels) if q is None else tf.cast(q, tf.float32) * labels
    u = labels if u is None else tf.cast(u, tf.float32) * labels
    return tf.reduce_sum(q * cluster_cross_entropy(neg_distances), axis=-1) - lam * tf.reduce_sum(u * neg_distances, axis=-1)


def semantic_cluster_unary_loss(labels, neg_distances, lam, q=None, u=None, sample_weight=None) -> tf.Tensor:
    """SCUL of the batch: the mean of :func:`semantic_cluster_unary_per_example` (weighted by
    ``sample_weight`` as Keras does, :func:`tfhash.losses.reduce_per_example`)."""
    return reduce_per_example(semantic_cluster_unary_per_example(labels, neg_distances, lam, q, u), sample_weight)


def classifier_cross_entropy_per_example(labels, logits) -> tf.Tensor:
    """Softmax cross-entropy of the separate classifier head per example (SCDH Eq. 18 term l_1);
    multi-label: (1/|Y_i|) sum_{s in Y_i} -log softmax_s(a_i). ``(n,)``."""
    labels = tf.cast(labels, tf.float32)
    nll = -tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    return tf.reduce_sum(label_weights(labels) * nll, axis=-1)


def classifier_cross_entropy(labels, logits, sample_weight=None) -> tf.Tensor:
    """l_1 of the batch: the mean of :func:`classifier_cross_entropy_per_example`."""
    return reduce_per_example(classifier_cross_entropy_per_example(labels, logits), sample_weight)
