"""SCDH / MT-SCDH / JCCH models: training behaviour, serialization and SavedModel export."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfhash import losses
from tfhash.callbacks import ClusterNormWarmup, RetrievalEvalCallback
from tfhash.layers import HashHead, SemanticClusters
from tfhash.models import build_jcch, build_mt_scdh, build_scdh, mlp, scdh_callbacks


def _toy(seed=0, n=240, dim=20, classes=4):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    means = rng.normal(scale=3.0, size=(classes, dim))
    x = (means[y] + rng.normal(size=(n, dim))).astype("float32")
    return x, np.eye(classes, dtype="float32")[y], y


def test_scdh_learns_separable_codes():
    keras.utils.set_random_seed(0)
    x, labels, y = _toy()
    model = build_scdh(mlp(20, (64,)), num_classes=4, bits=16, preset="cifar10")
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit(x, labels, epochs=15, batch_size=32, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0] * 0.5
    assert set(history.history) >= {"loss", "scul", "classifier", "quantization"}
    codes = model.encode(x)
    assert codes.dtype == np.int8 and set(np.unique(codes)) <= {-1, 1}
    from tfhash.metrics import mean_average_precision

    assert mean_average_precision(codes, codes, y, y) > 0.9


def test_scdh_s_ablation_and_presets():
    model = build_scdh(mlp(20, (8,)), 4, 16, preset="nuswide", ablation=True)
    assert model.lam == 0.0 and model.clusters.similarity == "dot" and model.alpha == 1.0
    model = build_scdh(mlp(20, (8,)), 4, 16, preset="cifar10", lam=0.5)
    assert model.lam == 0.5 and model.mu == 0.2
    with pytest.raises(ValueError, match="unknown preset"):
        build_scdh(mlp(20, (8,)), 4, 16, preset="coco")
    imagenet = build_scdh(mlp(20, (8,)), 4, 16, preset="imagenet")
    (warmup,) = scdh_callbacks(imagenet, preset="imagenet")
    assert warmup.norm == 8.0 and warmup.epochs == 5


def test_jcch_coefficients_as_targets_change_the_loss():
    x, labels, _ = _toy(n=64)
    q, u = losses.jcch_coefficients(labels)
    model = build_scdh(mlp(20, (8,)), 4, 16)
    y_pred = model(x)
    plain = model.compute_loss(x, labels, y_pred)
    weighted = model.compute_loss(x, {"labels": labels, "q": q.astype("float32"), "u": u.astype("float32")}, y_pred)
    jcch_b = model.compute_loss(x, {"labels": labels, "q": labels, "u": labels}, y_pred)  # q = 1/|Y| = 1 here
    assert float(plain) == pytest.approx(float(jcch_b), rel=1e-6)
    assert float(weighted) != pytest.approx(float(plain), rel=1e-3)


def test_warmup_holds_centre_norms():
    keras.utils.set_random_seed(1)
    x, labels, _ = _toy(n=64)
    model = build_scdh(mlp(20, (8,)), 4, 16)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    model.fit(x, labels, epochs=2, batch_size=16, verbose=0, callbacks=[ClusterNormWarmup(model.clusters, norm=8.0, epochs=2)])
    np.testing.assert_allclose(np.linalg.norm(model.clusters.centres.numpy(), axis=1), 8.0, rtol=1e-5)
    model.fit(x, labels, epochs=1, batch_size=16, verbose=0, callbacks=[ClusterNormWarmup(model.clusters, norm=8.0, epochs=0)])
    assert not np.allclose(np.linalg.norm(model.clusters.centres.numpy(), axis=1), 8.0, rtol=1e-5)


def test_mean_teacher_trains_on_unlabelled_rows_and_tracks_student():
    keras.utils.set_random_seed(2)
    x, labels, _ = _toy(n=128)
    labels[64:] = 0  # half the batch unlabelled
    model = build_mt_scdh(lambda: mlp(20, (16,)), 4, 16, sample_input=x[:2], rampup_steps=5, ema_decay=0.5, noise_stddev=0.1)
    np.testing.assert_array_equal(model.teacher.get_weights()[0], model.student.get_weights()[0])
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit(x, labels, epochs=3, batch_size=32, verbose=0)
    assert np.isfinite(history.history["loss"]).all() and "consistency" in history.history
    student, teacher = model.student.get_weights()[0], model.teacher.get_weights()[0]
    assert not np.array_equal(student, teacher)
    # EMA with decay 0.5 keeps the teacher close to the student
    assert np.abs(student - teacher).mean() < np.abs(student).mean()
    assert model.encode(x).shape == (128, 16)
    # a batch with no labelled row at all still trains
    model.fit(x[64:], labels[64:], epochs=1, batch_size=32, verbose=0)
    for bad in ({"consistency": -1.0}, {"consistency": float("nan")}, {"noise_stddev": -0.1}, {"ema_decay": 1.5},
                {"rampup_steps": -1}):  # fmt: skip
        with pytest.raises(ValueError, match="MT-SCDH needs"):
            build_mt_scdh(lambda: mlp(20, (16,)), 4, 16, sample_input=x[:2], **bad)


def test_jcch_two_towers_share_centres():
    keras.utils.set_random_seed(3)
    x, labels, y = _toy(n=160)
    text = (x[:, :6] + np.random.default_rng(0).normal(size=(160, 6))).astype("float32")
    model = build_jcch({"image": mlp(20, (32,)), "text": mlp(6, (32,))}, 4, 16, beta=0.1)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit({"image": x, "text": text}, labels, epochs=10, batch_size=32, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert len([w for w in model.weights if "centres" in w.path]) == 1
    from tfhash.metrics import cross_modal_mean_average_precision

    codes = {"image": model.encode(x, "image"), "text": model.encode(text, "text")}
    out = cross_modal_mean_average_precision(codes, codes, y, y)
    assert set(out) == {"image->text", "text->image"} and min(out.values()) > 0.5
    with pytest.raises(ValueError, match="unknown modality"):
        model.encode(x, "audio")


def test_jcch_fixed_centres_stay_put_and_round_trip(tmp_path):
    keras.utils.set_random_seed(7)
    x, labels, y = _toy(n=96)
    model = build_jcch({"image": mlp(20, (16,)), "text": mlp(20, (), input_dropout=0.2)}, 4, 16, fixed_centres=0.5)
    start = model.clusters.centres.numpy().copy()
    np.testing.assert_array_equal(np.abs(start), 0.5)  # every coordinate +-scale: proxies, not N(0, 0.5^2)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    model.fit({"image": x, "text": x}, labels, epochs=2, batch_size=32, verbose=0)
    np.testing.assert_array_equal(model.clusters.centres.numpy(), start)
    model.save(tmp_path / "fixed.keras")
    restored = keras.saving.load_model(tmp_path / "fixed.keras")
    np.testing.assert_array_equal(restored.clusters.centres.numpy(), start)
    assert not restored.clusters.trainable_weights
    np.testing.assert_array_equal(restored.encode(x, "image"), model.encode(x, "image"))
    learned = build_jcch({"image": mlp(20, (8,)), "text": mlp(20, (8,))}, 4, 16)
    assert learned.clusters.trainable_weights and learned.centres is None
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="fixed_centres"):
            build_jcch({"image": mlp(20, (8,)), "text": mlp(20, (8,))}, 4, 16, fixed_centres=bad)


def test_mlp_input_dropout_and_linear_tower():
    x = np.ones((4, 6), "float32")
    tower = mlp(6, (), input_dropout=0.5)
    np.testing.assert_array_equal(tower(x, training=False), x)  # identity at inference
    assert not np.array_equal(np.asarray(tower(x, training=True)), x)
    assert mlp(6, ()).output_shape == (None, 6)
    with pytest.raises(ValueError, match="dropout"):
        mlp(6, (8,), input_dropout=1.0)


def test_layers_and_losses_round_trip_config():
    for obj in (
        HashHead(32, activation="tanh"),
        SemanticClusters(10, 32, similarity="dot"),
        losses.SemanticClusterUnaryLoss(lam=0.1),
        losses.QuantizationLoss(p=4.0),
        losses.ClassifierCrossEntropy(),
    ):
        clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(obj))
        assert type(clone) is type(obj) and clone.get_config() == obj.get_config()


def test_keras_loss_wrappers_accept_coefficients():
    rng = np.random.default_rng(6)
    labels = np.eye(3, dtype="float32")[[0, 1, 2, 1]]
    neg_d = -rng.random((4, 3)).astype("float32")
    q = rng.random((4, 3)).astype("float32")
    u = rng.random((4, 3)).astype("float32")
    scul = losses.SemanticClusterUnaryLoss(lam=0.2)
    assert float(scul(labels, neg_d)) == pytest.approx(float(losses.semantic_cluster_unary_loss(labels, neg_d, 0.2)), rel=1e-6)
    packed = np.concatenate([labels, q, u], axis=1)
    assert float(scul(packed, neg_d)) == pytest.approx(float(losses.semantic_cluster_unary_loss(labels, neg_d, 0.2, q, u)), rel=1e-6)
    with pytest.raises(ValueError, match="2 columns but the model has 3 classes"):
        scul(labels[:, :2], neg_d)


def _stock_ops_only(saved_model_dir) -> set:
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with open(f"{saved_model_dir}/saved_model.pb", "rb") as handle:
        proto.ParseFromString(handle.read())
    graph = proto.meta_graphs[0].graph_def
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops |= {node.op for node in function.node_def}
    library = {f.signature.name for f in graph.library.function}
    return {op for op in ops if op not in library and not hasattr(tf.raw_ops, op)}


def test_scdh_model_survives_keras_and_savedmodel_round_trips(tmp_path):
    keras.utils.set_random_seed(4)
    x, labels, _ = _toy(n=64)
    model = build_scdh(mlp(20, (16,)), 4, 16, preset="cifar10", lam=0.01)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    model.fit(x, labels, epochs=1, batch_size=16, verbose=0)
    path = tmp_path / "scdh.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    assert restored.lam == 0.01 and restored.get_config()["bits"] == 16
    np.testing.assert_allclose(restored(x)["codes"], model(x)["codes"], rtol=1e-5, atol=1e-6)
    export_dir = tmp_path / "saved_model"
    model.export(str(export_dir), format="tf_saved_model", input_signature=[tf.TensorSpec([None, 20], tf.float32)], verbose=False)
    loaded = tf.saved_model.load(str(export_dir))
    np.testing.assert_allclose(loaded.serve(tf.constant(x))["codes"].numpy(), model(x)["codes"], rtol=1e-5, atol=1e-6)
    assert _stock_ops_only(export_dir) == set()


def test_jcch_and_mean_teacher_round_trip(tmp_path):
    x, labels, _ = _toy(n=32)
    jcch = build_jcch({"image": mlp(20, (8,)), "text": mlp(20, (8,))}, 4, 16)
    jcch({"image": x, "text": x})
    jcch.save(tmp_path / "jcch.keras")
    restored = keras.saving.load_model(tmp_path / "jcch.keras")
    np.testing.assert_allclose(restored.encode(x, "text"), jcch.encode(x, "text"))
    mt = build_mt_scdh(lambda: mlp(20, (8,)), 4, 16, sample_input=x[:2])
    mt(x)
    mt.save(tmp_path / "mt.keras")
    restored = keras.saving.load_model(tmp_path / "mt.keras")
    np.testing.assert_allclose(restored.encode(x), mt.encode(x))


def test_retrieval_eval_callback_logs_map():
    keras.utils.set_random_seed(5)
    x, labels, y = _toy(n=96)
    model = build_scdh(mlp(20, (16,)), 4, 16)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    callback = RetrievalEvalCallback(x[:16], y[:16], x[16:], y[16:], frequency=2)
    history = model.fit(x, labels, epochs=4, batch_size=32, verbose=0, callbacks=[callback])
    assert len(history.history["val_map"]) == 2 and 0.0 <= history.history["val_map"][-1] <= 1.0
