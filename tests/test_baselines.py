"""The two baselines of the evidence report: DPSH-style pairwise likelihood and CNNBH-style codes."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tfhash import losses
from tfhash.models import PairwiseHashModel, build_pairwise, build_softmax_codes, mlp


def np_dpsh(codes, other, labels, other_labels, eta):
    theta = 0.5 * codes @ other.T
    similar = (labels @ other_labels.T > 0).astype(float)
    likelihood = np.mean(np.log1p(np.exp(theta)) - similar * theta)
    signs = np.where(codes >= 0, 1.0, -1.0)
    return likelihood + eta * np.mean(np.sum((codes - signs) ** 2, axis=1))


def test_pairwise_loss_matches_numpy():
    rng = np.random.default_rng(0)
    codes, other = rng.normal(size=(6, 8)), rng.normal(size=(9, 8))
    labels = (rng.random((6, 4)) < 0.4).astype("float32")
    other_labels = (rng.random((9, 4)) < 0.4).astype("float32")
    similarity = losses.pairwise_similarity(labels, other_labels)
    np.testing.assert_array_equal(similarity.numpy(), (labels @ other_labels.T > 0).astype("float32"))
    value = losses.pairwise_likelihood_loss(codes, other, similarity, eta=0.3).numpy()
    assert value == pytest.approx(np_dpsh(codes, other, labels, other_labels, 0.3), rel=1e-5)


def test_pairwise_loss_on_scaled_cosines_matches_numpy_and_ignores_the_norm():
    rng = np.random.default_rng(1)
    codes, other = rng.normal(size=(6, 8)), rng.normal(size=(9, 8))
    labels = (rng.random((6, 4)) < 0.4).astype("float32")
    labels[:, 0] = 1.0  # the wrapper refuses rows without a label
    other_labels = (rng.random((9, 4)) < 0.4).astype("float32")
    similarity = losses.pairwise_similarity(labels, other_labels)
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    theta = 3.0 * unit(codes) @ unit(other).T
    expected = np.mean(np.log1p(np.exp(theta)) - similarity.numpy() * theta, axis=1)
    value = losses.pairwise_likelihood_per_example(codes, other, similarity, eta=0.0, cosine_scale=3.0).numpy()
    np.testing.assert_allclose(value, expected, rtol=1e-5)
    scaled = losses.pairwise_likelihood_per_example(5.0 * codes, other, similarity, eta=0.0, cosine_scale=3.0).numpy()
    np.testing.assert_allclose(scaled, expected, rtol=1e-5)
    loss = losses.PairwiseLikelihoodLoss(eta=0.0, cosine_scale=3.0)
    assert keras.losses.deserialize(keras.losses.serialize(loss)).cosine_scale == 3.0
    with pytest.raises(ValueError, match="cosine_scale must be None"):
        losses.PairwiseLikelihoodLoss(cosine_scale=0.0)
    assert float(loss(labels, codes)) == pytest.approx(float(np.mean(
        losses.pairwise_likelihood_per_example(codes, codes, losses.pairwise_similarity(labels, labels), 0.0,
                                               cosine_scale=3.0))), rel=1e-5)  # fmt: skip


def clustered(n=600, classes=4, dim=12, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, classes, n)
    x = rng.normal(size=(n, dim)) + 3.0 * rng.normal(size=(classes, dim))[ids]
    return x.astype("float32"), np.eye(classes, dtype="float32")[ids], ids


def test_pairwise_model_fills_its_memory_learns_and_round_trips(tmp_path):
    from tfhash.metrics import evaluate_retrieval

    x, y, ids = clustered()
    keras.utils.set_random_seed(0)
    model = build_pairwise(mlp(12, (32,)), 4, 16, num_train=len(x))
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    model.fit(x, {"labels": y, "index": np.arange(len(x))}, epochs=4, batch_size=64, verbose=0)
    # every training row was visited: its labels are in the memory, its code row is non-zero
    np.testing.assert_array_equal(model.label_memory.numpy(), y)
    assert np.all(np.abs(model.code_memory.numpy()).sum(axis=1) > 0)
    codes = model.encode(x)
    assert evaluate_retrieval(codes[:100], codes, ids[:100], ids).mean_average_precision() > 0.9
    path = tmp_path / "pairwise.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    assert isinstance(restored, PairwiseHashModel) and restored.num_train == len(x)
    np.testing.assert_array_equal(restored.encode(x), codes)


def test_pairwise_model_refuses_targets_without_rows_and_rows_out_of_range():
    x, y, _ = clustered(n=64)
    model = build_pairwise(mlp(12, (8,)), 4, 8, num_train=len(x))
    model.compile(optimizer="adam")
    with pytest.raises(ValueError, match="'index'"):
        model.fit(x, y, epochs=1, verbose=0)
    for rows in (np.arange(len(x)) + 10, np.arange(len(x)) - 1, np.arange(len(x)) + 0.5):
        with pytest.raises(ValueError, match="integer row in"):
            model.fit(x, {"labels": y, "index": rows}, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="num_train"):
        build_pairwise(mlp(12, (8,)), 4, 8, num_train=0)


def test_softmax_codes_baseline_learns_its_classifier():
    x, y, ids = clustered()
    keras.utils.set_random_seed(0)
    model = build_softmax_codes(mlp(12, (32,)), 4, 16, seed=0)
    before = model.proxy_layer.get_config()["proxies"]
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    model.fit(x, y, epochs=3, batch_size=64, verbose=0)
    after = np.asarray(model.proxy_layer.proxies)
    assert not np.allclose(np.asarray(before, dtype="float32"), after)
    assert set(np.unique(model.encode(x))) <= {-1, 1}
