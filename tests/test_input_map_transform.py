"""The pipeline's input maps (:mod:`tfhash.components.input_maps`) computed by tf.Transform on Beam
equal the NumPy reference, and a training split they cannot learn from stops the Transform."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tfhash.components.input_maps import input_map_transform
from tfhash.components.label_statistics import anchor_key

from tests.transform_runs import analyze_and_transform, z_scores

D = 4


def _mapped(x: np.ndarray, kind: str, seed: int, num_anchors: int | None = None):
    ids = np.arange(len(x)) * 5 + 1
    spec = {"x": tf.io.FixedLenFeature([D], tf.float32), "id": tf.io.FixedLenFeature([1], tf.int64)}

    def preprocessing_fn(inputs):
        return {"x": input_map_transform(inputs["x"], inputs["id"], kind, seed, "x"), "id": inputs["id"]}

    rows = analyze_and_transform([{"x": row, "id": [int(i)]} for row, i in zip(x, ids, strict=True)], spec, preprocessing_fn)
    return ids, np.array([r["x"] for r in rows])


@pytest.mark.beam
def test_rbf_features_equal_the_numpy_reference_on_the_seeded_anchors(monkeypatch):
    import tfhash.components.input_maps as input_maps

    monkeypatch.setattr(input_maps, "RBF_ANCHORS", 12)  # fewer anchors than the 40 rows: a true draw
    x = np.random.default_rng(0).normal(size=(40, D)).astype(np.float32) * 3 + 1
    ids, mapped = _mapped(x, "rbf", seed=7)
    keys = [anchor_key(i, 7) for i in ids]
    assert keys != [anchor_key(i) for i in ids]  # the seed keys the hash
    anchors = x[np.argsort(keys)[:12]]
    squared = ((x[:, None] - anchors[None]) ** 2).sum(-1)
    sigma = np.sqrt(((anchors[:, None] - anchors[None]) ** 2).sum(-1)).sum() / (12 * 11)
    features = np.exp(-squared / (2 * sigma**2))
    np.testing.assert_allclose(mapped, z_scores(features, features, axis=0), atol=2e-3)


@pytest.mark.beam
def test_standardise_and_the_default_equal_numpy():
    x = np.random.default_rng(1).normal(size=(30, D)).astype(np.float32) * np.array([1, 10, 100, 0.1], np.float32)
    np.testing.assert_allclose(_mapped(x, "standardise", seed=0)[1], z_scores(x, x, axis=0), atol=1e-3)
    np.testing.assert_allclose(_mapped(x, "none", seed=0)[1], z_scores(x, x), atol=1e-3)


@pytest.mark.beam
def test_a_training_split_without_two_distinct_rows_stops_the_rbf_map():
    with pytest.raises(Exception, match="the RBF map of x has no width: the training split needs at least two distinct rows"):
        _mapped(np.ones((6, D), np.float32), "rbf", seed=0)
