"""Hamming top-k in pure TensorFlow (XOR + PopulationCount + top_k), exportable as a SavedModel
with stock ops only, so an unmodified TF Serving can answer searches over a small database.

Memory per call is O(queries x chunk_size x bytes): the database is scanned in fixed chunks (the
chunk loop is unrolled at export), each chunk keeps its own top k, and the candidates are merged
with a final top_k. ``tf.math.top_k`` keeps the lower index first among equal values, and chunks
are concatenated in database order, so ties come back in insertion order, as from the exact
:class:`~tfhash.index.binary.BinaryIndex`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

__all__ = ["HammingTopK", "export_hamming_search"]


class HammingTopK(tf.Module):
    """Exact Hamming k-NN over a fixed database of packed codes.

    Args:
        packed_codes: ``uint8`` ``(n, K/8)`` database codes.
        ids: ``int64`` ``(n,)`` external ids.
        chunk_size: database rows scored at once.
    """

    def __init__(self, packed_codes: np.ndarray, ids: np.ndarray, chunk_size: int = 16384, name=None):
        super().__init__(name=name)
        packed_codes = np.asarray(packed_codes, dtype=np.uint8)
        if packed_codes.ndim != 2 or packed_codes.shape[0] == 0:
            raise ValueError("HammingTopK needs a non-empty (n, K/8) uint8 database")
        ids = np.asarray(ids, dtype=np.int64)
        if ids.shape != (packed_codes.shape[0],):
            raise ValueError("ids must have one entry per database code")
        self.num_bytes = int(packed_codes.shape[1])
        self.count = int(packed_codes.shape[0])
        self.chunk_size = int(chunk_size)
        self.codes = tf.Variable(packed_codes, trainable=False, name="codes")
        self.ids = tf.Variable(ids, trainable=False, name="ids")
        self.search = tf.function(
            self._search,
            input_signature=[
                tf.TensorSpec([None, self.num_bytes], tf.uint8, name="queries"),
                tf.TensorSpec([], tf.int32, name="k"),
            ],
        )

    def _search(self, queries, k):
        checks = [
            tf.debugging.assert_greater_equal(k, 1, message="k must be >= 1"),
            tf.debugging.assert_less_equal(k, self.count, message=f"k must be <= the database size {self.count}"),
        ]
        with tf.control_dependencies(checks):
            k = tf.identity(k)
        best_distances, best_positions = [], []
        for start in range(0, self.count, self.chunk_size):
            stop = min(start + self.chunk_size, self.count)
            chunk = self.codes[start:stop]
            xor = tf.bitwise.bitwise_xor(queries[:, None, :], chunk[None, :, :])
            distances = tf.reduce_sum(tf.cast(tf.raw_ops.PopulationCount(x=xor), tf.int32), axis=-1)
            keep = tf.minimum(k, stop - start)
            negated, positions = tf.math.top_k(-distances, k=keep)
            best_distances.append(-negated)
            best_positions.append(positions + start)
        distances = tf.concat(best_distances, axis=1)
        positions = tf.concat(best_positions, axis=1)
        negated, order = tf.math.top_k(-distances, k=k)
        return {"distances": -negated, "ids": tf.gather(self.ids, tf.gather(positions, order, batch_dims=1))}


def export_hamming_search(packed_codes, ids, path, chunk_size: int = 16384) -> None:
    """Save a :class:`HammingTopK` as a SavedModel whose ``serving_default`` signature maps
    ``queries`` (uint8, packed) and ``k`` (int32 scalar) to ``distances`` and ``ids``."""
    module = HammingTopK(packed_codes, ids, chunk_size)
    tf.saved_model.save(module, str(path), signatures={tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY: module.search})
