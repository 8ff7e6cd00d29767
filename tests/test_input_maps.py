"""Input maps of feature-vector towers (``tfhash.layers.input_maps``): the RBF kernel and its
adaptation to the training rows, the recipes and the search space that name them, and models that
keep them through saving and export."""

from __future__ import annotations

import numpy as np
import pytest

from tfhash.layers import INPUT_MAPS, RBFFeatures, input_map_layers, rbf_kernel


def rows(n=60, d=5, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


def test_the_kernel_is_exp_of_minus_gamma_times_the_squared_distance():
    x, anchors = rows(7, 3, 1), rows(4, 3, 2)
    expected = np.exp(-0.3 * ((x[:, None] - anchors[None]) ** 2).sum(-1))
    np.testing.assert_allclose(np.asarray(rbf_kernel(x, anchors, 0.3)), expected, rtol=1e-5, atol=1e-6)


def test_adapt_draws_anchors_from_the_rows_and_sets_the_width_from_their_distances():
    data = rows()
    layer = RBFFeatures(anchors=10, seed=3).adapt(data)
    anchors = np.asarray(layer.anchor_rows)
    assert all(any(np.array_equal(a, r) for r in data) for a in anchors)  # every anchor is a training row
    sigma = np.sqrt(((anchors[:, None] - anchors[None]) ** 2).sum(-1)).sum() / (10 * 9)  # between two distinct anchors
    np.testing.assert_allclose(float(layer.gamma), 1 / (2 * sigma**2), rtol=1e-4)
    out = np.asarray(layer(data))
    assert out.shape == (60, 10) and np.all((out > 0) & (out <= 1))
    np.testing.assert_array_equal(np.asarray(RBFFeatures(anchors=10, seed=3).adapt(data).anchor_rows), anchors)  # seeded
    assert RBFFeatures(anchors=500).adapt(data).anchors == 60  # fewer rows than anchors: every row


@pytest.mark.parametrize("bad, message", [(rows()[:1], "n >= 2"), (np.ones((5, 3)), "all identical"), (rows()[:, 0], "rows \\(n, d\\)")])
def test_adapt_refuses_rows_it_cannot_learn_from(bad, message):
    with pytest.raises(ValueError, match=message):
        RBFFeatures(anchors=4).adapt(bad)


def test_non_finite_rows_are_refused_by_name():
    data = rows()
    data[7, 2] = np.nan
    for kind in ("standardise", "rbf"):
        with pytest.raises(ValueError, match=r"NaN or infinity \(rows \[7\]\)"):
            input_map_layers(kind, data)
    with pytest.raises(ValueError, match="unknown input map 'pca'"):
        input_map_layers("pca", rows())
    for anchors in (0, 1, True, 2.5):
        with pytest.raises(ValueError, match="anchors must be an integer of at least 2"):
            RBFFeatures(anchors=anchors)


def test_the_maps_are_learned_from_the_rows_they_are_given_only():
    train, other = rows(40, 4, 0), rows(40, 4, 1) * 10 + 5
    first = input_map_layers("rbf", train, seed=0)
    again = input_map_layers("rbf", train, seed=0)
    changed = input_map_layers("rbf", np.concatenate([train, other]), seed=0)
    for a, b in zip(first, again, strict=True):
        for u, v in zip(a.get_weights(), b.get_weights(), strict=True):
            np.testing.assert_array_equal(u, v)
    assert not np.allclose(first[0].get_weights()[1], changed[0].get_weights()[1])  # other rows would change the width
    standardised = input_map_layers("standardise", train)[0]
    np.testing.assert_allclose(np.asarray(standardised(train)).mean(0), 0, atol=1e-5)
    assert input_map_layers("none", train) == []


def cross_modal(n=120, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    image = (np.eye(3)[labels] @ rng.normal(size=(3, 12)) * 3 + rng.normal(size=(n, 12))).astype(np.float32)
    text = (np.eye(3)[labels] @ rng.normal(size=(3, 6)) * 3 + rng.normal(size=(n, 6)) + 50).astype(np.float32)
    return {"image": image, "text": text}, labels


def test_a_recipe_with_input_maps_trains_and_keeps_them_through_saving_and_export(tmp_path):
    import keras
    import tensorflow as tf

    from tfhash.export import export_feature_model
    from tfhash.recipes import Recipe

    x, labels = cross_modal()
    recipe = Recipe(method="jcch", hidden=(32,), epochs=3, batch_size=32, input_map={"image": "rbf", "text": "standardise"})
    model = recipe.fit(x, labels, bits=16, seed=0)
    codes = {m: model.encode(v, m) for m, v in x.items()}
    names = {layer.name for layer in model.modality_backbone("image").layers}
    assert "backbone_image_rbf" in names and "backbone_image_standardise" in names
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    for m, v in x.items():
        np.testing.assert_array_equal(loaded.encode(v, m), codes[m])
    single = Recipe(method="scdh", hidden=(16,), epochs=2, batch_size=32, input_map="rbf").fit(x["image"], labels, bits=16, seed=0)
    export_feature_model(single, str(tmp_path / "saved"), "features", [12], 16)
    served = tf.saved_model.load(str(tmp_path / "saved")).signatures["encode_features"](features=tf.constant(x["image"]))
    np.testing.assert_array_equal(served["binary_codes"].numpy(), single.encode(x["image"]))  # raw vectors in, the map inside


def test_recipes_and_the_search_space_name_the_maps():
    from tfhash.recipes import RECOMMENDED, Recipe
    from tfhash.tuning.search import SEARCH_SPACES

    with pytest.raises(ValueError, match=r"input_map of 'image' is 'pca'; choose one of \['none', 'standardise', 'rbf'\]"):
        Recipe(method="jcch", input_map={"image": "pca"})
    assert Recipe(method="jcch", input_map={"image": "rbf"}).spec().towers(["image", "text"])["text"].input_map == "none"
    assert Recipe(method="jcch", input_map={"text": "rbf"}).spec().input_map == {"text": "rbf"}
    assert RECOMMENDED["cross-modal"].spec().method == "jcch"
    space = SEARCH_SPACES["cross-modal"]
    assert space.choices()["input_map"] == INPUT_MAPS
    assert "input_map" not in space.restricted(in_pipeline=True).choices()  # the pipeline's search: no maps
    assert "input_map" not in SEARCH_SPACES["single-label"].choices()  # a space without maps draws its trials as before
    values = {**space.values_of(RECOMMENDED["cross-modal"]), "input_map": "rbf"}
    assert space.recipe(values, ("image", "text")).input_map == "rbf"
    assert space.values_of(space.recipe(values, ("image", "text")))["input_map"] == "rbf"
