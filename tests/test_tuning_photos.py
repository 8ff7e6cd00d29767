"""The search over image recipes (tfhash.tuning.photos) runs for real: EfficientNet-Lite0 with its
pip package's ImageNet weights at 32x32 on small coloured images, every trial above one trunk
cache, the first trial the base spec at full fidelity, the chosen spec trainable on all rows."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pipelines.config import PipelineConfig
from tfhash.recipes import RECOMMENDED_PHOTOS, recommended_photos
from tfhash.training_spec import PHOTOS, TrainingSpec
from tfhash.tuning import Budget, PhotoSpace, TuningError, data_kind, tune

CONFIGS = Path(__file__).resolve().parents[1] / "pipelines" / "configs"


def photos(per_class: int = 40, seed: int = 0):
    """Three classes of 32x32 images, each a colour under heavy pixel noise."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(3), per_class)
    colours = np.array([[200, 40, 40], [40, 200, 40], [40, 40, 200]])
    images = colours[labels][:, None, None, :] + rng.normal(0, 60, (len(labels), 32, 32, 3))
    return np.clip(images, 0, 255).astype(np.uint8), labels


#: The recommended spec at a side and length a test trains in seconds.
SMALL = replace(RECOMMENDED_PHOTOS, image_size=32, mixed_precision="off", batch_size=32, epochs=4)


def test_the_cifar10_config_trains_the_recommended_photo_recipe_and_the_space_reads_it_back():
    training = TrainingSpec.from_dict(json.loads((CONFIGS / "cifar10.json").read_text())["training"])
    assert training == RECOMMENDED_PHOTOS
    space = PhotoSpace()
    values = space.values_of(RECOMMENDED_PHOTOS)
    assert all(values[name] in choices for name, choices in space.choices().items())  # the first trial is the recommended recipe
    assert space.spec(values, RECOMMENDED_PHOTOS) == RECOMMENDED_PHOTOS
    other = space.spec({**values, "mixup": 0.0, "schedule": "step", "epochs": 20}, RECOMMENDED_PHOTOS)
    assert (other.fine_tuning.trunk_cache.mixup, other.fine_tuning.schedule, other.epochs) == (0.0, "step", 20)
    assert (other.backbone, other.image_size, other.fine_tuning.trunk_cache.cut) == ("efficientnet_lite1", 160, "block10")
    # the rates are searched as factors on the base's own, so one space suits Adam's rates and SGD's
    tuning = RECOMMENDED_PHOTOS.fine_tuning
    sgd = replace(RECOMMENDED_PHOTOS, fine_tuning=replace(tuning, optimizer="sgd", learning_rate=0.01, backbone_learning_rate=None))
    for base, rates in ((RECOMMENDED_PHOTOS, (0.003, 0.00004)), (sgd, (0.03, 0.004))):
        scaled = space.spec({**space.values_of(base), "learning_rate_scale": 3.0, "backbone_rate_scale": 0.4}, base).fine_tuning
        assert scaled.optimizer == base.fine_tuning.optimizer
        assert (scaled.learning_rate, scaled.backbone_learning_rate) == pytest.approx(rates)
    # both losses of the recommended recipe are searched; HCLM, without label weights, trains without mixup
    short = recommended_photos(32)
    assert space.spec(space.values_of(short), short) == short and space.values_of(short)["variant"] != values["variant"]
    hclm = space.spec({**values, "variant": space.values_of(short)["variant"]}, RECOMMENDED_PHOTOS)
    assert (hclm.method, hclm.overrides, hclm.fine_tuning.trunk_cache.mixup, hclm.bits) == (short.method, short.overrides, 0.0, 48)
    old = {**{k: v for k, v in values.items() if not k.endswith("_scale")}, "learning_rate": 0.01, "backbone_learning_rate": 0.005}
    with pytest.raises(ValueError, match=r"missing \['backbone_rate_scale', 'learning_rate_scale'\].*run the search again"):
        space.spec(old, RECOMMENDED_PHOTOS)  # a search saved before the rates were factors


def test_photos_are_their_own_kind_and_bad_inputs_are_refused_before_any_trial(tmp_path):
    images, labels = photos(per_class=10)
    one_hot = np.eye(3)[labels]
    assert data_kind(images, one_hot) == PHOTOS and data_kind(images.reshape(len(images), -1), one_hot) == "single-label"
    with pytest.raises(ValueError, match="photos are pixels"):
        tune(images.astype("complex64"), labels, 16, kind=PHOTOS, base=SMALL)
    broken = images.astype("float32")
    broken[7, 3, 3, 1] = np.nan
    with pytest.raises(ValueError, match="photo 7 holds a pixel that is not a finite value in 0-255"):
        tune(broken, labels, 16, kind=PHOTOS, base=SMALL)
    broken[7, 3, 3, 1] = 300.0
    with pytest.raises(ValueError, match="photo 7 holds"):
        tune(broken, labels, 16, kind=PHOTOS, base=SMALL)
    with pytest.raises(ValueError, match="40 images but 30 label rows"):
        tune(np.concatenate([images, images[:10]]), labels, 16, kind=PHOTOS, base=SMALL)
    with pytest.raises(TuningError, match="above a trunk cache"):
        tune(images, labels, 16, base=replace(SMALL, fine_tuning=replace(SMALL.fine_tuning, trunk_cache=None)))
    with pytest.raises(TuningError, match="train on labelled images only"):
        tune(images, labels, 16, base=SMALL, unlabelled=images[:5])


