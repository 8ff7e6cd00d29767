"""HCLM / sHCLM / HyP2: losses against NumPy written here, proxy construction, models."""

from __future__ import annotations

import csv
import math

import keras
import numpy as np
import pytest

from tfhash import losses, proxies
from tfhash.data import find_data_file
from tfhash.layers import FixedProxies, LearnableProxies
from tfhash.models import build_hclm, build_hyp2, mlp


def np_cos(a, b):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return a @ b.T


def np_hyp2(labels, codes, prox, zeta, beta, least=2):
    cos = np_cos(codes, prox)
    pos = [(1 - cos[i, j]) for i in range(len(labels)) for j in range(labels.shape[1]) if labels[i, j]]
    neg = [max(0.0, cos[i, j] - zeta) for i in range(len(labels)) for j in range(labels.shape[1]) if not labels[i, j]]
    proxy = (sum(pos) / len(pos) if pos else 0.0) + (sum(neg) / len(neg) if neg else 0.0)
    cc = np_cos(codes, codes)
    pair_values = [
        max(0.0, cc[i, j] - zeta)
        for i in range(len(labels)) for j in range(len(labels))
        if i != j and labels[i].sum() >= least and labels[j].sum() >= least and not (labels[i] * labels[j]).any()
    ]  # fmt: skip
    pair = sum(pair_values) / len(pair_values) if pair_values else 0.0
    return proxy + beta * pair, len(pair_values)


def test_hyp2_loss_matches_numpy_with_pairs_and_all_negative_rows():
    rng = np.random.default_rng(0)
    labels = np.array([[1, 1, 0, 0, 0], [0, 0, 1, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 1, 1, 0, 1]], dtype=np.float32)
    codes, prox = rng.normal(size=(5, 8)), rng.normal(size=(5, 8))
    expected, pairs = np_hyp2(labels, codes, prox, 0.1, 0.7)
    assert pairs > 0  # rows 0 and 1 form irrelevant multi-label pairs
    assert float(losses.hyp2_loss(labels, codes, prox, 0.1, 0.7)) == pytest.approx(expected, rel=1e-5)
    expected_labelled, more = np_hyp2(labels, codes, prox, 0.1, 0.7, least=1)
    assert more > pairs  # row 2 (one label) joins; row 3 (none) never does
    assert float(losses.hyp2_loss(labels, codes, prox, 0.1, 0.7, "labelled")) == pytest.approx(expected_labelled, rel=1e-5)
    with pytest.raises(ValueError, match="unknown pair_scope 'all'"):
        losses.hyp2_loss(labels, codes, prox, 0.1, 0.7, "all")


