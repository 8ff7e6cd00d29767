"""Proxy-family losses: HyP2 (Xu et al., ACM MM 2022, Eq. 2-4, as the official code computes it),
HCLM's class-balanced BCE and Hamming triplet (Morgado et al., IJCV 2020, Eq. 22-24).
docs/design.md s.4 has the exact forms.

The ``*_per_example`` functions return ``(n,)`` values whose mean over the batch is the loss; the
others reduce them (:func:`tfhash.losses.reduce_per_example`, with optional ``sample_weight``).
HyP2's terms and the triplet term are normalised over the whole batch (over its positives,
negatives, pairs or triplets), so their per-example values are each example's share of the batch
sum (:func:`tfhash.losses.batch_shares`); rows of sample weight zero take no part in those counts
(``taking_part``, :func:`tfhash.losses.rows_taking_part`)."""

from __future__ import annotations

import csv
import functools
import gzip
import importlib.resources
import io
import math

import tensorflow as tf

from tfhash.losses.reduction import (
    batch_shares,
    reduce_per_example,
    rows_taking_part,
    taking_part_mask,
)

__all__ = ["best_known_min_distance", "hyp2_zeta", "check_pair_scope", "hyp2_proxy_per_example", "hyp2_pair_per_example", "hyp2_per_example", "hyp2_loss", "balanced_binary_cross_entropy_per_example", "balanced_binary_cross_entropy", "hamming_triplet_per_example", "hamming_triplet_loss"]


@functools.lru_cache(maxsize=1)
def _code_table() -> dict[tuple[int, int], int]:
    """(code_length, log2_codewords) -> best-known minimum distance, from the table shipped in
    ``tfhash/resources`` (built from the code table in the data directory's ``codetables/`` by
    scripts/build_codetable.py)."""
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


def check_pair_scope(pair_scope: str) -> str:
    """``pair_scope`` when it is one of :data:`PAIR_SCOPES`, else ValueError."""
    if pair_scope not in PAIR_SCOPES:
        raise ValueError(f"unknown pair_scope {pair_scope!r}; choose one of {PAIR_SCOPES}")
    return pair_scope


def hyp2_proxy_per_example(labels, cosines, zeta: float, taking_part=None) -> tf.Tensor:
    """HyP2's proxy term (Eq. 2-3) per example: with cos_ij = cosine(F_i, p_j),

    L_proxy = sum_{Y_ij=1} (1 - cos_ij) / #{Y_ij=1} + sum_{Y_ij=0} relu(cos_ij - zeta) / #{Y_ij=0},

    both sums and counts over the whole batch (the official code's normalisation); example i's
    value is its share (:func:`tfhash.losses.batch_shares`). ``labels``, ``cosines``: ``(n, C)``."""
    labels = tf.cast(labels, tf.float32)
    cosines = tf.cast(cosines, tf.float32)
    part = taking_part_mask(tf.shape(labels)[0], taking_part)[:, None]
    positive, negative = labels * part, (1.0 - labels) * part
    return batch_shares(tf.reduce_sum(positive * (1.0 - cosines), axis=-1), tf.reduce_sum(positive), taking_part) + batch_shares(
        tf.reduce_sum(negative * tf.nn.relu(cosines - zeta), axis=-1), tf.reduce_sum(negative), taking_part
    )


def hyp2_pair_per_example(labels, codes, zeta: float, pair_scope: str = "multi-label", taking_part=None) -> tf.Tensor:
    """HyP2's pair term (Eq. 4-6) per example: L_pair = sum relu(cosine(F_i, F_j) - zeta) / #pairs
    over ordered in-batch pairs i != j of examples that share no label (0 when there is no such
    pair); example i's value is its share of the pairs it anchors.

    Args:
        labels: ``(n, C)`` multi-hot; codes: ``(n, K)``.
        pair_scope: which examples form the irrelevant pairs: ``"multi-label"``, both have more
            than one label (HyP2 Eq. 6, the paper's); ``"labelled"``, both have a label (ours: a
            single-label example is pushed from the examples it shares nothing with as well).
    """
    check_pair_scope(pair_scope)
    labels = tf.cast(labels, tf.float32)
    codes = tf.cast(codes, tf.float32)
    part = taking_part_mask(tf.shape(labels)[0], taking_part)
    several = part * tf.cast(tf.reduce_sum(labels, axis=1) > (1.0 if pair_scope == "multi-label" else 0.0), tf.float32)
    disjoint = tf.cast(tf.matmul(labels, labels, transpose_b=True) == 0.0, tf.float32)
    pairs = several[:, None] * several[None, :] * disjoint * (1.0 - tf.eye(tf.shape(labels)[0]))
    values = tf.reduce_sum(pairs * tf.nn.relu(_cosine(codes, codes) - zeta), axis=-1)
    return batch_shares(values, tf.reduce_sum(pairs), taking_part)


