"""Recommended recipes (tfhash.recipes) and the Wiki benchmark that reads them.

(The benchmark's numbers come from `python -m benchmarks.wiki`, not from tests.)"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest

from benchmarks import wiki
from tfhash.recipes import DATA_KINDS, MEAN_TEACHER, RECOMMENDED, Recipe, recommended


def test_every_kind_has_a_checked_recipe_with_its_evidence():
    assert set(RECOMMENDED) == set(DATA_KINDS)
    for kind in DATA_KINDS:
        recipe = recommended(kind)
        assert recipe.chosen.startswith("python -m benchmarks.")  # the command that chose it
    with pytest.raises(ValueError, match="unknown kind"):
        recommended("audio")


def test_mean_teacher_settings_name_single_label_kinds_and_their_evidence():
    assert set(MEAN_TEACHER) == {"single-label", "single-label pixels"}
    for settings in MEAN_TEACHER.values():
        assert set(settings["options"]) == {"consistency", "noise"} and settings["chosen"].startswith("python -m benchmarks.")
        assert settings["options"]["consistency"] >= 0 and settings["options"]["noise"] > 0


@pytest.mark.parametrize("bad", [{"schedule": "step"}, {"epochs": 0}, {"epochs": 2.5}, {"dropout": 1.0},
                                 {"input_dropout": -0.1}, {"input_dropout": {"image": 1.5}}, {"learning_rate": 0.0},
                                 {"weight_decay": -1.0}])  # fmt: skip
def test_recipe_values_are_checked(bad):
    with pytest.raises(ValueError):
        Recipe(method="scdh", **bad)


@pytest.mark.parametrize(("bad", "message"), [
    ({"weight_decay": -0.05}, r"weight_decay must be a finite number >= 0 \(0: no decay\); got -0.05"),
    ({"weight_decay": float("nan")}, r"weight_decay .*; got nan"), ({"weight_decay": float("inf")}, r"weight_decay .*; got inf"),
    ({"weight_decay": "0.1"}, r"weight_decay .*; got '0.1'"), ({"momentum": float("nan")}, r"momentum must be .* in \[0, 1\); got nan"),
    ({"momentum": 1.0}, r"momentum .*; got 1.0"), ({"decay_rate": -1}, r"decay_rate must be .* in \(0, 1\]"),
    ({"decay_rate": float("nan")}, r"decay_rate .*; got nan"), ({"frozen_epochs": 1.5}, r"frozen_epochs .*; got 1.5"),
    ({"frozen_epochs": float("nan")}, r"frozen_epochs .*; got nan"), ({"decay_epochs": [-3]}, r"decay_epochs .*; got \[-3\]"),
    ({"decay_epochs": 100}, r"decay_epochs must be a list .*; got 100"),
    ({"freeze_batch_norm": "yes"}, r"freeze_batch_norm must be true or false; got 'yes'")])  # fmt: skip
def test_fine_tuning_values_are_checked_and_named(bad, message):
    """Every optimisation number of FineTuning is checked where it enters (NaN and infinity
    included, which comparisons let through), and the error echoes the value given."""
    from tfhash.fine_tuning import FineTuning

    with pytest.raises(ValueError, match=message):
        FineTuning(**bad)
    own = {f.name for f in dataclasses.fields(Recipe)}
    with pytest.raises(ValueError, match=message):  # a recipe's settings enter the same way
        Recipe(method="scdh", **bad) if set(bad) <= own else Recipe(method="scdh", fine_tuning=bad)
    FineTuning(weight_decay=0, momentum=0.0, decay_rate=1, frozen_epochs=0, decay_epochs=(5, 7))  # the edges are allowed


def test_optimizer_follows_weight_decay_and_schedule():
    plain = Recipe(method="scdh").optimizer(10)
    assert isinstance(plain, keras.optimizers.Adam) and not isinstance(plain, keras.optimizers.AdamW)
    assert float(plain.learning_rate) == pytest.approx(1e-3) and plain.l2 == 0.0
    decayed = Recipe(method="hyp2", weight_decay=0.05, schedule="cosine", epochs=4).optimizer(10)
    assert isinstance(decayed, keras.optimizers.AdamW) and decayed.weight_decay == 0.05
    schedule = decayed._learning_rate
    assert float(schedule(0)) == pytest.approx(1e-3) and float(schedule(40)) == pytest.approx(0.0, abs=1e-9)


def test_weight_averaging_ends_training_on_the_moving_average_of_the_weights():
    """FineTuning.weight_averaging (one setting of the spec's optimisation section): the trained
    weights are the average the optimizer kept, a_1 = w_1, a_t = d a_(t-1) + (1 - d) w_t."""
    from tfhash.fine_tuning import FineTuning

    finals = {}
    for decay in (0.0, 0.5):
        inputs = keras.Input((1,))
        model = keras.Model(inputs, keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(inputs))
        optimizer = FineTuning(optimizer="sgd", momentum=0.0, learning_rate=0.1, weight_averaging=decay).make_optimizer(3, 1)
        model.compile(optimizer=optimizer, loss=lambda y, p: keras.ops.mean(p))  # a gradient of 1 per step
        model.fit(np.ones((4, 1), "float32"), np.zeros((4, 1), "float32"), batch_size=4, epochs=3, verbose=0)
        finals[decay] = float(model.layers[-1].kernel.numpy().ravel()[0])
    steps = [0.9, 0.8, 0.7]  # the weight after each step
    average = steps[0]
    for weight in steps[1:]:
        average = 0.5 * average + 0.5 * weight
    assert finals == {0.0: pytest.approx(0.7), 0.5: pytest.approx(average)}  # 0.775
    for bad in (1.0, -0.1, True, "0.9"):
        with pytest.raises(ValueError, match="weight_averaging is the decay"):
            FineTuning(weight_averaging=bad)


def test_weight_averaging_from_a_recipe_and_a_pipeline_config():
    from tfhash.pipelines.config import PipelineConfig

    from tfhash.training_spec import TrainingSpec

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 8)).astype("float32"), np.arange(64) % 4
    base = Recipe(method="scdh", hidden=(16,), epochs=2, batch_size=16)
    averaged = dataclasses.replace(base, fine_tuning={"weight_averaging": 0.9})
    assert averaged.spec().fine_tuning.weight_averaging == 0.9 and averaged.optimizer(4).use_ema
    plain, smooth = (recipe.fit(x, y, bits=16, seed=0) for recipe in (base, averaged))
    assert not np.allclose(plain.get_weights()[0], smooth.get_weights()[0])  # the same seed, the average kept
    with pytest.raises(ValueError, match="the recipe's own fields"):
        Recipe(method="scdh", fine_tuning={"dropout": 0.5})
    config = PipelineConfig(name="x", modality="x", training={"backbone": "mlp", "fine_tuning": {"weight_averaging": 0.99}})
    assert config.training.fine_tuning.weight_averaging == 0.99
    assert TrainingSpec.from_dict(config.training.to_dict()) == config.training  # what run_fn reads
    recipe_section = PipelineConfig(name="x", modality="x", training={"recipe": "multi-label", "fine_tuning": {"weight_averaging": 0.9}})
    assert recipe_section.training.fine_tuning.weight_averaging == 0.9 and isinstance(
        recipe_section.training.fine_tuning.make_optimizer(1, 1), keras.optimizers.AdamW)  # the recipe's decay: AdamW


def test_wiki_recipe_parsing():
    assert wiki.parse_recipe("recommended") == ("recommended", RECOMMENDED["cross-modal"])
    label, recipe = wiki.parse_recipe('{"hidden": [64], "epochs": 3}')
    assert recipe.hidden == (64,) and recipe.epochs == 3 and recipe.options == RECOMMENDED["cross-modal"].options
    assert label == '{"epochs": 3, "hidden": [64]}'
    for bad in ('{"hiden": [64]}', "[1, 2]", "fast", '{"method": "scdh"}'):
        with pytest.raises(ValueError):
            wiki.parse_recipe(bad)
    with pytest.raises(ValueError, match="cross-modal"):
        wiki.run(dataclasses.replace(RECOMMENDED["cross-modal"], method="scdh"), 16, 0)


def test_each_tower_takes_its_own_widths_and_every_tower_setting_names_the_data_towers():
    rng = np.random.default_rng(0)
    x = {"image": rng.random((24, 12), dtype=np.float32), "text": rng.random((24, 5), dtype=np.float32)}
    labels = np.arange(24) % 3
    recipe = dataclasses.replace(RECOMMENDED["cross-modal"], hidden={"image": [16, 8], "text": []}, epochs=1)
    assert recipe.hidden == {"image": (16, 8), "text": ()} and recipe.spec().hidden == {"image": [16, 8], "text": []}
    model = recipe.build(x, labels, bits=16)
    widths = {m: [layer.units for layer in model.modality_backbone(m).layers if isinstance(layer, keras.layers.Dense)]
              for m in ("image", "text")}  # fmt: skip
    assert widths == {"image": [16, 8], "text": []}
    label, parsed = wiki.parse_recipe('{"hidden": {"image": [16, 8], "text": []}}')
    assert parsed.hidden == recipe.hidden and label == '{"hidden": {"image": [16, 8], "text": []}}'
    refusals = {"hidden": ({"image": [16]}, r"hidden names the towers \['image'\]; the data's towers are \['image', 'text'\]: give one list of widths, or name each"),
                "input_dropout": ({"audio": 0.2}, r"input_dropout names the towers \['audio'\]"),
                "input_map": ({"txt": "rbf"}, r"input_map names the towers \['txt'\]")}  # fmt: skip
    for name, (value, message) in refusals.items():
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(recipe, **{name: value}).build(x, labels, bits=16)
    for bad in ({}, [16, 0], {"image": [16.5]}, "1024"):
        with pytest.raises(ValueError, match="hidden"):
            dataclasses.replace(recipe, hidden=bad)


def test_wiki_validation_holds_out_training_pairs_and_scores_both_directions():
    (train, train_y), (query, query_y), (database, _) = wiki.wiki_data(seed=0, validation=True)
    assert len(query_y) == wiki.VALIDATION_QUERIES and len(train_y) == 2173 - wiki.VALIDATION_QUERIES
    np.testing.assert_array_equal(database["image"], train["image"])  # the protocol: the database is the training set
    np.testing.assert_allclose(train["image"].mean(axis=0), 0.0, atol=1e-4)  # standardised on the training rows
    recipe = dataclasses.replace(RECOMMENDED["cross-modal"], hidden=(32,), epochs=2)
    row = wiki.run(recipe, 16, seed=0, validation=True, every=1)
    assert [p["epoch"] for p in row["curve"]] == [1, 2] and row["curve"][-1]["I->T"] == row["I->T"]
    assert 0.0 < row["I->T"] <= 1.0 and 0.0 < row["T->I"] <= 1.0 and row["mode"] == "validation"
    assert all(0.0 <= row[f"{m} db on centre"] <= 1.0 for m in ("image", "text"))


def test_ranking_codes_order_classes_by_score():
    scores = np.random.default_rng(0).random((50, 10))
    queries, classes = wiki.ranking_codes(scores)
    assert queries.shape[1] % 8 == 0 and set(np.unique(queries)) == {-1, 1}
    distances = (queries[:, None, :] != classes[None]).sum(axis=-1)
    np.testing.assert_array_equal(np.argsort(distances, axis=1), np.argsort(-scores, axis=1))


def test_reported_wiki_rows_used_the_current_recipes():
    """The "recommended" and "paper-like" rows of benchmarks/results/wiki.json were trained with the
    recipes as they stand: a changed recipe without a rerun fails here."""
    import json

    rows = json.loads((wiki.RESULTS_DIR / "wiki.json").read_text())["rows"]
    for label, recipe in wiki.NAMED.items():
        expected = json.loads(json.dumps({k: v for k, v in dataclasses.asdict(recipe).items() if k != "chosen"}))
        defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                    for f in dataclasses.fields(Recipe)}  # fmt: skip
        mine = [r for r in rows if r["recipe label"] == label]
        assert sorted((r["bits"], r["seed"]) for r in mine) == [(b, s) for b in (16, 32, 64) for s in (0, 1, 2)]
        # a setting added after a row was run counts as the same recipe only while the recipe keeps its default
        assert all(r["recipe"] == {k: v for k, v in expected.items() if k in r["recipe"] or v != defaults[k]} for r in mine)


@pytest.mark.parametrize(("x", "labels", "message"), [
    (np.zeros((0, 8), "float32"), np.zeros(0, int), r"^no rows to train on: x has 0 rows and labels 0; pass examples of at least two classes$"),
    (np.zeros((0, 8), "float32"), np.arange(5), r"^no rows to train on: x has 0 rows and labels 5;"),
    (np.ones((1, 8), "float32"), np.array([0]), r"^the labels hold 1 class over 1 labelled row; hashing learns codes"),
    (np.ones((6, 8), "float32"), np.zeros(6, int), r"^the labels hold 1 class over 6 labelled rows;"),
    (np.ones((6, 8), "float32"), np.arange(5), r"^x has \[6\] rows but labels have 5; pass one label row per example$"),
])  # fmt: skip
def test_training_data_that_cannot_train_is_refused_before_training(x, labels, message):
    from tfhash.tuning import Budget, tune

    with pytest.raises(ValueError, match=message):
        recommended("single-label pixels").fit(x, labels, bits=16, epochs=1)
    with pytest.raises(ValueError, match=message):
        tune(x, labels, bits=16, budget=Budget(max_units=3, trials=1))


def test_encoding_the_wrong_inputs_names_the_shape_the_model_takes():
    import tensorflow as tf

    from tfhash.labels import LabelError, multi_hot
    from tfhash.models.inputs import InputError

    x = np.random.default_rng(0).random((12, 8)).astype("float32")
    model = recommended("single-label pixels").build(x, np.arange(12) % 3, bits=16)
    with pytest.raises(InputError, match=r"^x has shape \(5, 7\); this model encodes inputs of shape \(n, 8\): pass the features"):
        model.encode(x[:5, :7])
    bad = tf.data.Dataset.from_tensor_slices(np.where(np.eye(4, 8) > 0, np.nan, 0).astype("float32")).batch(4)
    with pytest.raises(Exception, match="a batch of the dataset holds NaN") as caught:
        model.encode(bad)
    assert "\\'" not in str(caught.value)
    with pytest.raises(LabelError, match=r"its rows have different lengths \(a ragged list"):
        multi_hot([[1, 2], [3]])


def test_per_tower_settings_resolve_into_one_typed_tower_each():
    from tfhash.fine_tuning import FineTuning
    from tfhash.registry import make_backbone
    from tfhash.towers import Tower
    from tfhash.training_spec import TrainingSpec

    spec = TrainingSpec(method="jcch", backbone="mlp", hidden={"image": [8], "text": []}, input_map={"text": "rbf"},
                        fine_tuning={"input_dropout": {"image": 0.2}})  # fmt: skip
    assert spec.towers(["image", "text"]) == {"image": Tower((8,), "none", 0.2), "text": Tower((), "rbf", 0.0)}
    assert TrainingSpec(backbone="mlp", hidden=[16], input_map="standardise").towers(["x"]) == {"x": Tower((16,), "standardise", 0.0)}
    with pytest.raises(ValueError, match=r"training.input_map names the towers \['txt'\]; the data's towers are \['image', 'text'\]"):
        TrainingSpec(method="jcch", backbone="mlp", input_map={"txt": "rbf"}).towers(["image", "text"])
    with pytest.raises(ValueError, match=r"input_dropout of 'image' must be a dropout rate in \[0, 1\), got 1.5"):
        TrainingSpec(method="jcch", backbone="mlp", fine_tuning={"input_dropout": {"image": 1.5}})
    with pytest.raises(ValueError, match="backbone 'small_cnn' takes images: drop them"):
        TrainingSpec(fine_tuning={"input_dropout": 0.1})
    with pytest.raises(ValueError, match="pass tower=spec.towers"):
        make_backbone(spec, [8])
    tower = make_backbone(spec, [8], "backbone_image", spec.towers(["image", "text"])["image"])
    assert [layer.units for layer in tower.layers if isinstance(layer, keras.layers.Dense)] == [8]
    # the recipes' optimizer: AdamW when decayed, else Adam
    plain = FineTuning(optimizer="auto").make_optimizer(1, 1)
    assert isinstance(plain, keras.optimizers.Adam) and not isinstance(plain, keras.optimizers.AdamW)
    assert isinstance(FineTuning(optimizer="auto", weight_decay=0.01).make_optimizer(1, 1), keras.optimizers.AdamW)


def test_a_section_naming_the_photo_recipe_trains_it_under_its_own_keys():
    from dataclasses import replace

    from tfhash.recipes import RECOMMENDED_PHOTOS, with_recipe
    from tfhash.training_spec import PHOTOS, TrainingSpec

    assert TrainingSpec.from_dict(with_recipe({"recipe": PHOTOS})) == replace(RECOMMENDED_PHOTOS, recipe=PHOTOS)
    mine = TrainingSpec.from_dict(with_recipe({"recipe": PHOTOS, "bits": 64, "fine_tuning": {"dropout": 0.2, "trunk_cache": {"views": 4}}}))
    cache = mine.fine_tuning.trunk_cache
    assert (mine.bits, mine.fine_tuning.dropout, cache.views) == (64, 0.2, 4)  # the section's keys win
    assert (cache.cut, cache.mixup, mine.fine_tuning.backbone_learning_rate) == (RECOMMENDED_PHOTOS.fine_tuning.trunk_cache.cut,
                                                                                 RECOMMENDED_PHOTOS.fine_tuning.trunk_cache.mixup,
                                                                                 RECOMMENDED_PHOTOS.fine_tuning.backbone_learning_rate)  # fmt: skip
    assert TrainingSpec.from_dict(with_recipe({"recipe": PHOTOS, "fine_tuning": {"trunk_cache": None}})).fine_tuning.trunk_cache is None
    with pytest.raises(ValueError, match="trains a pretrained image network; drop backbone 'mlp'"):
        with_recipe({"recipe": PHOTOS, "backbone": "mlp"})
    with pytest.raises(ValueError, match="trains 'scdh' at 48 bits; drop method 'hyp2'"):
        with_recipe({"recipe": PHOTOS, "method": "hyp2"})
    with pytest.raises(ValueError, match="'single-label photos' for single-label images"):
        with_recipe({"recipe": "single-label", "backbone": "efficientnet_lite0"})
    with pytest.raises(ValueError, match="with an image network"):
        TrainingSpec(recipe=PHOTOS, backbone="mlp")


def test_the_photo_recipe_takes_the_loss_validation_chose_for_its_code_length():
    from dataclasses import replace

    from tfhash.recipes import (
        RECOMMENDED_PHOTOS,
        SHORT_PHOTO_CODES,
        recommended_photos,
        with_recipe,
    )
    from tfhash.training_spec import PHOTOS, TrainingSpec

    assert recommended_photos() == RECOMMENDED_PHOTOS and RECOMMENDED_PHOTOS.bits > SHORT_PHOTO_CODES
    assert recommended_photos(SHORT_PHOTO_CODES + 8, seed=2) == replace(RECOMMENDED_PHOTOS, bits=SHORT_PHOTO_CODES + 8, seed=2)
    for bits in (16, SHORT_PHOTO_CODES):
        short = recommended_photos(bits, seed=1)
        assert (short.method, short.overrides, short.bits, short.seed) == ("hclm", {"triplet_weight": 2.0, "pairwise_weight": 1.0}, bits, 1)
        # no mixup (it mixes SCDH's label weights); the network, cut, views, rates and schedule are the recipe's
        assert short.fine_tuning == replace(RECOMMENDED_PHOTOS.fine_tuning,
                                            trunk_cache=replace(RECOMMENDED_PHOTOS.fine_tuning.trunk_cache, mixup=0.0))
        assert (short.backbone, short.image_size, short.epochs) == (RECOMMENDED_PHOTOS.backbone, RECOMMENDED_PHOTOS.image_size,
                                                                    RECOMMENDED_PHOTOS.epochs)  # fmt: skip
        # a pipeline section naming the recipe takes it at the section's bits
        assert TrainingSpec.from_dict(with_recipe({"recipe": PHOTOS, "bits": bits, "seed": 1})) == replace(short, recipe=PHOTOS)
    with pytest.raises(ValueError, match="trains 'hclm' at 32 bits; drop method 'scdh' or the recipe"):
        with_recipe({"recipe": PHOTOS, "bits": 32, "method": "scdh"})
    for bits in (12, "32", 0):
        with pytest.raises(ValueError, match=f"bits must be a positive multiple of 8.*got {bits!r}"):
            recommended_photos(bits)
