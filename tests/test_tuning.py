"""tfhash.tuning: the search space, the budget, the validation split, the rule that keeps the
recommended recipe, the failures and the command (the searches themselves: test_tuning_search.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from tests.tuning_fixtures import SMALL, chosen_row, clusters
from tfhash.recipes import RECOMMENDED, Recipe
from tfhash.registry import Method, register_method, unregister_method
from tfhash.tuning import (
    KEEP_RECOMMENDED_WITHIN,
    OBJECTIVE,
    SEARCH_SPACES,
    Budget,
    SearchSpace,
    TuningError,
    beats,
    carve_validation,
    data_kind,
    prepare,
    tune,
)
from tfhash.tuning.search import SAME


@pytest.mark.parametrize("kind", sorted(SEARCH_SPACES))
def test_every_space_holds_its_recommended_recipe_and_reads_it_back(kind):
    space = SEARCH_SPACES[kind]
    recommended = RECOMMENDED[kind]
    values = space.values_of(recommended)
    hp = space.hyperparameters(recommended)
    assert {h.name: h.default for h in hp.space} == values
    modalities = ("image", "text") if kind == "cross-modal" else ()
    rebuilt = space.recipe(values, modalities)
    for name in ("method", "options", "hidden", "dropout", "input_dropout", "learning_rate", "weight_decay", "schedule", "epochs"):
        assert getattr(rebuilt, name) == getattr(recommended, name), name


def test_the_cross_modal_space_searches_the_second_towers_widths():
    space = SEARCH_SPACES["cross-modal"]
    assert SAME in space.choices()["second_hidden"] and len(space.choices()["second_hidden"]) > 1
    values = {**space.values_of(RECOMMENDED["cross-modal"]), "second_hidden": "1024"}
    recipe = space.recipe(values, ("image", "text"))
    assert recipe.hidden == {"image": RECOMMENDED["cross-modal"].hidden, "text": (1024,)}
    assert space.values_of(recipe) == values  # read back: the inverse
    assert space.recipe({**values, "second_hidden": SAME}, ("image", "text")).hidden == RECOMMENDED["cross-modal"].hidden
    assert "second_hidden" not in SEARCH_SPACES["multi-label"].choices()  # a one-tower space draws as before


def test_the_space_keeps_only_the_methods_the_caller_can_train():
    space = SEARCH_SPACES["single-label"]
    assert any(method == "mt-scdh" for method, _ in space.methods.values())
    assert all(method != "mt-scdh" for method, _ in space.restricted().methods.values())
    assert any(method == "mt-scdh" for method, _ in space.restricted(semi_supervised=True).methods.values())
    assert all(method != "mt-scdh" for method, _ in space.restricted(in_pipeline=True, semi_supervised=True).methods.values())
    pixels = SEARCH_SPACES["single-label pixels"]  # its recommended MT-SCDH trains on the labelled rows alone
    recommended = (RECOMMENDED["single-label pixels"].method, RECOMMENDED["single-label pixels"].options)
    assert recommended in pixels.restricted().methods.values() and pixels.restricted().semi_supervised == ()
    assert set(pixels.restricted(semi_supervised=True).semi_supervised) == set(pixels.semi_supervised) != set()
    with pytest.raises(TuningError, match="no method to train"):
        SearchSpace(methods={}).restricted()
    with pytest.raises(TuningError, match="has no values"):
        SearchSpace(methods={"scdh": ("scdh", {})}, dropout=()).hyperparameters()


def test_budget_states_its_cost_and_refuses_a_budget_without_a_trial():
    # KerasTuner's Hyperband at 9 units, factor 3: 9x1 + 3x3 + 1x9, 5x3 + 2x9, 3x9 = 87 units.
    assert Budget().schedule() == [(9, 1), (3, 3), (1, 9), (5, 3), (2, 9), (3, 9)]
    assert Budget().multiple() == pytest.approx(1 + 87 / 9)  # and the recommended recipe's full training
    for bad in ({"trials": 0}, {"seconds": 0}, {"max_units": 2, "factor": 3}):
        with pytest.raises(TuningError, match="budget"):
            Budget(**bad)


@pytest.mark.parametrize("factor", [2, 3, 4])
def test_the_stated_schedule_is_the_one_keras_tuner_runs(factor):
    # The one place that reads KerasTuner's (private) arithmetic: a KerasTuner that schedules
    # differently fails here, not silently in the cost a budget states.
    import keras_tuner

    for max_units in range(factor, 40):
        oracle = keras_tuner.oracles.HyperbandOracle(objective=keras_tuner.Objective("score", "max"), max_epochs=max_units, factor=factor)
        expected = [(oracle._get_size(b, r), oracle._get_epochs(b, r)) for b in reversed(range(oracle._get_num_brackets()))
                    for r in range(b + 1)]  # fmt: skip
        assert Budget(max_units=max_units, factor=factor).schedule() == expected, max_units
        assert Budget(max_units=max_units, factor=factor, iterations=2).schedule() == expected * 2


def test_validation_split_is_carved_from_the_rows_and_refuses_too_few_labels():
    x, y = clusters(n_per_class=40)
    labels = np.eye(5, dtype="float32")[y]
    split = carve_validation(labels, seed=0)
    assert len(split.query) == 5 * 4 and not set(split.query) & set(split.train)
    assert not set(split.query) & set(split.database)
    assert set(split.database) - set(split.train) and set(split.database) & set(split.train)  # held out + trained rows
    assert data_kind(x, labels) == "single-label"
    few_x, few_y = clusters(n_per_class=10)
    with pytest.raises(TuningError, match="too few labelled rows.*10 rows per class.*at least 20 per class"):
        tune(few_x, few_y, bits=16, budget=SMALL)
    with pytest.raises(TuningError, match="too few labelled rows.*50 rows.*at least 100"):
        tune(x[:50], y[:50], bits=16, budget=SMALL)  # classes of uneven sizes: held out at random
    multi = (np.random.default_rng(0).random((60, 6)) < 0.4).astype("float32")
    multi[:, 0] = 1
    assert data_kind(np.zeros((60, 3)), multi) == "multi-label"
    with pytest.raises(TuningError, match="60 rows, a validation split needs at least 100"):
        carve_validation(multi, seed=0)


def test_a_trial_replaces_the_recommended_recipe_only_by_a_gain_that_loses_no_score():
    incumbent = {OBJECTIVE: 0.50, "image->text": 0.30, "text->image": 0.70}
    assert beats({OBJECTIVE: 0.51, "image->text": 0.30, "text->image": 0.72}, incumbent, 0.005)
    assert beats({OBJECTIVE: 0.51, "image->text": 0.296, "text->image": 0.724}, incumbent, 0.005)  # a loss within the margin
    assert not beats({OBJECTIVE: 0.504, "image->text": 0.30, "text->image": 0.708}, incumbent, 0.005)  # a gain within noise
    assert not beats({OBJECTIVE: 0.51, "image->text": 0.28, "text->image": 0.74}, incumbent, 0.005)  # one direction traded
    assert not beats({OBJECTIVE: 0.74, "mAP@1000": 0.80}, {OBJECTIVE: 0.73, "mAP@1000": 0.82}, 0.005)  # mAP@1000 lost
    assert beats({OBJECTIVE: 0.50}, {OBJECTIVE: 0.50}, 0.0)  # margin 0: any gain that loses nothing
    x, y = clusters()
    paired = {"image": x, "text": x[:, :8] + np.random.default_rng(2).normal(size=(len(x), 8)).astype("float32")}
    cross = replace(SEARCH_SPACES["cross-modal"], epochs=(6,))
    # the search applies the same rule to its trials (margin 0: test_tuning_search.py)
    # Hyperband at 3 units: the recommended recipe, 3 trials of 1 unit, 1 promoted and 2 new ones of 3 units
    result = tune(paired, y, bits=16, budget=Budget(max_units=3), space=cross)
    assert sum(t["units"] == 3 for t in result.trials) == 4
    assert result.score == pytest.approx(chosen_row(result.trials, KEEP_RECOMMENDED_WITHIN)["score"])
    with pytest.raises(TuningError, match="margin must be >= 0.*got -1"):
        tune(x, y, bits=16, budget=SMALL, margin=-1.0)


def test_a_failing_trial_is_recorded_and_skipped_and_all_failing_is_an_error():
    def broken(inputs, **options):
        raise RuntimeError("this builder always fails")

    register_method(Method("broken-for-test", "Broken", broken))
    try:
        x, y = clusters()
        mixed = SearchSpace(methods={"broken": ("broken-for-test", {}), "scdh": ("scdh", {})}, epochs=(6,))
        result = tune(x, y, bits=16, budget=Budget(max_units=3, trials=4), space=mixed)
        statuses = {t["variant"]: t["status"] for t in result.trials}
        assert statuses.get("broken") == "failed" and statuses.get("scdh") == "ok"
        assert "this builder always fails" in next(t["error"] for t in result.trials if t["status"] == "failed")
        assert result.recipe.method == "scdh"
        with pytest.raises(TuningError, match="all 2 trials failed.*always fails"):
            tune(x, y, bits=16, budget=Budget(max_units=3, trials=2), space=SearchSpace(methods={"b": ("broken-for-test", {})}))
    finally:
        unregister_method("broken-for-test")


def test_non_finite_losses_fail_the_trial_not_the_search():
    x, y = clusters()
    exploding = SearchSpace(methods={"scdh": ("scdh", {})}, learning_rate=(1e30,), epochs=(6,))
    with pytest.raises(TuningError, match="all 1 trials failed.*non-finite"):
        tune(x, y, bits=16, budget=Budget(max_units=3, trials=1), space=exploding)


def test_bad_inputs_are_refused_before_any_trial():
    x, y = clusters()
    with pytest.raises(ValueError, match="rows"):
        tune(x[:-1], y, bits=16, budget=SMALL)
    bad = x.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN|finite"):
        tune(bad, y, bits=16, budget=SMALL)
    with pytest.raises(ValueError, match="multiple of 8"):
        tune(x, y, bits=12, budget=SMALL)
    with pytest.raises(ValueError, match="unlabelled rows must be"):
        tune(x, y, bits=16, budget=SMALL, unlabelled=np.zeros((5, 3), "float32"))


def test_cli_tune_writes_the_recipe_and_trials(tmp_path):
    from tfhash.cli import main

    x, y = clusters()
    data = tmp_path / "data.npz"
    np.savez(data, x=x, labels=y)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["tune", str(data), "--bits", "16", "--max-units", "3", "--trials", "2", "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "tuning.json").read_text())
    assert len(summary["trials"]) == 2 and summary["recipe"]["method"] and "chosen:" in result.output
    assert summary["unlabelled"] is False and "pass them" not in result.output
    assert Recipe(**{**summary["recipe"], "hidden": tuple(summary["recipe"]["hidden"])}).method == summary["recipe"]["method"]
    np.savez(data, features=x, labels=y)
    refused = CliRunner().invoke(main, ["tune", str(data), "--output-dir", str(out)])
    assert refused.exit_code == 2 and "needs 'labels' and 'x'" in refused.output


def test_uneven_classes_are_held_out_at_random_and_a_wrong_kind_is_refused():
    x, y = clusters(n_per_class=200, classes=3)
    keep = np.concatenate([np.flatnonzero(y == 0), np.flatnonzero(y == 1), np.flatnonzero(y == 2)[:25]])
    split = carve_validation(np.eye(3, dtype="float32")[y[keep]], seed=0)
    assert len(split.train) == len(keep) - int(len(keep) * 0.2)  # training keeps every row not held out
    assert len(split.query) == int(len(keep) * 0.2) // 2
    with pytest.raises(TuningError, match="kind 'multi-label' does not fit.*single-label"):
        tune(x, y, bits=16, kind="multi-label", budget=SMALL)
    with pytest.raises(TuningError, match="unknown kind of data 'single-label photo'; choose one of .*'single-label photos'"):
        tune(x, y, bits=16, kind="single-label photo", budget=SMALL)  # the photos' kind is named among the choices
    with pytest.raises(TuningError, match="the pipeline's Tuner searches the recipes of.*these are single-label data"):
        prepare(x, y, bits=16, in_pipeline=True)  # as the Tuner component calls it
    with pytest.raises(ValueError, match="dict of 3 modalities"):
        tune({"a": x, "b": x, "c": x}, y, bits=16, budget=SMALL)


def test_the_tuner_is_importable_from_tuning_and_subclassable():
    import keras_tuner

    from tfhash import tuning
    from tfhash.tuning import tuner

    assert tuning.RecipeTuner is tuner.RecipeTuner and issubclass(tuner.RecipeTuner, keras_tuner.Tuner)
    assert issubclass(tuner.RecipeOracle, keras_tuner.oracles.HyperbandOracle)
    with pytest.raises(AttributeError, match="no attribute 'RecipeTunner'"):
        tuning.RecipeTunner  # noqa: B018 - a misspelt name is refused as for any module
