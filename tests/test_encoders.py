"""The encoder API every tfhash model shares: ``modalities``, ``encoder(modality)`` (built once,
cached, sharing the model's weights), ``encoders()`` and ``encode``."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.test_sample_weight import MODEL_CASES, model_case
from tfhash.callbacks import RetrievalEvalCallback
from tfhash.codes import sign_codes
from tfhash.models import build_scdh, mlp
from tfhash.models.base import DEFAULT_MODALITY
from tfhash.optimizers import backbone_variables


def _model(name):
    build, x, y = model_case(name)
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    return model, x, y


def _inputs(model, x, modality):
    return x[modality] if isinstance(x, dict) else x


def _model_codes(model, x, modality):
    out = model(x, training=False)
    return np.asarray((out[modality] if modality in out else out)["codes"])


@pytest.mark.parametrize("name", MODEL_CASES)
def test_every_model_exposes_its_encoders_the_same_way(name, tmp_path):
    model, x, _ = _model(name)
    weights = [w.path for w in model.weights]
    encoders = model.encoders()
    assert tuple(encoders) == model.modalities and all(isinstance(e, keras.Model) for e in encoders.values())
    for modality, encoder in encoders.items():
        assert model.encoder(modality) is encoder  # built once
        inputs = _inputs(model, x, modality)
        codes = np.asarray(encoder(inputs))
        np.testing.assert_allclose(codes, _model_codes(model, x, modality), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(model.encode(inputs, modality), sign_codes(codes))
        np.testing.assert_allclose(model.continuous_codes(inputs, modality), codes, rtol=1e-5, atol=1e-6)
    if len(model.modalities) == 1:
        assert model.modalities == (DEFAULT_MODALITY,) and model.encoder() is encoders[DEFAULT_MODALITY]
    else:
        with pytest.raises(ValueError, match="name the one to encode"):
            model.encoder()
    with pytest.raises(ValueError, match="unknown modality 'audio'"):
        model.encoder("audio")
    # the encoders are not part of the model: same weights, same saved form
    assert [w.path for w in model.weights] == weights
    model.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    for modality in model.modalities:
        np.testing.assert_array_equal(restored.encode(_inputs(model, x, modality), modality),
                                      model.encode(_inputs(model, x, modality), modality))  # fmt: skip
    # the backbones fine-tuning trains: one per modality, the student's for MT-SCDH
    expected = {id(v) for m in model.modalities for v in model.modality_backbone(m).trainable_variables}
    assert {id(v) for v in backbone_variables(model)} == expected and expected
    if name == "mt-scdh":
        assert model.modality_backbone() is model.student.backbone and model.encoder() is model.teacher.encoder()


def test_encoders_follow_training_and_savedmodel_export_after_encoding(tmp_path):
    keras.utils.set_random_seed(1)
    x = np.random.default_rng(1).normal(size=(32, 6)).astype("float32")
    labels = np.eye(3, dtype="float32")[np.arange(32) % 3]
    model = build_scdh(mlp(6, (8,), dropout=0.0), 3, 16)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    before = model.continuous_codes(x)
    model.fit(x, labels, epochs=2, batch_size=8, verbose=0)
    after = model.continuous_codes(x)
    assert not np.allclose(before, after)
    np.testing.assert_allclose(after, model(x)["codes"], rtol=1e-5, atol=1e-6)
    export_dir = tmp_path / "saved_model"
    model.export(str(export_dir), format="tf_saved_model", input_signature=[tf.TensorSpec([None, 6], tf.float32)], verbose=False)
    loaded = tf.saved_model.load(str(export_dir))
    np.testing.assert_allclose(loaded.serve(tf.constant(x))["codes"].numpy(), after, rtol=1e-5, atol=1e-6)


def test_retrieval_callback_encodes_each_modality():
    model, x, y = _model("jcch")
    labels = y.argmax(axis=1)
    callback = RetrievalEvalCallback(x["image"], labels, x["text"], labels, query_modality="image", db_modality="text")
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    assert 0.0 <= history.history["val_map"][-1] <= 1.0
