"""tfhash.tuning's searches run for real on small clustered data: the first trial is the
recommended recipe, each trial trains on the rows its variant takes, the choice follows the margin,
the seed determines the search, and the kinds of data score what they should."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from tests.tuning_fixtures import SMALL, chosen_row, clusters
from tfhash.recipes import Recipe
from tfhash.tuning import (
    KEEP_RECOMMENDED_WITHIN,
    SEARCH_SPACES,
    Budget,
    SearchSpace,
    TuneResult,
    TuningError,
    prepare,
    tune,
)


def test_only_semi_supervised_variants_train_on_the_unlabelled_rows():
    x, y = clusters()
    extra = clusters(seed=1)[0][:40]
    mt = {"consistency": 0.0, "noise": 1.0}
    space = SearchSpace(methods={"mt": ("mt-scdh", mt), "mt semi": ("mt-scdh", {**mt, "consistency": 5.0})},
                        semi_supervised=("mt semi",))  # fmt: skip
    task, _ = prepare(x, y, bits=16, budget=SMALL, space=space, unlabelled=extra)
    train = len(task.split.train)
    assert len(task.training_rows("mt")[0]) == train and len(task.training_rows("mt semi")[0]) == train + len(extra)
    assert list(prepare(x, y, bits=16, budget=SMALL, space=space)[0].space.methods) == ["mt"]  # no unlabelled rows
    # each trial trains on the rows its variant takes
    fitted = []
    original = Recipe.fit

    def spy(self, x, labels, *args, **kwargs):
        fitted.append((self.options["consistency"], len(x)))
        return original(self, x, labels, *args, **kwargs)

    small = replace(space, epochs=(3,), hidden=((16,),))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Recipe, "fit", spy)
        searched = tune(x, y, bits=16, budget=Budget(max_units=3, trials=4), space=small, unlabelled=extra)
    assert all(rows == train + (len(extra) if consistency == 5 else 0) for consistency, rows in fitted)
    assert {consistency for consistency, _ in fitted} == {0.0, 5.0}  # both variants were tried (seeded)
    assert searched.unlabelled == (searched.recipe.options["consistency"] == 5.0)
    recipe = Recipe(method="mt-scdh", options=mt, hidden=(16,), epochs=1)
    result = TuneResult(recipe=recipe, trials=[], score=0.5, kind="single-label", validation="", budget=SMALL, seconds=0.0, bits=16)
    assert result.fit(x, y).encode(x[:3]).shape == (3, 16)  # the labelled rows alone, as its trials
    assert replace(result, unlabelled=True).fit(x, y, unlabelled=extra).encode(x[:3]).shape == (3, 16)
    with pytest.raises(ValueError, match="trained on labelled rows only: drop unlabelled"):
        result.fit(x, y, unlabelled=extra)
    with pytest.raises(ValueError, match="trained with unlabelled rows: pass them"):
        replace(result, unlabelled=True).fit(x, y)
    with pytest.raises(TuningError, match="no variant of the single-label search space trains on them"):
        prepare(x, y, bits=16, budget=SMALL, space=SearchSpace(methods={"scdh": ("scdh", {})}), unlabelled=extra)
    with pytest.raises(TuningError, match=r"semi_supervised names \['typo'\]"):
        SearchSpace(methods={"mt": ("mt-scdh", mt)}, semi_supervised=("typo",))
    with pytest.raises(TuningError, match="take no unlabelled rows"):
        SearchSpace(methods={"scdh": ("scdh", {})}, semi_supervised=("scdh",)).restricted(semi_supervised=True)


def test_a_space_searches_further_fine_tuning_settings_by_name():
    """SearchSpace.fine_tuning searches any further FineTuning setting (here weight averaging) as
    the hyperparameter fine_tuning.<name>; the chosen value is the recipe's, which trains with it."""
    space = SearchSpace(methods={"scdh": ("scdh", {})}, fine_tuning={"weight_averaging": (0.0, 0.9)})
    assert space.choices()["fine_tuning.weight_averaging"] == (0.0, 0.9)
    values = {**space.values_of(Recipe(method="scdh", epochs=20)), "fine_tuning.weight_averaging": 0.9}
    recipe = space.recipe(values)
    assert recipe.fine_tuning == {"weight_averaging": 0.9} and space.values_of(recipe) == values
    assert space.hyperparameters(recipe).values["fine_tuning.weight_averaging"] == 0.9
    assert "fine_tuning.weight_averaging" not in SEARCH_SPACES["single-label"].choices()  # the shipped spaces draw as before
    with pytest.raises(TuningError, match=r"fine_tuning searches \['learning_rate'\]"):
        SearchSpace(methods={"scdh": ("scdh", {})}, fine_tuning={"learning_rate": (0.1,)})
    x, y = clusters()
    result = tune(x, y, bits=16, seed=0, budget=SMALL, space=space)
    assert {t["status"] for t in result.trials} == {"ok"} and result.recipe.optimizer(4).use_ema == bool(
        result.recipe.fine_tuning["weight_averaging"])  # fmt: skip