@pytest.mark.parametrize("kind", [None, PHOTOS])
def test_pipeline_configs_accept_a_photo_tuner_only_above_a_trunk_cache(tmp_path, kind):
    training = json.loads((CONFIGS / "cifar10.json").read_text())["training"]
    raw = {"name": "t", "dataset": "cifar10", "run_dir": str(tmp_path / "run"), "training": training, "tuner": {"kind": kind, "trials": 2}}
    (tmp_path / "c.json").write_text(json.dumps(raw))
    assert PipelineConfig.load(tmp_path / "c.json").tuner.kind == kind
    no_cache = {**training, "fine_tuning": {**training["fine_tuning"], "trunk_cache": None}}
    (tmp_path / "c.json").write_text(json.dumps({**raw, "training": no_cache}))
    with pytest.raises(ValueError, match="for photos .* with training.fine_tuning.trunk_cache set"):
        PipelineConfig.load(tmp_path / "c.json")
    (tmp_path / "c.json").write_text(json.dumps({**raw, "tuner": {"kind": "multi-label"}}))
    with pytest.raises(ValueError, match="kind 'multi-label'"):
        PipelineConfig.load(tmp_path / "c.json")


def test_every_trial_reads_one_trunk_cache_and_the_chosen_spec_trains_on_all_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("TFHASH_CACHE_DIR", str(tmp_path / "machine"))  # where the final training's cache goes
    images, labels = photos()
    space = PhotoSpace(backbone_rate_scale=(1.0, 2.0), epochs=(4, 2))
    result = tune(images, labels, 16, seed=0, budget=Budget(max_units=2, factor=2, trials=3), base=SMALL, space=space,
                  directory=str(tmp_path))  # fmt: skip
    first = result.trials[0]
    assert (first["units"], first["epochs trained"], first["mixup"], first["schedule"]) == (2, 4, 0.4, "cosine")  # the base, whole
    assert len(result.trials) == 3 and all(t["status"] == "ok" for t in result.trials)
    assert first["score"] > 0.6  # colours apart: chance is about 0.33
    assert len([e for e in os.listdir(tmp_path / "trunk_cache") if not e.startswith(".")]) == 1
    assert isinstance(result.recipe, TrainingSpec) and result.kind == PHOTOS and "validation mAP@all" in result.chosen
    assert result.recipe.fine_tuning.trunk_cache.directory is None  # the search's folder is not the user's
    assert "| mixup |" in result.table() and json.dumps(result.summary(), default=str)
    model = result.fit(images, labels)
    assert len(os.listdir(tmp_path / "machine" / "trunk_cache")) == 1
    codes = model.encode(images)
    assert codes.shape == (len(images), 16) and set(np.unique(codes)) <= {-1, 1}
    with pytest.raises(ValueError, match="trains on labelled images only"):
        result.fit(images, labels, unlabelled=images[:4])


def test_cli_tune_searches_photos_above_a_base_file_and_refuses_a_base_for_vectors(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tfhash.cli import main

    monkeypatch.setenv("TFHASH_CACHE_DIR", str(tmp_path / "machine"))
    images, labels = photos(per_class=20)
    data, base, out = tmp_path / "photos.npz", tmp_path / "config.json", tmp_path / "out"
    np.savez(data, x=images, labels=labels)
    base.write_text(json.dumps({"name": "mine", "training": SMALL.to_dict()}))  # a whole pipeline config: its training section
    result = CliRunner().invoke(main, ["tune", str(data), "--bits", "16", "--trials", "2", "--base", str(base), "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "tuning.json").read_text())
    assert len(summary["trials"]) == 2 and summary["trials"][0]["epochs trained"] == SMALL.epochs  # the base first, whole
    chosen = TrainingSpec.from_dict(summary["recipe"])
    assert (chosen.bits, chosen.image_size, chosen.backbone) == (16, 32, SMALL.backbone)  # --bits over the base's own
    assert f"chosen: scdh on {SMALL.backbone}" in result.output
    named = {"recipe": PHOTOS, "image_size": 32, "epochs": 4, "mixed_precision": "off", "batch_size": 32}  # as own-images.md writes it
    base.write_text(json.dumps({"training": named}))
    result = CliRunner().invoke(main, ["tune", str(data), "--trials", "1", "--base", str(base), "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    chosen = TrainingSpec.from_dict(json.loads((out / "tuning.json").read_text())["recipe"])
    assert (chosen.backbone, chosen.fine_tuning.trunk_cache.cut) == (RECOMMENDED_PHOTOS.backbone, RECOMMENDED_PHOTOS.fine_tuning.trunk_cache.cut)
    assert (chosen.bits, chosen.method) == (32, "hclm")  # the recipe at --bits: the loss of short codes
    np.savez(data, x=images.reshape(len(images), -1).astype("float32"), labels=labels)
    refused = CliRunner().invoke(main, ["tune", str(data), "--base", str(base), "--output-dir", str(out)])
    assert refused.exit_code == 2 and "base is the spec photos are searched above" in refused.output
    base.write_text('{"training": {"epochs": 4,')
    refused = CliRunner().invoke(main, ["tune", str(data), "--base", str(base), "--output-dir", str(out)])
    assert refused.exit_code == 2 and "is not a JSON file of training settings" in refused.output
    base.write_text(json.dumps({"image_sise": 32}))
    refused = CliRunner().invoke(main, ["tune", str(data), "--base", str(base), "--output-dir", str(out)])
    assert refused.exit_code == 2 and "image_sise" in refused.output and "image_size" in refused.output
