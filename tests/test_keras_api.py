"""The Keras API on a user's own data: labels in the usual forms, bad input refused before
training, compile and saving the Keras way, a recipe trained in one call.

Small synthetic data (a few hundred rows of 12 features), so every registered method trains in
seconds."""

from __future__ import annotations

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfhash.labels import LabelError, multi_hot
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
from tfhash.models.inputs import InputError, NonFiniteWeightsError
from tfhash.recipes import RECOMMENDED, Recipe, recommended
from tfhash.registry import get_method, mean_teacher_rows, method_names

N, D, C, BITS = 240, 12, 4, 16


def data(seed: int = 0, multi_label: bool = False):
    """Features whose first C dimensions carry the class; ids, their one-hot, or multi-hot rows."""
    rng = np.random.default_rng(seed)
    ids = np.arange(N) % C
    x = rng.normal(size=(N, D)).astype("float32")
    x[np.arange(N), ids] += 3.0
    if multi_label:
        tags = np.eye(C, dtype="float32")[ids]
        tags[np.arange(0, N, 3), (ids[::3] + 1) % C] = 1.0
        x[:, :C] += 3.0 * tags
        return x, tags
    return x, ids


def inputs_for(method: str, x):
    return {"image": x[:, :8], "text": x[:, 4:]} if get_method(method).cross_modal else x


def targets_for(method: str, labels):
    return {"labels": labels, "index": np.arange(len(labels))} if method == "dpsh" else labels


def trained(method: str, x, labels, epochs: int = 2, **fit):
    """A small model of ``method`` built by its recipe, trained with ``model.fit`` on ``labels``."""
    semi = get_method(method).semi_supervised
    model = Recipe(method=method, hidden=(16,), epochs=epochs, batch_size=32).build(inputs_for(method, x),
                                                                                    multi_hot(labels, C, unlabelled=semi), BITS)  # fmt: skip
    keras.utils.set_random_seed(1)
    model.fit(inputs_for(method, x), targets_for(method, labels), epochs=epochs, batch_size=32, verbose=0, **fit)
    return model


def codes_of(model, method: str, x):
    if get_method(method).cross_modal:
        return np.concatenate([model.encode(x[:, :8], "image"), model.encode(x[:, 4:], "text")], axis=1)
    return model.encode(x)


# --- labels -------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", method_names())
def test_class_ids_train_exactly_as_their_one_hot(method):
    x, ids = data()
    from_ids = codes_of(trained(method, x, ids), method, x)
    from_one_hot = codes_of(trained(method, x, np.eye(C, dtype="float32")[ids]), method, x)
    np.testing.assert_array_equal(from_ids, from_one_hot)
    assert len(np.unique(from_ids, axis=0)) > 1  # the codes carry something


@pytest.mark.parametrize("method", ["scdh", "hclm", "shclm", "hyp2", "jcch", "dpsh"])
def test_multi_label_methods_train_from_multi_hot(method):
    x, tags = data(multi_label=True)
    model = trained(method, x, tags)
    assert np.isfinite(model.history.history["loss"][-1])


def _bad_labels():
    ids = np.arange(N) % C
    one_hot = np.eye(C, dtype="float32")[ids]
    out_of_range = ids.copy()
    out_of_range[7] = C
    empty = one_hot.copy()
    empty[[3, 9]] = 0.0
    return {
        "a column of ids": (ids[:, None].astype("float32"), r"shape \(240, 1\) are ambiguous.*1-D array of shape \(240,\)"),
        "a one-hot of the wrong width": (np.eye(C + 1)[ids], r"5 columns but the model has 4 classes.*\(n, 4\)"),
        "an id out of range": (out_of_range, r"class ids must lie in 0\.\.3; rows \[7\] \(1 of 240\)"),
        "rows without a label": (empty, r"rows \[3, 9\] \(2 of 240\) have none"),
        "fractional ids": (ids + 0.5, r"whole numbers"),
        "NaN in a multi-hot row": (np.where(np.arange(N)[:, None] == 5, np.nan, one_hot), r"rows \[5\] \(1 of 240\) hold other values"),
    }


@pytest.mark.parametrize("case", sorted(_bad_labels()))
@pytest.mark.parametrize("method", ["scdh", "hyp2", "jcch"])
def test_bad_labels_are_refused_before_the_first_step(method, case):
    x, _ = data()
    labels, message = _bad_labels()[case]
    model = Recipe(method=method, hidden=(16,), epochs=1).build(inputs_for(method, x), np.arange(N) % C, BITS)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(LabelError, match=message):
        model.fit(inputs_for(method, x), labels, epochs=1, verbose=0)
    assert model.optimizer.iterations.numpy() == 0
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))


