"""Encode a split of raw tf.Examples with an exported tfhash SavedModel."""

from __future__ import annotations

import glob
import os

import numpy as np
import tensorflow as tf

_LABEL_SPEC = {"labels": tf.io.VarLenFeature(tf.int64), "id": tf.io.FixedLenFeature([1], tf.int64)}


def split_files(examples_uri: str, split: str) -> list[str]:
    """The record files of one split of an Examples artifact (``Split-<name>/``)."""
    files = sorted(glob.glob(os.path.join(examples_uri, f"Split-{split}", "*")))
    if not files:
        raise FileNotFoundError(f"no records for split {split!r} under {examples_uri}")
    return files


def encode_split(saved_model_dir: str, files: list[str], num_classes: int, batch_size: int = 1024,
                 signature: str = "serving_default"):  # fmt: skip
    """Packed codes, multi-hot labels and ids of every example in ``files``, encoded by
    ``signature`` (``serving_<modality>`` picks one tower of a cross-modal model).

    Returns:
        ``(packed uint8 (n, K/8), labels uint8 (n, C), ids int64 (n,))``.
    """
    serve = tf.saved_model.load(saved_model_dir).signatures[signature]
    codes, labels, ids = [], [], []
    for batch in tf.data.TFRecordDataset(files, compression_type="GZIP").batch(batch_size):
        codes.append(serve(examples=batch)["packed_codes"].numpy())
        parsed = tf.io.parse_example(batch, _LABEL_SPEC)
        dense = tf.sparse.to_dense(parsed["labels"], default_value=-1).numpy()
        multi_hot = np.zeros((dense.shape[0], num_classes), dtype=np.uint8)
        rows, cols = np.nonzero(dense >= 0)
        multi_hot[rows, dense[rows, cols]] = 1
        labels.append(multi_hot)
        ids.append(parsed["id"].numpy()[:, 0])
    return np.concatenate(codes), np.concatenate(labels), np.concatenate(ids)