def test_hyp2_pair_term_is_zero_without_irrelevant_multilabel_pairs():
    rng = np.random.default_rng(1)
    labels = np.array([[1, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=np.float32)  # every multi-label pair overlaps
    codes, prox = rng.normal(size=(3, 8)), rng.normal(size=(3, 8))
    expected, pairs = np_hyp2(labels, codes, prox, 0.0, 0.5)
    assert pairs == 0
    with_pairs = float(losses.hyp2_loss(labels, codes, prox, 0.0, beta=0.5))
    assert with_pairs == pytest.approx(expected, rel=1e-5)
    assert with_pairs == pytest.approx(float(losses.hyp2_loss(labels, codes, prox, 0.0, beta=0.0)), rel=1e-6)


def test_hyp2_zeta_reads_the_code_table():
    table = {}
    with open(find_data_file("codetables/binary_code_min_distance.csv"), newline="") as handle:
        for row in csv.DictReader(handle):
            table[(int(row["code_length"]), int(row["log2_codewords"]))] = float(row["zeta"])
    for num_classes, bits in [(24, 48), (10, 64), (21, 32), (80, 16), (1000, 128), (2, 12)]:
        assert losses.hyp2_zeta(num_classes, bits) == pytest.approx(table[(bits, math.ceil(math.log2(num_classes)))])
    with pytest.raises(ValueError, match="no entry"):
        losses.hyp2_zeta(10, 300)


def test_balanced_bce_matches_numpy():
    rng = np.random.default_rng(2)
    labels = (rng.random((6, 4)) < 0.4).astype(np.float32)
    logits = rng.normal(size=(6, 4)) * 3
    freq = np.array([0.1, 0.5, 0.3, 0.05])
    s = 1 / (1 + np.exp(-logits))
    c = 1 - freq
    expected = np.mean(-(c * labels * np.log(s) + (1 - c) * (1 - labels) * np.log(1 - s)))
    assert float(losses.balanced_binary_cross_entropy(labels, logits, freq)) == pytest.approx(expected, rel=1e-5)


def test_hamming_triplet_matches_loops():
    rng = np.random.default_rng(3)
    labels = np.eye(3, dtype=np.float32)[[0, 0, 1, 2, 1]]
    nu = np.tanh(rng.normal(size=(5, 8)))
    d = (8 - nu @ nu.T) / 2
    values = [
        np.log1p(np.exp(2.0 + d[a, p] - d[a, n]))
        for a in range(5) for p in range(5) for n in range(5)
        if p != a and (labels[a] * labels[p]).sum() > 0 and (labels[a] * labels[n]).sum() == 0
    ]  # fmt: skip
    assert float(losses.hamming_triplet_loss(labels, nu, 2.0)) == pytest.approx(np.mean(values), rel=1e-5)
    one_class = np.ones((4, 1), dtype=np.float32)  # no negatives: no triplet
    assert float(losses.hamming_triplet_loss(one_class, nu[:4], 2.0)) == 0.0


@pytest.mark.parametrize("num_classes, bits", [(10, 32), (21, 32), (38, 48), (100, 16)])
def test_hclm_proxies_beat_random_and_match_hadamard(num_classes, bits):
    codes = proxies.hclm_proxies(num_classes, bits, seed=0, restarts=1)
    assert codes.shape == (num_classes, bits) and codes.dtype == np.int8 and set(np.unique(codes)) == {-1, 1}
    quality = proxies.code_quality(codes)
    rng = np.random.default_rng(0)
    random_min = proxies.code_quality(rng.choice(np.array([-1, 1], np.int8), size=(num_classes, bits)))["min_distance"]
    assert quality["min_distance"] > random_min
    hadamard = proxies.hadamard_codes(num_classes, bits)
    if hadamard is not None:
        assert quality["min_distance"] >= proxies.code_quality(hadamard)["min_distance"] == bits // 2
    assert quality["min_distance"] >= 0.75 * losses.best_known_min_distance(num_classes, bits)
    np.testing.assert_array_equal(codes, proxies.hclm_proxies(num_classes, bits, seed=0, restarts=1))


def test_itq_and_local_search_improve():
    rng = np.random.default_rng(4)
    points = proxies.tammes_points(30, 16, rng, steps=50)
    rotation = proxies.itq_rotation(points, rng)
    np.testing.assert_allclose(rotation @ rotation.T, np.eye(16), atol=1e-8)

    def quantization_error(r):
        p = points @ r
        return np.sum((np.sign(p) - p) ** 2)

    assert quantization_error(rotation) < quantization_error(np.eye(16))
    start = rng.choice(np.array([-1, 1], np.int8), size=(30, 16))
    improved = proxies.improve_min_distance(start, rng)
    before, after = proxies.code_quality(start), proxies.code_quality(improved)
    assert (after["min_distance"], -after["pairs_at_min"]) > (before["min_distance"], -before["pairs_at_min"])


def test_assignment_swaps_lower_the_cost_and_group_similar_classes():
    rng = np.random.default_rng(5)
    codes = proxies.hclm_proxies(8, 16, seed=1, restarts=1)
    # classes {0,1,2,3} and {4,5,6,7} are similar within each group
    similarity = np.kron(np.eye(2), np.ones((4, 4))) + 0.01 * rng.random((8, 8))
    similarity = (similarity + similarity.T) / 2
    order = rng.permutation(8)
    shuffled = codes[order]
    perm = proxies.assign_proxies(shuffled, similarity)
    assert sorted(perm) == list(range(8))
    assert proxies.assignment_cost(shuffled[perm], similarity) <= proxies.assignment_cost(shuffled, similarity) + 1e-9
    # no single swap lowers the cost any further (checked directly)
    best = proxies.assignment_cost(shuffled[perm], similarity)
    for a in range(8):
        for b in range(a + 1, 8):
            swapped = perm.copy()
            swapped[[a, b]] = swapped[[b, a]]
            assert proxies.assignment_cost(shuffled[swapped], similarity) >= best - 1e-9
    with pytest.raises(ValueError, match="similarity must be"):
        proxies.assign_proxies(codes, np.ones((3, 3)))


def test_similarity_helpers_match_loops():
    rng = np.random.default_rng(6)
    features, labels = rng.normal(size=(40, 5)), rng.integers(0, 4, 40)
    means = np.array([features[labels == c].mean(0) for c in range(4)])
    dist = [[np.sum((means[i] - means[j]) ** 2) for j in range(4)] for i in range(4)]
    kappa = np.mean([np.sqrt(dist[i][j]) for i in range(4) for j in range(i + 1, 4)])
    expected = np.exp(-np.array(dist) / (2 * kappa**2))
    np.testing.assert_allclose(proxies.class_mean_similarity(features, labels), expected)
    tags = (rng.random((30, 5)) < 0.4).astype(int)
    expected_tags = [[2 * np.sum(tags[:, i] * tags[:, j]) / (tags[:, i].sum() + tags[:, j].sum()) for j in range(5)] for i in range(5)]
    np.testing.assert_allclose(proxies.tag_cooccurrence_similarity(tags), expected_tags)


def _toy(seed=0, n=200, classes=4, dim=16):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = (rng.normal(scale=3.0, size=(classes, dim))[y] + rng.normal(size=(n, dim))).astype("float32")
    return x, np.eye(classes, dtype="float32")[y], y


def test_proxy_layers():
    codes = proxies.hclm_proxies(4, 16, seed=0, restarts=1)
    layer = FixedProxies(codes)
    assert not layer.trainable_weights
    clone = FixedProxies.from_config(layer.get_config())
    np.testing.assert_array_equal(clone.proxies.numpy(), codes)
    with pytest.raises(ValueError, match="finite"):
        FixedProxies(np.full((2, 8), np.nan))
    learned = FixedProxies(codes, learn=True)
    assert len(learned.trainable_weights) == 1 and FixedProxies.from_config(learned.get_config()).learn
    learn = LearnableProxies(500, 64)
    assert np.std(learn.proxies.numpy()) == pytest.approx(np.sqrt(2 / 500), rel=0.05)


@pytest.mark.parametrize("triplet_weight", [0.0, 1.0])
def test_hclm_model_trains_and_round_trips(tmp_path, triplet_weight):
    keras.utils.set_random_seed(0)
    x, labels, y = _toy()
    model = build_hclm(mlp(16, (32,)), 4, 16, seed=0, triplet_weight=triplet_weight)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit(x, labels, epochs=10, batch_size=32, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    from tfhash.metrics import mean_average_precision

    codes = model.encode(x)
    assert mean_average_precision(codes, codes, y, y) > 0.9
    model.save(tmp_path / "hclm.keras")
    restored = keras.saving.load_model(tmp_path / "hclm.keras")
    np.testing.assert_array_equal(restored.encode(x), codes)


def _multi_label_toy() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x, _, _ = _toy(n=160, classes=6)
    labels = (rng.random((160, 6)) < 0.3).astype("float32")
    labels[labels.sum(1) == 0, 0] = 1
    return (x + labels @ rng.normal(scale=2.0, size=(6, 16))).astype("float32"), labels


def test_shclm_multilabel_and_hyp2_train(tmp_path):
    keras.utils.set_random_seed(1)
    x, labels = _multi_label_toy()
    similarity = proxies.tag_cooccurrence_similarity(labels)
    shclm = build_hclm(mlp(16, (32,)), 6, 16, similarity=similarity, tag_frequencies=labels.mean(0))
    shclm.compile(optimizer=keras.optimizers.Adam(1e-2))
    first = shclm.fit(x, labels, epochs=5, batch_size=32, verbose=0).history["loss"]
    assert first[-1] < first[0]
    hyp2 = build_hyp2(mlp(16, (32,)), 6, 16)
    assert hyp2.zeta == pytest.approx(losses.hyp2_zeta(6, 16))
    hyp2.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = hyp2.fit(x, labels, epochs=5, batch_size=32, verbose=0).history["loss"]
    assert history[-1] < history[0]
    hyp2.save(tmp_path / "hyp2.keras")
    np.testing.assert_array_equal(keras.saving.load_model(tmp_path / "hyp2.keras").encode(x), hyp2.encode(x))


@pytest.mark.parametrize("method", ["shclm", "hyp2"])
def test_a_model_with_the_pairwise_term_trains_and_round_trips(tmp_path, method):
    keras.utils.set_random_seed(1)
    x, labels = _multi_label_toy()
    if method == "shclm":
        paired = build_hclm(mlp(16, (32,)), 6, 16, similarity=proxies.tag_cooccurrence_similarity(labels), tag_frequencies=labels.mean(0),
                            triplet_weight=1.0, pairwise_weight=1.0, pairwise_scale=3.0)  # fmt: skip
    else:
        paired = build_hyp2(mlp(16, (32,)), 6, 16, pairwise_weight=1.0, pairwise_scale=3.0)
    paired.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = paired.fit(x, labels, epochs=5, batch_size=32, verbose=0).history["loss"]
    assert history[-1] < history[0]
    paired.save(tmp_path / "paired.keras")
    restored = keras.saving.load_model(tmp_path / "paired.keras")
    assert (restored.pairwise_weight, restored.pairwise_scale) == (1.0, 3.0)
    np.testing.assert_array_equal(restored.encode(x), paired.encode(x))


def _hclm(**settings):  # with the triplet term: the pairwise term adds to both of HCLM's
    return build_hclm(mlp(4, (8,)), 6, 16, seed=0, triplet_weight=1.0, **settings)


def _hyp2(**settings):
    return build_hyp2(mlp(4, (8,)), 6, 16, **settings)


@pytest.mark.parametrize("build", [_hclm, _hyp2])
@pytest.mark.parametrize("settings", [{"pairwise_weight": -1.0}, {"pairwise_weight": float("nan")}, {"pairwise_weight": "lots"},
                                      {"pairwise_scale": 0.0}, {"pairwise_scale": float("inf")}])  # fmt: skip
def test_a_bad_pairwise_setting_is_refused(build, settings):
    with pytest.raises(ValueError, match=next(iter(settings))):
        build(**settings)


@pytest.mark.parametrize("build", [_hclm, _hyp2])
def test_the_pairwise_term_adds_the_scaled_cosine_likelihood(build):
    rng = np.random.default_rng(2)
    codes = np.tanh(rng.normal(size=(8, 16))).astype("float32")
    if build is _hclm:  # single-label: softmax over the proxies
        labels = np.eye(6, dtype="float32")[rng.integers(0, 6, size=8)]
    else:
        labels = (rng.random((8, 6)) < 0.4).astype("float32")
    plain, paired = build(), build(pairwise_weight=0.5, pairwise_scale=2.0)
    for model in (plain, paired):
        model(np.zeros((1, 4), "float32"))
    plain.proxy_layer.set_weights(paired.proxy_layer.get_weights())
    y_pred = {"codes": codes, "logits": paired.proxy_layer(codes)}  # HyP2 reads the codes only
    term = losses.pairwise_likelihood_per_example(codes, codes, losses.pairwise_similarity(labels, labels), 0.0, cosine_scale=2.0)
    np.testing.assert_allclose(losses.in_batch_pairwise_per_example(codes, labels, 2.0), term, rtol=1e-6)
    expected = float(plain.compute_loss(y=labels, y_pred=y_pred)) + 0.5 * float(np.mean(term))
    assert float(paired.compute_loss(y=labels, y_pred=y_pred)) == pytest.approx(expected, rel=1e-5)