def test_semi_supervised_training_takes_unlabelled_rows():
    x, ids = data()
    unlabelled = ids.copy()
    unlabelled[::2] = -1  # id -1: no label
    zero_rows = np.eye(C, dtype="float32")[ids]
    zero_rows[::2] = 0.0  # all-zero rows: no label
    codes = [codes_of(trained("mt-scdh", x, labels), "mt-scdh", x) for labels in (unlabelled, zero_rows)]
    np.testing.assert_array_equal(*codes)
    with pytest.raises(LabelError, match="-1 marks an unlabelled row only in semi-supervised training"):
        trained("scdh", x, unlabelled)


def test_datasets_are_checked_batch_by_batch():
    x, ids = data()
    model = Recipe(method="scdh", hidden=(16,), epochs=1).build(x, ids, BITS)
    batches = tf.data.Dataset.from_tensor_slices((x, ids)).batch(32)
    model.fit(batches, epochs=1, verbose=0)  # class ids in a dataset train too
    with pytest.raises(LabelError, match=r"ambiguous"):  # shapes: when fit is called, before any step
        model.fit(tf.data.Dataset.from_tensor_slices((x, ids[:, None])).batch(32), epochs=1, verbose=0)
    bad = ids.copy()
    bad[100] = 9
    with pytest.raises(LabelError, match=r"x labels: class ids must be whole numbers in 0..3; rows of this batch: 4 hold 9$"):
        model.fit(tf.data.Dataset.from_tensor_slices((x, bad)).batch(32), epochs=1, verbose=0)
    nan = x.copy()
    nan[40, 2] = np.nan
    with pytest.raises(InputError, match=r"x inputs holds NaN or infinite values; rows of this batch: 8$"):
        model.fit(tf.data.Dataset.from_tensor_slices((nan, ids)).batch(32), epochs=1, verbose=0)


def test_loss_wrappers_take_class_ids():
    from tfhash.losses import HammingTripletLoss, SemanticClusterUnaryLoss

    ids = np.array([0, 1, 2, 1])
    one_hot = np.eye(3, dtype="float32")[ids]
    scores = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
    codes = np.random.default_rng(1).normal(size=(4, 8)).astype("float32")
    scul = SemanticClusterUnaryLoss()
    assert float(scul(ids, scores)) == pytest.approx(float(scul(one_hot, scores)))
    triplet = HammingTripletLoss(margin=2.0, num_classes=3)
    assert float(triplet(ids, codes)) == pytest.approx(float(triplet(one_hot, codes)))
    with pytest.raises(LabelError, match="4 columns but the model has 3 classes"):
        scul(np.eye(4, dtype="float32")[ids], scores)
    with pytest.raises(LabelError, match="num_classes=C"):
        HammingTripletLoss(margin=2.0)(ids, codes)


# --- non-finite input and weights -----------------------------------------------------------------


def test_non_finite_features_are_refused_naming_rows():
    x, ids = data()
    x[::10, 3] = np.nan
    model = Recipe(method="scdh", hidden=(16,)).build(data()[0], ids, BITS)
    with pytest.raises(InputError, match=r"NaN or infinite values in rows \[0, 10, 20, .*\(24 of 240\)"):
        model.fit(x, ids, epochs=1, verbose=0)
    with pytest.raises(InputError, match=r"validation_data holds NaN"):
        model.fit(data()[0], ids, validation_data=(x, ids), epochs=1, verbose=0)
    with pytest.raises(InputError, match=r"rows \[0, 1, 2\] \(3 of 3\)"):
        model.encode(np.full((3, D), np.nan, "float32"))
    with pytest.raises(InputError, match="sample_weight must be finite and >= 0"):
        model.fit(data()[0], ids, sample_weight=-np.ones(N), epochs=1, verbose=0)


def test_a_step_that_makes_a_weight_non_finite_stops_training():
    x, ids = data()
    model = build_scdh(mlp(D, (16,)), C, BITS)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=1e38))
    with pytest.raises(NonFiniteWeightsError, match=r"^a training step made the weight \S+/kernel non-finite"):
        model.fit(x, ids, epochs=1, batch_size=32, verbose=0)
    with pytest.raises(InputError, match="non-finite codes"):
        model.encode(x)  # what the diverged step left behind is not encoded either


