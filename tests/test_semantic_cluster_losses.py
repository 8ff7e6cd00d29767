"""SCDH / JCCH / MT-SCDH losses against independent NumPy implementations written here."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tfhash import losses
from tfhash.layers import negative_distances


def np_distances(codes, centres):
    return np.sqrt(((codes[:, None, :] - centres[None, :, :]) ** 2).sum(-1))


def np_log_softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def np_scul(labels, distances, lam, q=None, u=None):
    n, c = labels.shape
    lc = -np_log_softmax(-distances)
    out = []
    for i in range(n):
        pos = [s for s in range(c) if labels[i, s] > 0]
        total = 0.0
        for s in pos:
            qi = (1.0 / len(pos)) if q is None else q[i, s]
            ui = 1.0 if u is None else u[i, s]
            total += qi * lc[i, s] + lam * ui * distances[i, s]
        out.append(total)
    return np.mean(out)


def np_quantization(codes, p=3.0):
    k = codes.shape[1]
    qexp = p / (p - 1)
    vals = [1 - np.abs(f).sum() / (k ** (1 / qexp) * (np.abs(f) ** p).sum() ** (1 / p)) for f in codes]
    return np.mean(vals)


def np_classifier(labels, logits):
    lsm = np_log_softmax(logits)
    vals = []
    for i in range(labels.shape[0]):
        pos = np.flatnonzero(labels[i])
        vals.append(-lsm[i, pos].mean() if pos.size else 0.0)
    return np.mean(vals)


@pytest.fixture
def batch():
    rng = np.random.default_rng(0)
    n, c, k = 9, 5, 12
    codes = rng.normal(size=(n, k))
    centres = rng.normal(scale=0.5, size=(c, k))
    labels = (rng.random((n, c)) < 0.35).astype(np.float32)
    labels[0] = 0  # a row without labels
    labels[1] = 0
    labels[1, 2] = 1  # a single-label row
    return codes, centres, labels, rng


def test_negative_distances(batch):
    codes, centres, _, _ = batch
    got = negative_distances(tf.constant(codes, tf.float32), tf.constant(centres, tf.float32)).numpy()
    np.testing.assert_allclose(-got, np_distances(codes, centres), rtol=1e-5)


@pytest.mark.parametrize("with_coefficients", [False, True])
def test_scul_matches_numpy(batch, with_coefficients):
    codes, centres, labels, rng = batch
    distances = np_distances(codes, centres)
    q = u = None
    if with_coefficients:
        q, u = rng.random(labels.shape), rng.random(labels.shape) * 2
    got = losses.semantic_cluster_unary_loss(labels, -distances, 0.3, q, u).numpy()
    assert got == pytest.approx(np_scul(labels, distances, 0.3, q, u), rel=1e-5)


def test_scul_single_label_is_cross_entropy_plus_distance():
    rng = np.random.default_rng(1)
    d = rng.random((4, 3)) * 3
    labels = np.eye(3)[[0, 2, 1, 1]]
    expected = np.mean([-np_log_softmax(-d)[i, s] + 0.01 * d[i, s] for i, s in enumerate([0, 2, 1, 1])])
    assert losses.semantic_cluster_unary_loss(labels, -d, 0.01).numpy() == pytest.approx(expected, rel=1e-5)


def test_quantization_loss_matches_numpy_and_bounds(batch):
    codes, _, _, _ = batch
    assert losses.quantization_loss(codes).numpy() == pytest.approx(np_quantization(codes), rel=1e-5)
    assert losses.quantization_loss(np.array([[2.0, -2.0, 2.0, 2.0]])).numpy() == pytest.approx(0.0, abs=1e-6)
    one_hot = losses.quantization_loss(np.array([[1.0, 0.0, 0.0, 0.0]])).numpy()
    assert one_hot == pytest.approx(1 - 1 / 4 ** (2 / 3), rel=1e-5)
    assert 0.0 <= losses.quantization_loss(np.random.default_rng(2).normal(size=(50, 16))).numpy() <= 1.0
    with pytest.raises(ValueError):
        losses.quantization_loss(codes, p=1.0)


def test_classifier_cross_entropy_multi_label(batch):
    _, _, labels, rng = batch
    logits = rng.normal(size=labels.shape)
    assert losses.classifier_cross_entropy(labels, logits).numpy() == pytest.approx(np_classifier(labels, logits), rel=1e-5)


def test_scdh_total(batch):
    codes, centres, labels, rng = batch
    logits = rng.normal(size=labels.shape)
    d = np_distances(codes, centres)
    parts = losses.scdh_loss(labels, -d, logits, codes, lam=0.005, mu=0.2, alpha=0.05)
    expected = np_scul(labels, d, 0.005) + 0.2 * np_classifier(labels, logits) + 0.05 * np_quantization(codes)
    assert parts["loss"].numpy() == pytest.approx(expected, rel=1e-5)


def test_cross_modal_total(batch):
    codes, centres, labels, rng = batch
    codes2 = rng.normal(size=codes.shape)
    logits1, logits2 = rng.normal(size=labels.shape), rng.normal(size=labels.shape)
    q, u = rng.random(labels.shape), rng.random(labels.shape)
    d1, d2 = np_distances(codes, centres), np_distances(codes2, centres)
    towers = [
        {"codes": codes, "neg_distances": -d1, "logits": logits1},
        {"codes": codes2, "neg_distances": -d2, "logits": logits2},
    ]
    got = losses.cross_modal_loss(labels, towers, lam=0.1, mu=0.2, alpha=0.05, beta=0.5, q=q, u=u)["loss"].numpy()
    cos = (codes * codes2).sum(1) / np.linalg.norm(codes, axis=1) / np.linalg.norm(codes2, axis=1)
    expected = (
        np_scul(labels, d1, 0.1, q, u) + np_scul(labels, d2, 0.1, q, u)
        + 0.2 * (np_classifier(labels, logits1) + np_classifier(labels, logits2))
        + 0.05 * (np_quantization(codes) + np_quantization(codes2))
        + 0.5 * np.mean(1 - cos)
    )  # fmt: skip
    assert got == pytest.approx(expected, rel=1e-5)


def test_mean_teacher_consistency_and_rampup():
    rng = np.random.default_rng(3)
    a, at, e, et = (rng.normal(size=(6, 4)) for _ in range(4))

    def sm(z):
        z = np.exp(z - z.max(1, keepdims=True))
        return z / z.sum(1, keepdims=True)

    expected = np.mean(0.2 * ((sm(a) - sm(at)) ** 2).sum(1) + ((sm(e) - sm(et)) ** 2).sum(1))
    assert losses.mean_teacher_consistency(a, at, e, et, 0.2).numpy() == pytest.approx(expected, rel=1e-5)
    assert losses.sigmoid_rampup(0, 10) == pytest.approx(np.exp(-5))
    assert losses.sigmoid_rampup(5, 10) == pytest.approx(np.exp(-5 * 0.25))
    assert losses.sigmoid_rampup(20, 10) == 1.0


def test_scul_gradient_matches_scdh_eq19():
    """dL/dF_i and dL/dc_s of single-label SCUL, written out as in SCDH Eq. 19:
    dL/dF_i = (1/n) [ (1 + lam) (F_i - c_y) / D_iy - sum_s p_is (F_i - c_s) / D_is ]."""
    rng = np.random.default_rng(4)
    n, c, k, lam = 5, 4, 6, 0.3
    codes, centres = rng.normal(size=(n, k)), rng.normal(size=(c, k))
    y = np.array([0, 1, 3, 3, 2])
    labels = np.eye(c)[y]
    f = tf.Variable(codes)
    cen = tf.Variable(centres)
    with tf.GradientTape() as tape:
        loss = losses.semantic_cluster_unary_loss(labels, negative_distances(f, cen), lam)
    grad_f, grad_c = tape.gradient(loss, [f, cen])
    d = np_distances(codes, centres)
    p = np.exp(-d) / np.exp(-d).sum(1, keepdims=True)
    unit = (codes[:, None, :] - centres[None, :, :]) / d[:, :, None]  # (F_i - c_s) / D_is
    exp_f = ((1 + lam) * unit[np.arange(n), y] - (p[:, :, None] * unit).sum(1)) / n
    exp_c = np.zeros_like(centres)
    for i in range(n):
        for s in range(c):
            exp_c[s] += (p[i, s] - (1 + lam) * (s == y[i])) * unit[i, s] / n
    np.testing.assert_allclose(grad_f.numpy(), exp_f, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grad_c.numpy(), exp_c, rtol=1e-4, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    num_classes=st.integers(2, 5),
    per_class=st.integers(1, 4),
    bits=st.sampled_from([2, 4, 8, 16]),
    scale=st.floats(0.1, 5.0),
)
def test_triplet_loss_is_bounded_by_scul_terms(seed, num_classes, per_class, bits, scale):
    """SCDH Eq. 7: with balanced labels, sum over triplets (i, j, k), y_j = y_i (j = i allowed),
    y_k != y_i, of [1 + ||F_i - F_j|| - ||F_i - F_k||]_+ is at most
    (n/C)^2 (C - 1) sum_i [l_c(i) + 2 D_i,y_i], with the hinge l_c(i) = max_{s != y_i}
    [1 + D_i,y_i - D_i,s]_+ (the bound holds for the summed hinge too, which is larger)."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(num_classes), per_class)
    n = y.size
    codes = rng.normal(scale=scale, size=(n, bits))
    centres = rng.normal(scale=scale, size=(num_classes, bits))
    d = -negative_distances(tf.constant(codes), tf.constant(centres)).numpy()
    pair = np.sqrt(((codes[:, None] - codes[None]) ** 2).sum(-1))
    triplet = 0.0
    for i in range(n):
        for j in np.flatnonzero(y == y[i]):
            for k in np.flatnonzero(y != y[i]):
                triplet += max(0.0, 1.0 + pair[i, j] - pair[i, k])
    hinge = np.array([max(max(0.0, 1 + d[i, y[i]] - d[i, s]) for s in range(num_classes) if s != y[i]) for i in range(n)])
    bound = (n / num_classes) ** 2 * (num_classes - 1) * np.sum(hinge + 2 * d[np.arange(n), y])
    assert triplet <= bound + 1e-6 * max(1.0, bound)