def test_tune_starts_from_the_recommended_recipe_and_returns_a_trainable_recipe(caplog):
    x, y = clusters()
    result = tune(x, y, bits=16, seed=0, budget=SMALL)
    # each trial's new model retraces Keras's predict function: expected, and not shown to the user
    assert not [r.getMessage()[:80] for r in caplog.records if "retracing" in r.getMessage()]
    first = result.trials[0]
    assert first["variant"].endswith("(recommended options)") and first["units"] == 3 and first["status"] == "ok"  # full fidelity
    assert len(result.trials) == 3 and all(t["status"] == "ok" and 0 <= t["score"] <= 1 for t in result.trials)
    chosen = chosen_row(result.trials, KEEP_RECOMMENDED_WITHIN)
    assert result.score == pytest.approx(chosen["score"])
    assert isinstance(result.recipe, Recipe) and result.recipe.method == SEARCH_SPACES["single-label"].methods[chosen["variant"]][0]
    assert "validation mAP@all" in result.recipe.chosen and result.kind == "single-label"
    model = result.recipe.fit(x, y, bits=16, seed=0, epochs=2)
    assert model.encode(x[:4]).shape == (4, 16)
    assert "| trial |" in result.table() and json.dumps(result.summary())


def test_unlabelled_rows_bring_mt_scdh_and_cross_modal_data_scores_both_directions():
    x, y = clusters()
    rest, _ = clusters(n_per_class=20, seed=1)
    mean_teacher = SearchSpace(methods={"mt": ("mt-scdh", {"consistency": 5.0, "noise": 0.1})}, epochs=(6,), semi_supervised=("mt",))
    result = tune(x, y, bits=16, budget=Budget(max_units=3, trials=1), space=mean_teacher, unlabelled=rest)
    assert result.recipe.method == "mt-scdh" and result.trials[0]["status"] == "ok" and result.unlabelled
    with pytest.raises(TuningError, match="no method to train"):  # a semi-supervised variant needs the unlabelled rows
        tune(x, y, bits=16, budget=Budget(max_units=3, trials=1), space=mean_teacher)
    paired = {"image": x, "text": x[:, :8] + np.random.default_rng(2).normal(size=(len(x), 8)).astype("float32")}
    cross = replace(SEARCH_SPACES["cross-modal"], epochs=(6,), input_dropout=(0.2,))
    result = tune(paired, y, bits=16, budget=Budget(max_units=3, trials=1), space=cross)
    assert result.kind == "cross-modal" and 0 < result.score <= 1
    trial = result.trials[0]  # both directions recorded, the score their mean
    assert trial["score"] == pytest.approx((trial["image->text"] + trial["text->image"]) / 2)
    assert "| image->text | text->image |" in result.table()
    assert result.recipe.method == "jcch" and result.recipe.input_dropout == {"image": 0.2}


def test_the_search_is_determined_by_its_seed_and_margin_zero_takes_the_best_full_trial():
    """The margin only chooses among the trials, so two searches of one seed, the second with
    margin 0, run the same trials; margin 0 takes the best score of the top fidelity."""
    x, y = clusters()
    space = SearchSpace(methods={"scdh": ("scdh", {}), "hclm": ("hclm", {})}, epochs=(3,))
    results = [tune(x, y, bits=16, seed=0, space=space, budget=Budget(max_units=3, trials=4), margin=margin)
               for margin in (KEEP_RECOMMENDED_WITHIN, 0.0)]  # fmt: skip
    runs = [[(t["variant"], t["dropout"], t["learning_rate"], t["units"]) for t in result.trials] for result in results]
    assert runs[0] == runs[1]
    top = max(t["units"] for t in results[1].trials)
    assert results[1].score == pytest.approx(max(t["score"] for t in results[1].trials if t["units"] == top))


def test_multi_label_trials_record_map_at_1000_of_the_validation_database():
    x, y = clusters(n_per_class=80, classes=4)
    labels = np.eye(4, dtype="float32")[y]
    labels[::3, (y[::3] + 1) % 4] = 1  # a third of the rows carry a second label
    space = SearchSpace(methods={"scdh": ("scdh", {})}, epochs=(4,))
    trial = tune(x, labels, bits=16, space=space, budget=Budget(max_units=3, trials=1)).trials[0]
    # the validation database is under 1,000 rows: mAP@1000 ranks all of it, as mAP@all does
    assert trial["status"] == "ok" and trial["mAP@1000"] == pytest.approx(trial["score"])
