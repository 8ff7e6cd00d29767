"""The peer protocol's inputs (digest-checked, real files in ../shared/data), the validation
split recipes are chosen on, and the peer benchmark's train-and-score on small data.
(The benchmark's numbers come from `python -m benchmarks.peers`, not from tests.)"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import peer_data, peers
from tfhash.data.splits import validation_split


@pytest.mark.parametrize("name", ["mnist", "mirflickr"])
def test_peer_inputs_match_the_protocol_digests(name):
    data = peer_data.load_peer_data(name)
    assert data.checks == {"labels": "digest", "split": "digest", "x": "digest"}
    assert data.single_label == (name == "mnist")
    assert np.isin(data.split.train, data.split.database).all() and not np.isin(data.split.query, data.split.database).any()


def test_inputs_that_are_not_the_protocols_are_refused(monkeypatch):
    monkeypatch.setitem(peer_data.DIGESTS, "mnist", {**peer_data.DIGESTS["mnist"], "split": "0000000000000000"})
    with pytest.raises(peer_data.PeerDataError, match="mnist split: digest 9e2db8b1d3a3778a is not the protocol's"):
        peer_data.load_peer_data("mnist")
    with pytest.raises(ValueError, match="unknown protocol dataset 'cifar'"):
        peer_data.load_peer_data("cifar")


def test_validation_split_holds_out_training_rows_only():
    rng = np.random.default_rng(0)
    ids = rng.permutation(np.repeat(np.arange(4), 30))
    train = np.concatenate([np.flatnonzero(ids == c)[:15] for c in range(4)])
    carved = validation_split(train, np.eye(4)[ids], held_out=5, queries=2, seed=0)
    assert len(carved.train) == 40 and len(carved.query) == 8 and len(carved.database) == 12
    for part in (carved.train, carved.query, carved.database):
        assert np.isin(part, train).all()
    assert not (set(carved.train) & set(carved.query) or set(carved.train) & set(carved.database) or set(carved.query) & set(carved.database))
    assert np.bincount(ids[carved.query]).tolist() == [2, 2, 2, 2]
    again = validation_split(train, ids, held_out=5, queries=2, seed=0)  # class ids or one-hot: the same split
    assert np.array_equal(again.query, carved.query) and np.array_equal(again.train, carved.train)
    multi = (rng.random((200, 5)) < 0.3).astype(np.uint8)
    carved = validation_split(np.arange(100), multi, held_out=20, queries=5, seed=1)
    assert (len(carved.train), len(carved.query), len(carved.database)) == (80, 5, 15)
    mixed = validation_split(np.arange(100), multi, held_out=20, queries=5, seed=1, train_in_database=0.5)
    assert len(mixed.database) == 30 and np.isin(mixed.database, mixed.train).sum() == 15
    assert not np.isin(mixed.query, mixed.train).any()
    with pytest.raises(ValueError, match="queries must be in 1..held_out-1"):
        validation_split(train, ids, held_out=5, queries=5)


def small_peer_data(single: bool) -> peer_data.PeerData:
    rng = np.random.default_rng(0)
    n, classes = 1300, 4  # a multi-label database above 1,000 for mAP@1000
    ids = rng.integers(0, classes, n)
    labels = np.eye(classes, dtype=np.uint8)[ids]
    if not single:
        labels = np.maximum(labels, (rng.random((n, classes)) < 0.2).astype(np.uint8))
    x = (labels @ rng.normal(size=(classes, 16)) + 0.5 * rng.normal(size=(n, 16))).astype("float32")
    split = peer_data.single_label_split(ids, 10, 60) if single else peer_data.multi_label_split(n, 40, 200)
    return peer_data.PeerData("small", x, labels, split, {})


@pytest.mark.parametrize("single", [True, False])
def test_peer_runs_score_the_protocol_and_the_validation_split(single, monkeypatch):
    monkeypatch.setattr(peers, "VALIDATION", {"single": {"held_out": 20, "queries": 10}, "multi": {"held_out": 100, "queries": 40}})
    data = small_peer_data(single)
    method = "SCDH" if single else "SCDH + JCCH coefficients"
    recipe = {"epochs": 4, "dropout": 0.2, "standardise": True, "schedule": "cosine", "weight_decay": 0.01}
    test = peers.run(data, method, 16, seed=0, recipe=recipe)
    assert test["mode"] == "test" and 0 < test["mAP@all"] <= 1 and ("mAP@1000" in test) != single
    held = peers.run(data, method, 16, seed=0, recipe=recipe, validation=True, every=2)
    assert [p["epoch"] for p in held["curve"]] == [2, 4]
    assert held["curve"][-1]["mAP@all"] == pytest.approx(held["mAP@all"], abs=1e-6)  # the last epoch is what is reported
    with pytest.raises(ValueError, match="unknown recipe settings \\['dropuot'\\]"):
        peers.run(data, method, 16, seed=0, recipe={"dropuot": 0.5})
    for bad in ({"schedule": "linear"}, {"epochs": 0}, {"dropout": 1.0}):
        with pytest.raises(ValueError):
            peers.checked_recipe(bad)


def test_a_benchmark_row_takes_further_fine_tuning_settings(monkeypatch):
    data = small_peer_data(True)
    seen = []
    make = peers.optimizer
    monkeypatch.setattr(peers, "optimizer", lambda *args: seen.append(make(*args)) or seen[-1])
    row = peers.run(data, "SCDH", 16, seed=0, recipe={"epochs": 2, "fine_tuning": {"weight_averaging": 0.9}})
    assert seen[0].use_ema and seen[0].ema_momentum == pytest.approx(0.9) and 0 < row["mAP@all"] <= 1
    with pytest.raises(ValueError, match="weight_averaging is the decay"):
        peers.checked_recipe({"fine_tuning": {"weight_averaging": 2.0}})


def test_mt_scdh_sees_the_unlabelled_database_or_the_training_rows_only(monkeypatch):
    monkeypatch.setattr(peers, "VALIDATION", {"single": {"held_out": 20, "queries": 10}, "multi": {"held_out": 100, "queries": 40}})
    data = small_peer_data(True)
    seen = []
    build = peers.methods.benchmark_model

    def spy(name, x, y, bits, seed, unlabelled=None, **options):
        built = build(name, x, y, bits, seed, unlabelled=unlabelled, **options)
        seen.append({"unlabelled": unlabelled, "noise_stddev": built[0].noise_stddev})
        return built

    monkeypatch.setattr(peers.methods, "benchmark_model", spy)
    recipe, options = {"epochs": 6}, {"consistency": 5.0, "noise": 0.5}
    row = peers.run(data, "MT-SCDH", 16, seed=0, recipe=recipe, validation=True, options=options, unlabelled=True)
    outside = np.setdiff1d(data.split.database, data.split.train)  # never a query, never a training row
    assert row["unlabelled rows"] == len(outside) and np.array_equal(seen[0]["unlabelled"], data.x[outside])
    share = np.isin(data.split.database, data.split.train).mean()
    carved = validation_split(data.split.train, data.labels, seed=0, train_in_database=share, held_out=20, queries=10)
    assert seen[0]["noise_stddev"] == pytest.approx(0.5 * data.x[carved.train].std(), rel=1e-5)  # its training rows
    assert row["options"] == options  # as given
    # labelled rows repeated to half of the input: 6 passes over them take fewer passes over the input
    assert 1 <= row["epochs"] < 6 and [p["epoch"] for p in row["curve"]] == list(range(1, row["epochs"] + 1))
    # on the training rows only: no unlabelled rows, the recipe's epochs, the same input noise
    alone = peers.run(data, "MT-SCDH", 16, seed=0, recipe=recipe, validation=True, every=3, options=options)
    assert seen[1]["unlabelled"] is None and alone["unlabelled rows"] == 0 and alone["epochs"] == 6
    assert seen[1]["noise_stddev"] == pytest.approx(seen[0]["noise_stddev"]) and len(alone["curve"]) == 2
    rows = [{"recipe label": label, "dataset": "mnist", "bits": 16, "method": m, "seed": s, "mAP@all": v,
             "recipe": {"epochs": 50}, "options": opts}
            for label, m, opts, values in [("a", "SCDH", {}, (0.90,)), ("b", "SCDH", {}, (0.92, 0.93)),
                                           ("mt", "MT-SCDH", {"consistency": 5}, (0.93, 0.95)), ("tuned", "SCDH", {"lam": 0.1}, (0.99, 0.99))]
            for s, v in enumerate(values)]  # fmt: skip
    (cell,) = peers.semi_supervised(rows)  # SCDH with the same recipe, defaults, and the most seeds in common
    assert (cell["SCDH label"], cell["seeds"]) == ("b", 2) and cell["gain"] == pytest.approx(0.015)
    for r in rows:
        r["unlabelled rows"] = 100 if r["method"] == "MT-SCDH" else 0
    assert {c["best tfhash"] for c in peers.margins(rows)} == {"SCDH"}  # with unlabelled rows, no count against the bar
    for r in rows:
        r["unlabelled rows"] = 0  # MT-SCDH on the training rows only: a supervised method like the others
    assert {c["best tfhash"] for c in peers.margins(rows)} == {"SCDH", "MT-SCDH"}  # label "mt" counts too


def test_the_cli_gives_unlabelled_rows_only_where_asked(monkeypatch, tmp_path):
    import json
    import sys
    from types import SimpleNamespace

    calls = []

    def fake_run(data, method, bits, seed, recipe, validation=False, every=10, options=None, unlabelled=False):
        calls.append((method, unlabelled))
        return {"dataset": data.name, "method": method, "bits": bits, "seed": seed, "mode": "test", "recipe": recipe, "options": options,
                "mAP@all": 0.5, "unlabelled rows": 7 if unlabelled else 0}  # fmt: skip

    monkeypatch.setattr(peers, "run", fake_run)
    monkeypatch.setattr(peers, "load_peer_data", lambda name, **kw: SimpleNamespace(name=name, checks={}, single_label=True))
    monkeypatch.setattr(peers, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(peers, "markdown", lambda *args: "")
    monkeypatch.setattr(peers, "write_results", lambda name, payload, md: (tmp_path / f"{name}.json").write_text(json.dumps(payload)))

    def main(*argv):
        calls.clear()
        monkeypatch.setattr(sys, "argv", ["peers", "--datasets", "mnist", "--bits", "16", "--seeds", "0", *argv])
        peers.main()
        return calls

    assert main("--recommended") == [("MT-SCDH", False)]  # MNIST's recipe: MT-SCDH on the training rows alone
    assert main("--semi-supervised") == [("MT-SCDH", True)]
    assert main("--methods", "MT-SCDH", "SCDH", "--label", "x", "--options", "{}") == [("MT-SCDH", True), ("SCDH", False)]
    assert main("--methods", "MT-SCDH", "--labelled-only", "--label", "y", "--options", "{}") == [("MT-SCDH", False)]
    for refused in (["--methods", "MT-SCDH", "--labelled-only", "--label", "x", "--options", "{}"],  # x holds rows with them
                    ["--recommended", "--labelled-only"], ["--methods", "SCDH", "--labelled-only", "--label", "z"],
                    ["--methods", "MT-SCDH", "--labelled-only"]):  # fmt: skip
        with pytest.raises(SystemExit):
            main(*refused)
        assert calls == []  # refused before any training


def test_margins_take_each_cells_best_mean_over_seeds():
    rows = [{"recipe label": "r", "dataset": "cifar10", "bits": 16, "method": m, "seed": s, "mAP@all": v}
            for m, values in {"A": (0.60, 0.56), "B": (0.59, 0.59)}.items() for s, v in enumerate(values)]  # fmt: skip
    (cell,) = peers.margins(rows)
    assert cell["best tfhash"] == "B" and cell["mean"] == pytest.approx(0.59) and cell["seeds"] == 2
    assert cell["margin"] == pytest.approx(0.59 - 0.5732) and cell["+0.01 met"] == "yes"


def as_recorded(recipe: dict, row: dict) -> dict:
    """``recipe`` as a result row records it: a setting added after the row was run counts as the
    same recipe only while the recipe keeps its default."""
    return {k: v for k, v in recipe.items() if k in row["recipe"] or v != peers.PROTOCOL_RECIPE[k]}


def test_reported_recommended_rows_used_the_current_recipes():
    """The peer table's "recommended" rows were produced by tfhash.recipes as it stands: a changed
    preset without a rerun fails here."""
    import json

    rows = json.loads((peers.RESULTS_DIR / "peers.json").read_text())["rows"]
    for dataset in peers.KINDS:
        method, recipe, options = peers.recommended(dataset)
        mine = [r for r in rows if r["recipe label"] == "recommended" and r["dataset"] == dataset]
        assert len(mine) == 9  # 16 / 32 / 64 bits x seeds 0-2
        for row in mine:
            assert (row["method"], row["recipe"], row["options"]) == (method, as_recorded(recipe, row), options)
            assert row.get("unlabelled rows", 0) == 0  # the training rows only, as the bar's peers


def test_reported_semi_supervised_rows_used_the_current_settings():
    """The MT-SCDH rows labelled "semi-supervised" were produced with tfhash.recipes.MEAN_TEACHER as
    it stands, for every single-label dataset, bit length and seed."""
    import json

    rows = json.loads((peers.RESULTS_DIR / "peers.json").read_text())["rows"]
    for dataset, kind in peers.KINDS.items():
        if kind not in peers.MEAN_TEACHER:
            continue
        mine = [r for r in rows if r["recipe label"] == "semi-supervised" and r["dataset"] == dataset]
        assert sorted((r["bits"], r["seed"]) for r in mine) == [(b, s) for b in (16, 32, 64) for s in (0, 1, 2)]
        settings = dict(peers.MEAN_TEACHER[kind]["options"])
        for row in mine:
            assert row["method"] == "MT-SCDH" and row["recipe"] == as_recorded(peers.checked_recipe({}), row)
            assert row["options"]["consistency"] == settings["consistency"] and row["unlabelled rows"] > 0
            # rows before the harness kept the noise as given recorded it as the model's noise_stddev
            assert row["options"].get("noise", settings["noise"]) == settings["noise"] and ("noise" in row["options"]) != (
                "noise_stddev" in row["options"])  # fmt: skip