def np_jcch(labels, anchors, rescale=True):
    """JCCH Algorithm 1 with explicit loops (docs/design.md s.4)."""
    y = (labels > 0).astype(int)
    n_all, c = y.shape
    lab = [i for i in range(n_all) if y[i].sum() > 0]
    anchors = [a for a in (range(n_all) if anchors is None else anchors) if y[a].sum() > 0]
    n, l = len(lab), len(anchors)

    def inter(a, b):
        return int((y[a] & y[b]).sum())

    pos_all = {a: sum(1 for j in lab if inter(a, j) > 0) for a in anchors}
    q = np.zeros((n_all, c))
    u = np.zeros((n_all, c))
    for i in lab:
        pos_a = [j for j in anchors if inter(i, j) > 0]
        neg_a = l - len(pos_a)
        for s in range(c):
            if not y[i, s]:
                continue
            q[i, s] = (n / l) ** 2 * neg_a * sum(y[j, s] / inter(i, j) for j in pos_a)
            first = sum((n - pos_all[a]) * y[a, s] / inter(a, i) for a in anchors if inter(a, i) > 0)
            second = sum(pos_all[a] / y[i].sum() for a in anchors if inter(a, i) == 0)
            u[i, s] = (n / l) * (first + second)
    if rescale:
        m = q.sum() / y.sum()
        q, u = q / m, u / m
    return q, u


@pytest.mark.parametrize("anchors", [None, [0, 2, 3, 5, 8, 11]])
def test_jcch_coefficients_match_loops(anchors):
    rng = np.random.default_rng(5)
    labels = (rng.random((14, 4)) < 0.3).astype(np.uint8)
    labels[3] = 0  # unlabelled example (also an anchor in the sampled case)
    labels[4] = [1, 0, 0, 0]
    q, u = losses.jcch_coefficients(labels, anchors)
    eq, eu = np_jcch(labels, anchors)
    np.testing.assert_allclose(q, eq, rtol=1e-10)
    np.testing.assert_allclose(u, eu, rtol=1e-10)
    assert not q[3].any() and not u[3].any()
    # Eq. 14: after rescaling the q mass equals the number of (example, label) pairs.
    assert q.sum() == pytest.approx(labels.sum())


def test_jcch_coefficients_bad_input():
    with pytest.raises(ValueError, match="no labelled anchor"):
        losses.jcch_coefficients(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="multi-hot"):
        losses.jcch_coefficients(np.zeros(4))
    with pytest.raises(ValueError, match="out of range"):
        losses.jcch_coefficients(np.eye(3), anchors=[5])
