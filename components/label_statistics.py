"""JCCH label coefficients q_is, u_is inside Transform (JCCH Algorithm 1; docs/design.md s.4), with
stock tf.Transform analyzers so the computation scales on any Beam runner.
"""

from __future__ import annotations

import hashlib

import apache_beam as beam
import numpy as np
import tensorflow as tf
import tensorflow_transform as tft

__all__ = ["anchor_key", "SelectAnchors", "jcch_coefficient_features", "TAG_COUNTS", "TAG_PAIRS", "tag_statistic_vocabularies", "read_tag_statistics"]


def anchor_key(example_id: int, seed: int = 0) -> int:
    """Stable hash of an example id (keyed by ``seed``; 0: unkeyed): anchors are the examples with
    the smallest keys."""
    key = b"" if seed == 0 else str(int(seed)).encode()
    return int.from_bytes(hashlib.blake2b(str(int(example_id)).encode(), digest_size=8, key=key).digest(), "big")


class SelectAnchors(beam.PTransform):
    """Batches of (rows ``(batch, width)``, ids) -> a ``(num_anchors, width)`` float32 matrix of the
    rows with the smallest :func:`anchor_key`, zero-padded when there are fewer. ``labelled_only``:
    skip all-zero rows (label rows of unlabelled examples)."""

    def __init__(self, num_anchors: int, width: int, seed: int = 0, labelled_only: bool = True):
        super().__init__()
        self.num_anchors, self.width, self.seed, self.labelled_only = int(num_anchors), int(width), int(seed), labelled_only

    def expand(self, batches):
        num_anchors, width, seed, labelled_only = self.num_anchors, self.width, self.seed, self.labelled_only

        def rows(batch):
            values, ids = batch
            for row, example_id in zip(np.asarray(values), np.asarray(ids).reshape(-1), strict=True):
                if not labelled_only or row.sum() > 0:
                    yield anchor_key(example_id, seed), np.asarray(row, dtype=np.float32)

        def to_matrix(chosen):
            matrix = np.zeros((num_anchors, width), dtype=np.float32)
            for position, (_, row) in enumerate(sorted(chosen, key=lambda kv: kv[0])):
                matrix[position] = row
            return matrix

        chosen = (
            batches
            | "Rows" >> beam.FlatMap(rows)
            | "Smallest" >> beam.combiners.Top.Of(num_anchors, key=lambda kv: kv[0], reverse=True)
        )
        return chosen | "Matrix" >> beam.Map(to_matrix)


def jcch_coefficient_features(labels: tf.Tensor, ids: tf.Tensor, num_anchors: int, rescale: bool = True):
    """q and u ``(batch, C)`` of each example.

    Everything per example follows from dataset-level constants:

    * the anchor label matrix Y_A (l x C): the ``num_anchors`` labelled training examples with the
      smallest stable hash of their id (``tft.experimental.ptransform_analyzer`` + Beam ``Top``;
      all labelled examples when ``num_anchors`` >= their number), padded with zero rows;
    * n, the number of labelled training examples, and |P(a)| for every anchor over the whole
      training split (``tft.sum``);
    * for the Eq. 14 rescaling, sum_{i,s} q_is and sum_i |Y_i| over the training split (``tft.sum``,
      a later analysis phase).

    Given those, q and u of an example are a few matrix products with Y_A (see
    :func:`tfhash.losses.jcch_coefficients`, the NumPy reference the tests compare against).
    """
    labels = tf.cast(labels, tf.float32)
    num_classes = labels.shape[-1]
    (anchors,) = tft.experimental.ptransform_analyzer(
        inputs=[labels, tf.reshape(tf.cast(ids, tf.int64), [-1])],
        ptransform=SelectAnchors(num_anchors, num_classes),
        output_dtypes=[tf.float32],
        output_shapes=[[num_anchors, num_classes]],
        name="jcch_anchors",
    )
    label_count = tf.reduce_sum(labels, axis=1)
    labelled = tf.cast(label_count > 0, tf.float32)
    n = tft.sum(labelled, name="jcch_labelled_examples")
    anchor_valid = tf.cast(tf.reduce_sum(anchors, axis=1) > 0, tf.float32)
    l = tf.reduce_sum(anchor_valid)
    intersection = tf.matmul(labels, anchors, transpose_b=True)  # |Y_i & Y_a|
    positive = tf.cast(intersection > 0, tf.float32)
    anchor_positives = tft.sum(positive, reduce_instance_dims=False, name="jcch_anchor_positives")  # |P(a)|
    anchor_negatives = (n - anchor_positives) * anchor_valid  # |N(a)|
    inverse = tf.math.divide_no_nan(positive, intersection)
    negatives_in_anchors = l - tf.reduce_sum(positive, axis=1, keepdims=True)  # |N_A(i)|
    q = tf.square(n / l) * negatives_in_anchors * labels * tf.matmul(inverse, anchors)
    share = tf.math.divide_no_nan(labels, label_count[:, None])
    negative_anchors = (1.0 - positive) * anchor_valid[None, :]
    u = (n / l) * (
        labels * tf.matmul(inverse * anchor_negatives[None, :], anchors)
        + share * tf.reduce_sum(negative_anchors * anchor_positives[None, :], axis=1, keepdims=True)
    )
    if rescale:
        scale = tft.sum(tf.reduce_sum(q, axis=1), name="jcch_q_mass") / tft.sum(label_count, name="jcch_label_mass")
        q, u = tf.math.divide_no_nan(q, scale), tf.math.divide_no_nan(u, scale)
    return q, u


