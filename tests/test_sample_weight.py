"""``fit(..., sample_weight=w)`` reaches the loss of every tfhash model, under Keras's
``"sum_over_batch_size"`` contract (sum_i w_i L_i / n), and the Keras loss wrappers."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tfhash import losses
from tfhash.models import (
    build_hclm,
    build_hyp2,
    build_jcch,
    build_mt_scdh,
    build_pairwise,
    build_scdh,
    build_softmax_codes,
    mlp,
)

N, DIM, BITS, BATCH = 16, 6, 8, 8
#: Rows 0, 2, 4, ... are kept; the others get weight 0. Each batch of 8 holds 4 kept rows.
KEPT = np.arange(0, N, 2)


def _backbone(dim=DIM):
    return mlp(dim, (8,), dropout=0.0)


def _single_label(classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return np.eye(classes, dtype="float32")[rng.integers(0, classes, N)]


def _multi_label(seed=0):
    """Four tags; rows of two tags, some pairs disjoint (HyP2's pairs), a few of one tag."""
    rng = np.random.default_rng(seed)
    pool = np.array([[1, 1, 0, 0], [0, 0, 1, 1], [1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 0, 0], [0, 0, 0, 1]], "float32")
    return pool[rng.integers(0, len(pool), N)]


def _x(seed=0, dim=DIM):
    return np.random.default_rng(seed + 100).normal(size=(N, dim)).astype("float32")


def model_case(name):
    """(build: () -> model, x, y) of one model class / loss configuration."""
    x = _x()
    if name == "scdh":
        return lambda: build_scdh(_backbone(), 3, BITS), x, _single_label()
    if name == "scdh-multi-label-jcch":
        labels = _multi_label()
        q, u = losses.jcch_coefficients(labels)
        y = {"labels": labels, "q": q.astype("float32"), "u": u.astype("float32")}
        return lambda: build_scdh(_backbone(), 4, BITS, preset="nuswide"), x, y
    if name == "mt-scdh":
        labels = _single_label()
        labels[np.arange(N) % 4 >= 2] = 0.0  # every batch, kept or not, has labelled and unlabelled rows
        return (lambda: build_mt_scdh(_backbone, 3, BITS, sample_input=x[:2], rampup_steps=2, ema_decay=0.5,
                                      consistency=5.0)), x, labels  # fmt: skip
    if name == "jcch":
        inputs = {"image": x, "text": _x(1, dim=4)}
        return lambda: build_jcch({"image": _backbone(), "text": _backbone(4)}, 3, BITS, beta=0.5), inputs, _single_label()
    if name == "hclm-triplet":
        return lambda: build_hclm(_backbone(), 3, BITS, triplet_weight=1.0, margin=1.0), x, _single_label()
    if name == "shclm-balanced-bce":
        labels = _multi_label()
        return (lambda: build_hclm(_backbone(), 4, BITS, similarity=np.eye(4), tag_frequencies=labels.mean(axis=0),
                                   triplet_weight=0.5, margin=1.0)), x, labels  # fmt: skip
    if name == "hclm-pairwise":
        return lambda: build_hclm(_backbone(), 3, BITS, triplet_weight=1.0, margin=1.0, pairwise_weight=1.0), x, _single_label()
    if name == "cnnbh":
        return lambda: build_softmax_codes(_backbone(), 3, BITS), x, _single_label()
    if name == "hyp2":
        return lambda: build_hyp2(_backbone(), 4, BITS, beta=1.0), x, _multi_label()
    if name == "hyp2-pairwise":
        return lambda: build_hyp2(_backbone(), 4, BITS, beta=1.0, pairwise_weight=1.0, pairwise_scale=3.0), x, _multi_label()
    if name == "dpsh":
        y = {"labels": _single_label(), "index": np.arange(N)}
        return lambda: build_pairwise(_backbone(), 3, BITS, num_train=N), x, y
    raise KeyError(name)


MODEL_CASES = ["scdh", "scdh-multi-label-jcch", "mt-scdh", "jcch", "hclm-triplet", "hclm-pairwise", "shclm-balanced-bce", "cnnbh", "hyp2", "hyp2-pairwise", "dpsh"]


def _rows(tree, rows):
    return keras.tree.map_structure(lambda a: np.asarray(a)[rows], tree)


def _built(build, x):
    keras.utils.set_random_seed(0)
    model = build()
    model(_rows(x, slice(0, 2)))
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    return model


def _trained(build, x, y, batch_size=BATCH, **fit_kwargs):
    model = _built(build, x)
    history = model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0, **fit_kwargs)
    return model, history.history["loss"][-1]