@pytest.mark.parametrize("method", ["scdh", "hyp2", "mt-scdh"])
def test_a_model_compiled_with_xla_trains(method):
    """``jit_compile=True`` (Keras's "auto" on a GPU): the step compiles (the weights' check, whose
    message gathers a weight's name, a string op XLA lacks, stays out of it) and learns as without."""
    x, ids = data()
    semi = get_method(method).semi_supervised
    codes = {}
    for jit in (False, True):
        keras.utils.set_random_seed(1)
        model = Recipe(method=method, hidden=(16,), epochs=2, batch_size=32).build(x, multi_hot(ids, C, unlabelled=semi), BITS)
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01), jit_compile=jit)
        history = model.fit(x, ids, epochs=2, batch_size=32, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        codes[jit] = model.encode(x)
    assert np.mean(codes[False] == codes[True]) > 0.95  # the same steps, up to XLA's rounding


def test_encode_takes_lists_and_datasets():
    x, ids = data()
    model = trained("scdh", x, ids, epochs=1)
    codes = model.encode(x)
    np.testing.assert_array_equal(model.encode(x[:5].tolist()), codes[:5])
    np.testing.assert_array_equal(model.encode(tf.data.Dataset.from_tensor_slices(x).batch(64)), codes)
    np.testing.assert_array_equal(model.encode(tf.data.Dataset.from_tensor_slices((x, ids)).batch(64)), codes)
    assert codes.dtype == np.int8 and set(np.unique(codes)) <= {-1, 1}


# --- bits --------------------------------------------------------------------------------------


@pytest.mark.parametrize("build", [
    lambda: build_scdh(mlp(D, (8,)), C, 30),
    lambda: build_mt_scdh(lambda: mlp(D, (8,)), C, 30, np.zeros((2, D), "float32")),
    lambda: build_jcch({"a": mlp(D, (8,)), "b": mlp(D, (8,))}, C, 30, fixed_centres=0.5),
    lambda: build_hclm(mlp(D, (8,)), C, 30),
    lambda: build_hyp2(mlp(D, (8,)), C, 30),
    lambda: build_pairwise(mlp(D, (8,)), C, 30, num_train=10),
    lambda: build_softmax_codes(mlp(D, (8,)), C, 30),
    lambda: Recipe(method="scdh").build(*data(), bits=30),
], ids=["scdh", "mt-scdh", "jcch", "hclm", "hyp2", "dpsh", "cnnbh", "recipe"])  # fmt: skip
def test_code_lengths_that_cannot_be_packed_are_refused_when_building(build):
    with pytest.raises(ValueError, match="bits must be a positive multiple of 8.*got 30"):
        build()


# --- compile -------------------------------------------------------------------------------------


def test_compile_refuses_a_loss_it_would_ignore():
    model = build_scdh(mlp(D, (8,)), C, BITS)
    with pytest.raises(ValueError, match=r"own objective \(SCDH Eq. 18.*drop them"):
        model.compile(optimizer="adam", loss="categorical_crossentropy")
    with pytest.raises(ValueError, match="own objective"):
        model.compile(optimizer="adam", loss_weights=[1.0])


def test_compile_metrics_the_keras_way():
    x, ids = data()
    model = build_scdh(mlp(D, (16,)), C, BITS)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), metrics=["accuracy", "precision_h2"],
                  weighted_metrics=[keras.metrics.CategoricalAccuracy(name="categorical")])  # fmt: skip
    history = model.fit(x, ids, epochs=5, batch_size=N, verbose=0)
    assert {"accuracy", "precision_h2", "categorical", "loss"} <= set(history.history)
    result = model.evaluate(x, ids, batch_size=N, verbose=0, return_dict=True)
    scores = model(x, training=False)
    expected = float(np.mean(np.argmax(scores["logits"], axis=1) == ids))
    assert result["accuracy"] == pytest.approx(expected)
    assert result["categorical"] == pytest.approx(expected)
    codes = np.where(np.asarray(scores["codes"]) >= 0, 1, -1)
    distances = (BITS - codes @ codes.T) / 2
    ball = (distances <= 2) & ~np.eye(N, dtype=bool)
    relevant = ids[:, None] == ids[None, :]
    per_query = np.where(ball.sum(1) > 0, (ball & relevant).sum(1) / np.maximum(ball.sum(1), 1), 0.0)
    assert result["precision_h2"] == pytest.approx(per_query.mean(), abs=1e-6)


def test_compile_metrics_per_tower_and_clear_refusals():
    x, ids = data()
    model = Recipe(method="jcch", hidden=(16,), epochs=1).build(inputs_for("jcch", x), ids, BITS)
    model.compile(optimizer="adam", metrics=["accuracy"])
    result = model.evaluate(inputs_for("jcch", x), ids, verbose=0, return_dict=True)
    assert {"image_accuracy", "text_accuracy"} <= set(result)
    pairwise = build_pairwise(mlp(D, (8,)), C, BITS, num_train=N)
    with pytest.raises(ValueError, match="no class scores.*precision_h2"):
        pairwise.compile(optimizer="adam", metrics=["accuracy"])
    with pytest.raises(ValueError, match="unknown metric 'mAP'"):
        build_scdh(mlp(D, (8,)), C, BITS).compile(optimizer="adam", metrics=["mAP"])


