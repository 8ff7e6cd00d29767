"""SCDH and JCCH / CMUL total objectives (SCDH Eq. 18, JCCH Eq. 16-17, docs/design.md s.4).

Every term is per example: the ``*_per_example`` functions return dicts of ``(n,)`` values, the
others their reduction (:func:`tfhash.losses.reduce_parts`: the batch mean, or Keras's weighted
form with ``sample_weight``).
"""

from __future__ import annotations

import tensorflow as tf

from tfhash.losses.quantization import quantization_per_example
from tfhash.losses.reduction import reduce_parts, reduce_per_example
from tfhash.losses.semantic_cluster import (
    classifier_cross_entropy_per_example,
    semantic_cluster_unary_per_example,
)

__all__ = ["scdh_per_example", "scdh_total", "scdh_loss", "alignment_per_example", "alignment_loss", "cross_modal_per_example", "cross_modal_total", "cross_modal_loss"]


def scdh_per_example(labels, neg_distances, logits, codes, lam, mu, alpha, q=None, u=None, p: float = 3.0) -> dict:
    """SCDH total per example (Eq. 18): L_i = SCUL_i + mu * l_1(i) + alpha * l_q(F_i).

    Args:
        labels: ``(n, C)`` multi-hot labels.
        neg_distances: ``(n, C)`` -D from the semantic clusters.
        logits: ``(n, C)`` classifier ("fc8") logits, or ``None`` (no l_1 term).
        codes: ``(n, K)`` continuous codes F.
        lam, mu, alpha: the paper's weights.
        q, u: optional JCCH coefficients for SCUL.

    Returns:
        Dict of ``(n,)`` values: ``loss`` (the total) and its parts ``scul``, ``classifier``,
        ``quantization`` (unweighted).
    """
    scul = semantic_cluster_unary_per_example(labels, neg_distances, lam, q, u)
    classifier = classifier_cross_entropy_per_example(labels, logits) if logits is not None else tf.zeros_like(scul)
    parts = {"scul": scul, "classifier": classifier, "quantization": quantization_per_example(codes, p)}
    return {"loss": scdh_total(parts, mu, alpha), **parts}


def scdh_total(parts: dict, mu, alpha):
    """Eq. 18 from its terms: ``scul + mu * classifier + alpha * quantization``, of per-example
    values or of their batch reductions (the same loss: the reduction is linear;
    :func:`tfhash.losses.reduce_parts` with ``total``)."""
    return parts["scul"] + mu * parts["classifier"] + alpha * parts["quantization"]


def scdh_loss(labels, neg_distances, logits, codes, lam, mu, alpha, q=None, u=None, p: float = 3.0,
              sample_weight=None) -> dict:  # fmt: skip
    """SCDH total of the batch (Eq. 18): SCUL + mu * l_1 + alpha * l_q, a dict of scalars ``loss``,
    ``scul``, ``classifier``, ``quantization``: :func:`scdh_per_example` reduced."""
    return reduce_parts(scdh_per_example(labels, neg_distances, logits, codes, lam, mu, alpha, q, u, p), sample_weight,
                        lambda reduced: scdh_total(reduced, mu, alpha))  # fmt: skip


def alignment_per_example(codes_a, codes_b) -> tf.Tensor:
    """1 - cos(F1_i, F2_i) of each pair (JCCH Eq. 17, beta term): ``(n,)``."""
    a = tf.math.l2_normalize(tf.cast(codes_a, tf.float32), axis=-1)
    b = tf.math.l2_normalize(tf.cast(codes_b, tf.float32), axis=-1)
    return 1.0 - tf.reduce_sum(a * b, axis=-1)


def alignment_loss(codes_a, codes_b, sample_weight=None) -> tf.Tensor:
    """Mean of 1 - cos(F1_i, F2_i) over paired examples (:func:`alignment_per_example`)."""
    return reduce_per_example(alignment_per_example(codes_a, codes_b), sample_weight)


def cross_modal_per_example(labels, towers, lam, mu, alpha, beta, q=None, u=None, p: float = 3.0) -> dict:
    """JCCH / CMUL total per example (Eq. 16-17): the SCDH objective of each tower against the
    *shared* centres, plus beta * (1 - cos(F1_i, F2_i)) for paired data (beta = 0 for unpaired).

    Args:
        labels: ``(n, C)`` labels shared by the pair.
        towers: two dicts with ``neg_distances``, ``logits`` and ``codes`` (one per modality).
        lam, mu, alpha, beta: the paper's weights.
        q, u: optional JCCH coefficients (Algorithm 1).

    Returns:
        Dict of ``(n,)`` values: ``loss``, the SCDH parts summed over both towers and ``alignment``.
    """
    if len(towers) != 2:
        raise ValueError("cross_modal_loss needs exactly two towers")
    per_tower = [scdh_per_example(labels, t["neg_distances"], t.get("logits"), t["codes"], lam, mu, alpha, q, u, p)
                 for t in towers]  # fmt: skip
    parts = {key: per_tower[0][key] + per_tower[1][key] for key in ("scul", "classifier", "quantization")}
    parts["alignment"] = alignment_per_example(towers[0]["codes"], towers[1]["codes"]) if beta else tf.zeros_like(parts["scul"])
    return {"loss": cross_modal_total(parts, mu, alpha, beta), **parts}


def cross_modal_total(parts: dict, mu, alpha, beta):
    """Eq. 16-17 from the terms summed over the two towers: :func:`scdh_total` plus
    ``beta * alignment``, of per-example values or of their batch reductions."""
    return scdh_total(parts, mu, alpha) + beta * parts["alignment"]


def cross_modal_loss(labels, towers, lam, mu, alpha, beta, q=None, u=None, p: float = 3.0, sample_weight=None) -> dict:
    """JCCH / CMUL total of the batch: :func:`cross_modal_per_example` reduced, a dict of scalars
    ``loss``, ``scul``, ``classifier``, ``quantization``, ``alignment``."""
    return reduce_parts(cross_modal_per_example(labels, towers, lam, mu, alpha, beta, q, u, p), sample_weight,
                        lambda reduced: cross_modal_total(reduced, mu, alpha, beta))  # fmt: skip