def hyp2_per_example(labels, codes, proxies, zeta: float, beta: float = 0.5, pair_scope: str = "multi-label",
                     taking_part=None) -> tf.Tensor:  # fmt: skip
    """HyP2 = L_proxy + beta * L_pair per example (:func:`hyp2_proxy_per_example` on
    cosine(F, p), :func:`hyp2_pair_per_example`). ``proxies``: ``(C, K)``."""
    check_pair_scope(pair_scope)
    codes = tf.cast(codes, tf.float32)
    cosines = _cosine(codes, tf.cast(proxies, tf.float32))
    return hyp2_proxy_per_example(labels, cosines, zeta, taking_part) + beta * hyp2_pair_per_example(
        labels, codes, zeta, pair_scope, taking_part
    )


def hyp2_loss(labels, codes, proxies, zeta: float, beta: float = 0.5, pair_scope: str = "multi-label",
              sample_weight=None) -> tf.Tensor:  # fmt: skip
    """HyP2 = L_proxy + beta * L_pair of the batch (:func:`hyp2_per_example` reduced; rows of
    weight zero take no part). ``labels``: ``(n, C)`` multi-hot; ``codes``: ``(n, K)``;
    ``proxies``: ``(C, K)``; ``pair_scope``: see :func:`hyp2_pair_per_example`."""
    values = hyp2_per_example(labels, codes, proxies, zeta, beta, pair_scope, rows_taking_part(sample_weight))
    return reduce_per_example(values, sample_weight)


def balanced_binary_cross_entropy_per_example(labels, logits, tag_frequencies) -> tf.Tensor:
    """HCLM multi-label loss per example: the mean over tags k of
    -[c_k y log s_k + (1 - c_k)(1 - y) log(1 - s_k)], s_k = sigmoid(logit), c_k = 1 - frequency
    of tag k (the HED class-balanced BCE). ``(n,)``."""
    labels = tf.cast(labels, tf.float32)
    logits = tf.cast(logits, tf.float32)
    weight = 1.0 - tf.cast(tag_frequencies, tf.float32)[None, :]
    per_entry = weight * labels * tf.nn.softplus(-logits) + (1.0 - weight) * (1.0 - labels) * tf.nn.softplus(logits)
    return tf.reduce_mean(per_entry, axis=-1)


def balanced_binary_cross_entropy(labels, logits, tag_frequencies, sample_weight=None) -> tf.Tensor:
    """The class-balanced BCE of the batch: mean over tags and examples
    (:func:`balanced_binary_cross_entropy_per_example` reduced)."""
    return reduce_per_example(balanced_binary_cross_entropy_per_example(labels, logits, tag_frequencies), sample_weight)


def hamming_triplet_per_example(labels, codes, margin: float, taking_part=None) -> tf.Tensor:
    """HCLM Eq. 22-24 with batch-all mining, per anchor: the mean over every in-batch triplet
    (a, p, n), p != a sharing a label with a, n sharing none, of
    log(1 + exp(m + d_H(a, p) - d_H(a, n))) with the relaxed Hamming distance
    d_H = (K - nu_a.nu_b) / 2 of the tanh codes; anchor a's value is its share of that mean
    (0 everywhere without triplets). ``(n,)``."""
    labels = tf.cast(labels, tf.float32)
    codes = tf.cast(codes, tf.float32)
    part = taking_part_mask(tf.shape(labels)[0], taking_part)
    bits = tf.cast(tf.shape(codes)[1], tf.float32)
    distance = (bits - tf.matmul(codes, codes, transpose_b=True)) / 2.0
    shares = tf.cast(tf.matmul(labels, labels, transpose_b=True) > 0.0, tf.float32)
    both = part[:, None] * part[None, :]
    positive = shares * (1.0 - tf.eye(tf.shape(labels)[0])) * both
    negative = (1.0 - shares) * both
    valid = positive[:, :, None] * negative[:, None, :]
    values = tf.nn.softplus(margin + distance[:, :, None] - distance[:, None, :])
    return batch_shares(tf.reduce_sum(valid * values, axis=[1, 2]), tf.reduce_sum(valid), taking_part)


def hamming_triplet_loss(labels, codes, margin: float, sample_weight=None) -> tf.Tensor:
    """The Hamming triplet loss of the batch (:func:`hamming_triplet_per_example` reduced; rows of
    weight zero take no part in any triplet)."""
    return reduce_per_example(hamming_triplet_per_example(labels, codes, margin, rows_taking_part(sample_weight)), sample_weight)
