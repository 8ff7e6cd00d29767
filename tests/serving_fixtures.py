"""Small real serving artifacts for the serving tests: a tfhash SCDH model over 8-d feature
vectors, exported with the pipeline's export code (both signatures, warmup records) under a model
base directory, and its Hamming index under the IndexBuilder's layout."""

from __future__ import annotations

import os

import numpy as np

DIM, BITS, CLASSES = 8, 16, 3
RAW_SPEC_NAME = "features"


def vector_example(values, label: int | None = None, item_id: int = 0) -> bytes:
    import tensorflow as tf

    feature = {"features": tf.train.Feature(float_list=tf.train.FloatList(value=list(map(float, values)))),
               "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[item_id]))}  # fmt: skip
    if label is not None:
        feature["labels"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def database(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Clustered 8-d vectors and their int64 ids (shuffled, not in label order)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 3, size=(CLASSES, DIM))
    labels = rng.integers(0, CLASSES, size=n)
    return (centres[labels] + rng.normal(0, 1, size=(n, DIM))).astype(np.float32), np.arange(1000, 1000 + n, dtype=np.int64)


def export_version(base_dir: str, version: int, seed: int) -> str:
    """Export an (untrained, seeded) SCDH model as ``<base_dir>/<version>``; different seeds give
    different codes."""
    import keras
    from tfhash.components.export import export_feature_model

    from tfhash.models import build_scdh, mlp

    keras.utils.set_random_seed(seed)
    model = build_scdh(mlp(DIM, (16,)), CLASSES, BITS)
    model(np.zeros((1, DIM), np.float32))
    path = os.path.join(base_dir, str(version))
    export_feature_model(model, path, RAW_SPEC_NAME, [DIM], BITS, [vector_example(np.zeros(DIM))], model_name="vectors")
    return path


def build_index(model_dir: str, index_base_dir: str, version: int, vectors, ids, kind: str = "BFlat") -> str:
    """Encode ``vectors`` with the SavedModel and save the index as the IndexBuilder does."""
    import tensorflow as tf
    from tfhash.components.export import signature_fingerprint

    from tfhash.index import index_factory

    packed = tf.saved_model.load(model_dir).signatures["encode_features"](features=tf.constant(vectors))["packed_codes"]
    index = index_factory(BITS, kind)
    index.add(packed.numpy(), ids)
    path = os.path.join(index_base_dir, str(version), kind)
    index.save(path, model_version=str(version), signature_fingerprint=signature_fingerprint(model_dir))
    return path


def push_version(base_dir: str, index_base_dir: str, version: int, seed: int, vectors, ids, kind: str = "BFlat"):
    """What the pipeline's Pusher + IndexBuilder leave behind for one version."""
    model_dir = export_version(base_dir, version, seed)
    return model_dir, build_index(model_dir, index_base_dir, version, vectors, ids, kind)