# Tag statistics for the proxy methods (HCLM Eq. 21 assignment, balanced BCE tag weights), as two
# tft.vocabulary analyzers with counts: they are files of the Transform output that the Trainer
# reads by name, and they stay sparse (one token per tag and per co-occurring tag pair of an
# example), so they scale with the labels present, not with C^2 per example.
TAG_COUNTS = "tfhash_tag_counts"
TAG_PAIRS = "tfhash_tag_pairs"
EXAMPLES_TOKEN = "examples"
_PAIR_SEPARATOR = "_X_"  # tf.ragged.cross's separator


def tag_statistic_vocabularies(labels: tf.Tensor) -> None:
    """Register the analyzers: ``TAG_COUNTS`` holds, per tag id, the number of training examples
    that carry it, and ``EXAMPLES_TOKEN`` once per example; ``TAG_PAIRS`` holds, per ordered pair
    "a_X_b" of tag ids, the number of examples that carry both (a = b included)."""
    present = tf.where(labels > 0)
    batch = tf.shape(labels, out_type=tf.int64)[0]
    tags = tf.RaggedTensor.from_value_rowids(tf.strings.as_string(present[:, 1]), present[:, 0], nrows=batch)
    examples = tf.RaggedTensor.from_tensor(tf.fill(tf.stack([batch, 1]), EXAMPLES_TOKEN))
    tft.vocabulary(tf.concat([tags, examples], axis=1), vocab_filename=TAG_COUNTS, store_frequency=True,
                   name="tag_counts")  # fmt: skip
    tft.vocabulary(tf.ragged.cross([tags, tags]), vocab_filename=TAG_PAIRS, store_frequency=True, name="tag_pairs")


def _frequencies(path: str) -> dict[str, int]:
    """A ``store_frequency`` vocabulary file: lines ``<count> <token>``."""
    out = {}
    with tf.io.gfile.GFile(path) as handle:
        for line in handle:
            count, token = line.rstrip("\n").split(" ", 1)
            out[token] = int(float(count))
    return out


def read_tag_statistics(counts_file: str, pairs_file: str, num_classes: int) -> tuple[int, np.ndarray]:
    """``(examples n, co-occurrence C x C)`` from the two vocabulary files; the diagonal holds the
    per-tag counts. Tags never seen in training keep zero rows."""
    counts = _frequencies(counts_file)
    cooccurrence = np.zeros((num_classes, num_classes), dtype=np.float64)
    for token, count in _frequencies(pairs_file).items():
        a, b = (int(part) for part in token.split(_PAIR_SEPARATOR))
        if a >= num_classes or b >= num_classes:
            raise ValueError(f"tag pair {token!r} is outside the {num_classes} classes")
        cooccurrence[a, b] = count
    return counts.get(EXAMPLES_TOKEN, 0), cooccurrence