def _assert_same_training(a, b):
    (model_a, loss_a), (model_b, loss_b) = a, b
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    for wa, wb in zip(model_a.get_weights(), model_b.get_weights(), strict=True):
        np.testing.assert_allclose(wa, wb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", MODEL_CASES)
def test_fit_sample_weight(name):
    build, x, y = model_case(name)
    start = _built(build, x).get_weights()
    # Zero weight on every other row and 2 on the rest (sum_i w_i L_i / n with n = 8 is the mean
    # over the 4 kept rows): the same training as on the kept rows alone, 4 per batch.
    weights = np.zeros(N, "float32")
    weights[KEPT] = 2.0
    weighted = _trained(build, x, y, sample_weight=weights)
    _assert_same_training(weighted, _trained(build, _rows(x, KEPT), _rows(y, KEPT), batch_size=BATCH // 2))
    assert any(not np.allclose(a, b) for a, b in zip(start, weighted[0].get_weights(), strict=True))
    # Weights of all ones are no weights; other weights change training.
    plain = _trained(build, x, y)
    _assert_same_training(_trained(build, x, y, sample_weight=np.ones(N, "float32")), plain)
    ramp = np.linspace(0.1, 2.0, N).astype("float32")
    assert _trained(build, x, y, sample_weight=ramp)[1] != pytest.approx(plain[1], rel=1e-4)


@pytest.mark.parametrize("name", MODEL_CASES)
def test_compute_loss_weights_rows_as_keras_does(name):
    """With weights 0/1, the loss is (kept rows / n) times the loss of the kept rows alone (the
    batch size stays the divisor); a weight column ``(n, 1)`` is the same as ``(n,)``."""
    build, x, y = model_case(name)
    model = _built(build, x)
    weights = np.zeros(N, "float32")
    weights[KEPT] = 1.0
    y_pred = model(x, training=True)
    weighted = float(model.compute_loss(x, y, y_pred, sample_weight=weights))
    column = float(model.compute_loss(x, y, y_pred, sample_weight=weights[:, None]))
    kept = float(model.compute_loss(_rows(x, KEPT), _rows(y, KEPT), _rows(y_pred, KEPT)))
    assert weighted == pytest.approx(kept * len(KEPT) / N, rel=1e-5)
    assert column == pytest.approx(weighted, rel=1e-6)


def _wrapper_cases():
    rng = np.random.default_rng(3)
    labels = _multi_label()
    codes = rng.normal(size=(N, BITS)).astype("float32")
    other = rng.normal(size=(N, BITS)).astype("float32")
    logits = rng.normal(size=(N, 4)).astype("float32")
    cosines = np.tanh(logits)
    freq = labels.mean(axis=0)
    q, u = (c.astype("float32") for c in losses.jcch_coefficients(labels))
    similarity = losses.pairwise_similarity(labels, labels)
    return [
        # wrapper, y_true, y_pred, the functional scalar with sample_weight
        (losses.SemanticClusterUnaryLoss(lam=0.1), np.concatenate([labels, q, u], 1), -np.abs(logits),
         lambda w: losses.semantic_cluster_unary_loss(labels, -np.abs(logits), 0.1, q, u, sample_weight=w)),
        (losses.QuantizationLoss(p=4.0), labels, codes, lambda w: losses.quantization_loss(codes, 4.0, sample_weight=w)),
        (losses.ClassifierCrossEntropy(), labels, logits, lambda w: losses.classifier_cross_entropy(labels, logits, sample_weight=w)),
        (losses.SoftmaxSquaredDistance(), other, codes,
         lambda w: losses.reduce_per_example(losses.softmax_squared_distance(codes, other), w)),
        (losses.CodeAlignmentLoss(), other, codes, lambda w: losses.alignment_loss(codes, other, sample_weight=w)),
        (losses.BalancedBinaryCrossEntropy(freq), labels, logits,
         lambda w: losses.balanced_binary_cross_entropy(labels, logits, freq, sample_weight=w)),
        (losses.HammingTripletLoss(margin=2.0), labels, np.tanh(codes),
         lambda w: losses.hamming_triplet_loss(labels, np.tanh(codes), 2.0, sample_weight=w)),
        (losses.HyP2ProxyLoss(zeta=0.2), labels, cosines,
         lambda w: losses.reduce_per_example(losses.hyp2_proxy_per_example(labels, cosines, 0.2, losses.rows_taking_part(w)), w)),
        (losses.HyP2PairLoss(zeta=0.2, pair_scope="labelled"), labels, codes,
         lambda w: losses.reduce_per_example(
             losses.hyp2_pair_per_example(labels, codes, 0.2, "labelled", losses.rows_taking_part(w)), w)),
        (losses.PairwiseLikelihoodLoss(eta=0.1), labels, codes,
         lambda w: losses.pairwise_likelihood_loss(codes, codes, similarity, 0.1, sample_weight=w)),
    ]  # fmt: skip


@pytest.mark.parametrize("index", range(len(_wrapper_cases())))
def test_keras_loss_wrappers(index):
    """Every wrapper round-trips its config, equals its function with and without weights, and
    leaves rows of weight zero out: weights 0/2 give the loss of the kept rows."""
    wrapper, y_true, y_pred, function = _wrapper_cases()[index]
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(wrapper))
    assert type(clone) is type(wrapper) and clone.get_config() == wrapper.get_config()
    assert float(wrapper(y_true, y_pred)) == pytest.approx(float(function(None)), rel=1e-5)
    ramp = np.linspace(0.1, 2.0, N).astype("float32")
    assert float(wrapper(y_true, y_pred, sample_weight=ramp)) == pytest.approx(float(function(ramp)), rel=1e-5)
    weights = np.zeros(N, "float32")
    weights[KEPT] = 2.0
    if isinstance(wrapper, losses.PairwiseLikelihoodLoss):
        return  # the function pairs with the whole batch (the model's memory); the wrapper with the kept rows
    kept = float(clone(y_true[KEPT], y_pred[KEPT]))
    assert float(wrapper(y_true, y_pred, sample_weight=weights)) == pytest.approx(kept, rel=1e-5)


def test_in_batch_pairwise_wrapper_leaves_zero_weight_rows_out():
    rng = np.random.default_rng(4)
    labels, codes = _single_label(), rng.normal(size=(N, BITS)).astype("float32")
    weights = np.zeros(N, "float32")
    weights[KEPT] = 2.0
    loss = losses.PairwiseLikelihoodLoss(eta=0.1)
    assert float(loss(labels, codes, sample_weight=weights)) == pytest.approx(float(loss(labels[KEPT], codes[KEPT])), rel=1e-5)


_MIRRORED = """
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from tfhash.models import build_scdh, mlp
rng = np.random.default_rng(0)
x = rng.normal(size=(16, 6)).astype("float32")
y = np.eye(3, dtype="float32")[rng.integers(0, 3, 16)]
w = rng.uniform(0.5, 2.0, 16).astype("float32")
def run(strategy):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = build_scdh(mlp(6, (8,), dropout=0.0), 3, 8)
        model(x[:2])
        model.compile(optimizer=keras.optimizers.SGD(0.1))
    history = model.fit(x, y, sample_weight=w, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return model.get_weights(), history.history["loss"]
one, loss_one = run(tf.distribute.get_strategy())
two, loss_two = run(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
np.testing.assert_allclose(loss_two, loss_one, rtol=1e-5)
for a, b in zip(one, two):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
"""


@pytest.mark.process
def test_two_replicas_train_as_one_device():
    """compute_loss divides by the replicas in sync, as Keras's losses do, so two mirrored
    replicas (their gradients summed) train exactly like one device on the same global batch."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _MIRRORED], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_loss_from_reduced_terms_equals_reduced_total():
    """The models build the loss from the batch reductions of its terms (the papers' batch form);
    that is the reduction of the per-example total, with and without weights."""
    rng = np.random.default_rng(5)
    labels, codes = _multi_label(), rng.normal(size=(N, BITS)).astype("float32")
    neg_distances, logits = -np.abs(rng.normal(size=(N, 4))).astype("float32"), rng.normal(size=(N, 4)).astype("float32")
    per_example = losses.scdh_per_example(labels, neg_distances, logits, codes, 0.1, 0.2, 0.05)
    for weights in (None, np.linspace(0.0, 2.0, N).astype("float32")):
        batch = losses.scdh_loss(labels, neg_distances, logits, codes, 0.1, 0.2, 0.05, sample_weight=weights)
        assert float(batch["loss"]) == pytest.approx(float(losses.reduce_per_example(per_example["loss"], weights)), rel=1e-6)
        assert float(batch["loss"]) == pytest.approx(float(losses.scdh_total(batch, 0.2, 0.05)), rel=1e-7)