# --- saving ------------------------------------------------------------------------------------


@pytest.mark.process
def test_every_method_saved_as_keras_loads_after_importing_tfhash_models_alone(tmp_path):
    """Each registered method, compiled with its recipe's optimizer and a compile metric, saved
    as ``.keras`` and loaded in a new process that imports only ``tfhash.models`` (and Keras):
    the same codes."""
    x, ids = data()
    expected = {}
    for method in method_names():
        model = trained(method, x, ids, epochs=1)
        metrics = ["precision_h2"] + ([] if method == "dpsh" else ["accuracy"])
        model.compile(optimizer=Recipe(method=method, schedule="cosine").optimizer(8), metrics=metrics)
        model.save(tmp_path / f"{method}.keras")
        expected[method] = codes_of(model, method, x)
    np.save(tmp_path / "x.npy", x)
    script = f"""
import json, sys
import keras, numpy as np
import tfhash.models
x = np.load({str(tmp_path / 'x.npy')!r})
out = {{}}
for method in {list(method_names())!r}:
    model = keras.saving.load_model({str(tmp_path)!r} + "/" + method + ".keras")
    if len(model.modalities) == 2:
        codes = np.concatenate([model.encode(x[:, :8], "image"), model.encode(x[:, 4:], "text")], axis=1)
    else:
        codes = model.encode(x)
    out[method] = [codes.tolist(), model.compiled, type(model.optimizer).__name__]
print(json.dumps(out))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    for method, codes in expected.items():
        np.testing.assert_array_equal(np.asarray(loaded[method][0]), codes, err_msg=method)
        assert loaded[method][1] and loaded[method][2].startswith("BackboneRate"), (method, loaded[method])


# --- recipes -------------------------------------------------------------------------------------


def test_a_recipe_trains_in_one_call_and_its_schedule_spans_the_epochs_trained():
    x, ids = data()
    recipe = RECOMMENDED["single-label"]  # cosine over 100 epochs
    model = recipe.fit(x, ids, bits=BITS, seed=0, epochs=3, validation_data=(x[:40], ids[:40]))
    assert len(model.history.history["loss"]) == 3 and "val_loss" in model.history.history
    schedule = model.optimizer._learning_rate
    steps = 3 * int(np.ceil(N / recipe.batch_size))
    assert float(schedule(steps)) == pytest.approx(0.0, abs=1e-9) and float(schedule(0)) == pytest.approx(recipe.learning_rate)
    again = recipe.fit(x, ids, bits=BITS, seed=0, epochs=3)
    np.testing.assert_array_equal(model.encode(x), again.encode(x))  # seeded
    built = recipe.build(x, ids, BITS, seed=0, epochs=3)
    assert built.compiled and not built.optimizer.iterations.numpy()
    assert float(built.optimizer._learning_rate(steps)) == pytest.approx(0.0, abs=1e-9)


def test_recipes_take_cross_modal_dicts_and_refuse_images():
    x, ids = data()
    model = recommended("cross-modal").fit(inputs_for("jcch", x), ids, bits=BITS, epochs=2)
    assert model.encode(x[:, 4:], "text").shape == (N, BITS)
    with pytest.raises(ValueError, match=r"feature vectors \(n, d\).*flatten.*image_backbone"):
        recommended("single-label pixels").build(np.zeros((N, 8, 8), "uint8"), ids, BITS)
    with pytest.raises(ValueError, match="jcch takes a dict of two modalities"):
        recommended("cross-modal").build(x, ids, BITS)
    with pytest.raises(ValueError, match=r"x has \[100\] rows but labels have 240"):
        recommended("single-label").build(x[:100], ids, BITS)


def test_mean_teacher_rows_keep_a_labelled_share_and_mark_unlabelled_rows():
    x = np.ones((100, 3), "float32")
    y = np.eye(2, dtype="float32")[np.arange(100) % 2]
    unlabelled = np.zeros((900, 3), "float32")
    rows, targets = mean_teacher_rows(x, y, unlabelled, seed=0, labelled_share=0.25)
    labelled = targets.sum(axis=1) > 0
    assert labelled.sum() == 300 and (~labelled).sum() == 900  # 3 repeats: 25% of the rows
    assert np.all(rows[~labelled] == 0) and np.all(rows[labelled] == 1)


@pytest.mark.process
def test_the_replay_of_reported_mistakes_gets_what_the_library_promises():
    """``scripts/replay_keras_mistakes.py`` exits 1 when a case does not behave as promised."""
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "replay_keras_mistakes.py"
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert run.stdout.rstrip().endswith("0 case(s) not as promised")
