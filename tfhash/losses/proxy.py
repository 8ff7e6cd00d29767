"""Proxy-family losses: HyP2 (Xu et al., ACM MM 2022, Eq. 2-4, as the official code computes it),
HCLM's class-balanced BCE and Hamming triplet (Morgado et al., IJCV 2020, Eq. 22-24).
DESIGN.md s.4 has the exact forms; every function returns the batch mean."""

from __future__ import annotations

import csv
import functools
import gzip
import importlib.resources
import io
import math

import tensorflow as tf


@functools.lru_cache(maxsize=1)
def _code_table() -> dict[tuple[int, int], int]:
    """(code_length, log2_codewords) -> best-known minimum distance, from the table shipped in
    ``tfhash/resources`` (built from ../shared/data/codetables by scripts/build_codetable.py)."""
    raw = importlib.resources.files("tfhash.resources").joinpath("binary_code_min_distance.csv.gz").read_bytes()
    rows = csv.DictReader(io.StringIO(gzip.decompress(raw).decode()))
    return {(int(r["code_length"]), int(r["log2_codewords"])): int(r["min_distance"]) for r in rows}


def best_known_min_distance(num_classes: int, bits: int) -> int:
    """Best-known minimum distance of a length-``bits`` binary code with 2^ceil(log2 C) words.

    Raises:
        ValueError: sizes outside the table (K in 1..256, 2 <= 2^j codewords <= 2^K).
    """
    if num_classes < 1 or bits < 1:
        raise ValueError("num_classes and bits must be positive")
    log2_words = max(1, math.ceil(math.log2(num_classes)))
    key = (int(bits), log2_words)
    if key not in _code_table():
        raise ValueError(f"the code table has no entry for K = {bits} bits and 2^{log2_words} codewords")
    return _code_table()[key]


def hyp2_zeta(num_classes: int, bits: int) -> float:
    """HyP2 margin zeta(C, K) = 1 - 2d/K, d from :func:`best_known_min_distance`."""
    return 1.0 - 2.0 * best_known_min_distance(num_classes, bits) / bits


def _cosine(a, b):
    return tf.matmul(tf.math.l2_normalize(a, axis=-1), tf.math.l2_normalize(b, axis=-1), transpose_b=True)


PAIR_SCOPES = ("multi-label", "labelled")


def hyp2_loss(labels, codes, proxies, zeta: float, beta: float = 0.5, pair_scope: str = "multi-label") -> tf.Tensor:
    """HyP2 = L_proxy + beta * L_pair.

    L_proxy = sum_{Y_ij=1} (1 - cos_ij) / #{Y_ij=1} + sum_{Y_ij=0} relu(cos_ij - zeta) / #{Y_ij=0},
    cos_ij = cosine(F_i, p_j); L_pair = sum relu(cosine(F_i, F_j) - zeta) / #pairs over ordered
    in-batch pairs i != j of examples that share no label (0 when there is no such pair). Each sum
    is over the whole batch (the official code's normalisation).

    Args:
        labels: ``(n, C)`` multi-hot; codes: ``(n, K)``; proxies: ``(C, K)``.
        pair_scope: which examples form the irrelevant pairs: ``"multi-label"``, both have more
            than one label (HyP2 Eq. 6, the paper's); ``"labelled"``, both have a label (ours: a
            single-label example is pushed from the examples it shares nothing with as well).
    """
    if pair_scope not in PAIR_SCOPES:
        raise ValueError(f"unknown pair_scope {pair_scope!r}; choose one of {PAIR_SCOPES}")
    labels = tf.cast(labels, tf.float32)
    codes = tf.cast(codes, tf.float32)
    cos = _cosine(codes, tf.cast(proxies, tf.float32))
    positive, negative = labels, 1.0 - labels
    proxy_term = tf.math.divide_no_nan(tf.reduce_sum(positive * (1.0 - cos)), tf.reduce_sum(positive)) + tf.math.divide_no_nan(
        tf.reduce_sum(negative * tf.nn.relu(cos - zeta)), tf.reduce_sum(negative)
    )
    several = tf.cast(tf.reduce_sum(labels, axis=1) > (1.0 if pair_scope == "multi-label" else 0.0), tf.float32)
    disjoint = tf.cast(tf.matmul(labels, labels, transpose_b=True) == 0.0, tf.float32)
    pairs = several[:, None] * several[None, :] * disjoint * (1.0 - tf.eye(tf.shape(labels)[0]))
    pair_term = tf.math.divide_no_nan(tf.reduce_sum(pairs * tf.nn.relu(_cosine(codes, codes) - zeta)), tf.reduce_sum(pairs))
    return proxy_term + beta * pair_term


def balanced_binary_cross_entropy(labels, logits, tag_frequencies) -> tf.Tensor:
    """HCLM multi-label loss: -[c_k y log s_k + (1 - c_k)(1 - y) log(1 - s_k)], s_k = sigmoid(logit),
    c_k = 1 - frequency of tag k (the HED class-balanced BCE), mean over tags and examples."""
    labels = tf.cast(labels, tf.float32)
    logits = tf.cast(logits, tf.float32)
    weight = 1.0 - tf.cast(tag_frequencies, tf.float32)[None, :]
    per_entry = weight * labels * tf.nn.softplus(-logits) + (1.0 - weight) * (1.0 - labels) * tf.nn.softplus(logits)
    return tf.reduce_mean(per_entry)


def hamming_triplet_loss(labels, codes, margin: float) -> tf.Tensor:
    """HCLM Eq. 22-24 with batch-all mining: the mean over every in-batch triplet (a, p, n), p != a
    sharing a label with a, n sharing none, of log(1 + exp(m + d_H(a, p) - d_H(a, n))) with the
    relaxed Hamming distance d_H = (K - nu_a.nu_b) / 2 of the tanh codes. 0 without triplets."""
    labels = tf.cast(labels, tf.float32)
    codes = tf.cast(codes, tf.float32)
    bits = tf.cast(tf.shape(codes)[1], tf.float32)
    distance = (bits - tf.matmul(codes, codes, transpose_b=True)) / 2.0
    shares = tf.cast(tf.matmul(labels, labels, transpose_b=True) > 0.0, tf.float32)
    positive = shares * (1.0 - tf.eye(tf.shape(labels)[0]))
    negative = 1.0 - shares
    valid = positive[:, :, None] * negative[:, None, :]
    values = tf.nn.softplus(margin + distance[:, :, None] - distance[:, None, :])
    return tf.math.divide_no_nan(tf.reduce_sum(valid * values), tf.reduce_sum(valid))
