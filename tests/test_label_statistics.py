"""JCCH coefficients computed by tf.Transform on Beam equal the NumPy reference."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from apache_beam.options.pipeline_options import PipelineOptions
from tfhash.components.label_statistics import anchor_key, jcch_coefficient_features

from tests.transform_runs import analyze_and_transform
from tfhash.losses import jcch_coefficients

C = 5


def _run(labels: np.ndarray, num_anchors: int):
    ids = np.arange(labels.shape[0]) * 7 + 3
    data = [{"labels": row.astype(np.float32), "id": [int(i)]} for row, i in zip(labels, ids, strict=True)]
    spec = {"labels": tf.io.FixedLenFeature([C], tf.float32), "id": tf.io.FixedLenFeature([1], tf.int64)}

    def preprocessing_fn(inputs):
        q, u = jcch_coefficient_features(inputs["labels"], inputs["id"], num_anchors)
        return {"q": q, "u": u, "id": inputs["id"]}

    rows = analyze_and_transform(data, spec, preprocessing_fn)
    return ids, np.array([r["q"] for r in rows]), np.array([r["u"] for r in rows])


@pytest.mark.beam
def test_transform_coefficients_equal_numpy_reference_all_anchors():
    rng = np.random.default_rng(0)
    labels = (rng.random((60, C)) < 0.35).astype(np.float32)
    labels[[4, 17]] = 0  # unlabelled examples: zero coefficients, excluded from every count
    _, q, u = _run(labels, num_anchors=100)
    expected_q, expected_u = jcch_coefficients(labels)
    np.testing.assert_allclose(q, expected_q, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(u, expected_u, rtol=1e-4, atol=1e-5)


@pytest.mark.beam
def test_transform_coefficients_with_sampled_anchors():
    rng = np.random.default_rng(1)
    labels = (rng.random((80, C)) < 0.35).astype(np.float32)
    labels[labels.sum(1) == 0, 0] = 1
    ids, q, u = _run(labels, num_anchors=20)
    order = np.argsort([anchor_key(i) for i in ids])[:20]  # the same anchors, chosen here independently
    expected_q, expected_u = jcch_coefficients(labels, anchors=order)
    np.testing.assert_allclose(q, expected_q, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(u, expected_u, rtol=1e-4, atol=1e-5)
    full_q, _ = jcch_coefficients(labels)
    error = np.abs(q - full_q).sum() / np.abs(full_q).sum()
    print(f"relative L1 error of q with 20 of 80 anchors: {error:.3f}")
    assert error < 0.5  # an approximation, not the exact values


@pytest.mark.beam
def test_transform_tag_statistics_equal_numpy_counts(tmp_path):
    from tfhash.components.label_statistics import tag_statistic_vocabularies
    from tfhash.components.trainer import read_transform_tag_statistics

    rng = np.random.default_rng(1)
    labels = (rng.random((50, C)) < 0.4).astype(np.float32)
    labels[3] = 0  # an example without labels counts as an example, with no tags
    metadata = tft.DatasetMetadata.from_feature_spec({"labels": tf.io.FixedLenFeature([C], tf.float32)})

    def preprocessing_fn(inputs):
        tag_statistic_vocabularies(inputs["labels"])
        return {"labels": inputs["labels"]}

    options = PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory", "--direct_num_workers=1"])
    with beam.Pipeline(options=options) as pipeline, tft_beam.Context(temp_dir=str(tmp_path / "tmp")):
        raw = pipeline | beam.Create([{"labels": row} for row in labels])
        transform_fn = (raw, metadata) | tft_beam.AnalyzeDataset(preprocessing_fn)
        _ = transform_fn | tft_beam.WriteTransformFn(str(tmp_path / "transform"))
    statistics = read_transform_tag_statistics(tft.TFTransformOutput(str(tmp_path / "transform")), C)
    assert statistics.count == 50
    np.testing.assert_array_equal(statistics.cooccurrence, labels.T @ labels)


def test_pipeline_shclm_assigns_proxies_by_tag_cooccurrence():
    from tfhash.proxies import hclm_proxies, tag_cooccurrence_similarity
    from tfhash.registry import TagStatistics, build_model
    from tfhash.training_spec import TrainingSpec

    rng = np.random.default_rng(2)
    tags = (rng.random((200, 6)) < 0.3).astype(np.float64)
    training = TrainingSpec(method="shclm", bits=16, backbone="mlp", hidden=[8], seed=0)
    model = build_model(training, {"x": [4]}, 6, statistics=TagStatistics(200, tags.T @ tags))
    expected = hclm_proxies(6, 16, similarity=tag_cooccurrence_similarity(tags), seed=0)
    np.testing.assert_array_equal(np.asarray(model.proxy_layer.proxies), expected)
    single = np.eye(6)[rng.integers(0, 6, 200)]
    with pytest.raises(ValueError, match="single-label"):
        build_model(training, {"x": [4]}, 6, statistics=TagStatistics(200, single.T @ single))
    with pytest.raises(ValueError, match="tag statistics"):
        build_model(training, {"x": [4]}, 6)
