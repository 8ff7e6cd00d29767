"""SCDH and JCCH / CMUL total objectives (SCDH Eq. 18, JCCH Eq. 16-17, DESIGN.md s.4)."""

from __future__ import annotations

import tensorflow as tf

from tfhash.losses.quantization import quantization_loss
from tfhash.losses.semantic_cluster import classifier_cross_entropy, semantic_cluster_unary_loss


def scdh_loss(labels, neg_distances, logits, codes, lam, mu, alpha, q=None, u=None, p: float = 3.0) -> dict:
    """SCDH total (Eq. 18): SCUL + mu * l_1 + alpha * l_q.

    Args:
        labels: ``(n, C)`` multi-hot labels.
        neg_distances: ``(n, C)`` -D from the semantic clusters.
        logits: ``(n, C)`` classifier ("fc8") logits; ignored when ``mu == 0``.
        codes: ``(n, K)`` continuous codes F.
        lam, mu, alpha: the paper's weights.
        q, u: optional JCCH coefficients for SCUL.

    Returns:
        Dict of scalars: ``loss`` (the total) and its parts ``scul``, ``classifier``, ``quantization``.
    """
    scul = semantic_cluster_unary_loss(labels, neg_distances, lam, q, u)
    classifier = classifier_cross_entropy(labels, logits) if logits is not None else tf.constant(0.0)
    quant = quantization_loss(codes, p)
    return {
        "loss": scul + mu * classifier + alpha * quant,
        "scul": scul,
        "classifier": classifier,
        "quantization": quant,
    }


def alignment_loss(codes_a, codes_b) -> tf.Tensor:
    """Mean of 1 - cos(F1_i, F2_i) over paired examples (JCCH Eq. 17, beta term)."""
    a = tf.math.l2_normalize(tf.cast(codes_a, tf.float32), axis=-1)
    b = tf.math.l2_normalize(tf.cast(codes_b, tf.float32), axis=-1)
    return tf.reduce_mean(1.0 - tf.reduce_sum(a * b, axis=-1))


def cross_modal_loss(labels, towers, lam, mu, alpha, beta, q=None, u=None, p: float = 3.0) -> dict:
    """JCCH / CMUL total (Eq. 16-17): the SCDH objective of each tower against the *shared*
    centres, plus beta * (1 - cos(F1, F2)) for paired data (beta = 0 for unpaired).

    Args:
        labels: ``(n, C)`` labels shared by the pair.
        towers: two dicts with ``neg_distances``, ``logits`` and ``codes`` (one per modality).
        lam, mu, alpha, beta: the paper's weights.
        q, u: optional JCCH coefficients (Algorithm 1).
    """
    if len(towers) != 2:
        raise ValueError("cross_modal_loss needs exactly two towers")
    parts = [scdh_loss(labels, t["neg_distances"], t.get("logits"), t["codes"], lam, mu, alpha, q, u, p) for t in towers]
    align = alignment_loss(towers[0]["codes"], towers[1]["codes"]) if beta else tf.constant(0.0)
    out = {key: parts[0][key] + parts[1][key] for key in parts[0]}
    out["alignment"] = align
    out["loss"] = out["loss"] + beta * align
    return out
