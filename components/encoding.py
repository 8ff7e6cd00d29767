"""Encode a split of raw tf.Examples with an exported tfhash SavedModel."""

from __future__ import annotations

import glob
import os

import numpy as np
import tensorflow as tf

from tfhash.artifacts import (
    EXAMPLES_INPUT,
    EXAMPLES_SIGNATURE,
    ID,
    LABELS,
    PACKED_CODES,
    label_spec,
    signature_fingerprint,
)


def split_files(examples_uri: str, split: str) -> list[str]:
    """The record files of one split of an Examples artifact (``Split-<name>/``)."""
    files = sorted(glob.glob(os.path.join(examples_uri, f"Split-{split}", "*")))
    if not files:
        raise FileNotFoundError(f"no records for split {split!r} under {examples_uri}")
    return files


def encode_split(saved_model_dir: str, files: list[str], num_classes: int, batch_size: int = 1024,
                 signature: str = EXAMPLES_SIGNATURE):  # fmt: skip
    """Packed codes, multi-hot labels and ids of every example in ``files``, encoded by
    ``signature`` (``serving_<modality>`` picks one tower of a cross-modal model).

    Returns:
        ``(packed uint8 (n, K/8), labels uint8 (n, C), ids int64 (n,))``.
    """
    serve = tf.saved_model.load(saved_model_dir).signatures[signature]
    codes, labels, ids = [], [], []
    for batch in tf.data.TFRecordDataset(files, compression_type="GZIP").batch(batch_size):
        codes.append(serve(**{EXAMPLES_INPUT: batch})[PACKED_CODES].numpy())
        parsed = tf.io.parse_example(batch, label_spec())
        dense = tf.sparse.to_dense(parsed[LABELS], default_value=-1).numpy()
        multi_hot = np.zeros((dense.shape[0], num_classes), dtype=np.uint8)
        rows, cols = np.nonzero(dense >= 0)
        multi_hot[rows, dense[rows, cols]] = 1
        labels.append(multi_hot)
        ids.append(parsed[ID].numpy()[:, 0])
    return np.concatenate(codes), np.concatenate(labels), np.concatenate(ids)


def encode_split_cached(saved_model_dir: str, files: list[str], num_classes: int, cache_dir: str | None,
                        signature: str = EXAMPLES_SIGNATURE):  # fmt: skip
    """:func:`encode_split`, kept in ``cache_dir`` under a key of the signature, the record files
    and the SavedModel's fingerprint (graph checksum + variables hash): a model with the same
    fingerprint (e.g. the Pusher's copy of the evaluated model) reads the codes back instead of
    encoding the split again; any other model misses. ``cache_dir=None`` encodes."""
    import hashlib
    import json

    if cache_dir is None:
        return encode_split(saved_model_dir, files, num_classes, signature=signature)
    key = json.dumps([signature, sorted(files), signature_fingerprint(saved_model_dir), num_classes])
    path = os.path.join(cache_dir, f"codes-{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz")
    if os.path.isfile(path):
        with np.load(path, allow_pickle=False) as cached:
            return cached["codes"], cached["labels"], cached["ids"]
    codes, labels, ids = encode_split(saved_model_dir, files, num_classes, signature=signature)
    os.makedirs(cache_dir, exist_ok=True)
    np.savez(path, codes=codes, labels=labels, ids=ids)
    return codes, labels, ids
