"""The trunk cache (tfhash.trunk_cache): the cached forward pass is the raw one, training on the
cache moves only the layers above the cut, the returned model encodes raw images with the trained
weights (also once exported), and the cache refuses what it cannot serve."""

from __future__ import annotations

import os
from collections import namedtuple

import keras
import numpy as np
import pytest

from tfhash.fine_tuning import FineTuning, TrunkCacheSettings
from tfhash.models import build_hclm, build_scdh, image_backbone
from tfhash.networks import SQUEEZENET_LAYERS
from tfhash.precision import cpu_flags, cpu_has_bfloat16, precision_policy
from tfhash.trunk_cache import (
    CacheError,
    build_cache,
    fit_on_cache,
    layer_names,
    mixup_batch,
    open_cache,
    split_backbone,
    view_transform,
)

SHAPE, SIDE = (32, 32, 3), 64
#: Maximum absolute difference between the cached and the raw forward pass, float32 (the same
#: ops on the same values: only summation order may differ).
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A fixed (random) SqueezeNet weights file, so that every backbone made from it starts equal."""
    path = tmp_path_factory.mktemp("weights") / "squeezenet.weights.h5"
    keras.utils.set_random_seed(3)
    image_backbone("squeezenet", SHAPE, size=SIDE, weights=None).get_layer("network").save_weights(str(path))
    return str(path)


def images_and_labels(count=40, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (count, *SHAPE), dtype=np.uint8)
    return images, np.eye(4, dtype=np.float32)[np.arange(count) % 4]


def backbone(weights, **options):
    return image_backbone("squeezenet", SHAPE, size=SIDE, weights=weights, **options)


def test_the_cached_forward_pass_is_the_raw_one(weights):
    full = backbone(weights)
    split = split_backbone(full, "pool5")
    images, _ = images_and_labels(8)
    raw = np.asarray(full(images, training=False))
    cached = np.asarray(split.top(np.asarray(split.trunk(images, training=False), np.float16).astype(np.float32)))
    assert split.trunk.output.shape[1:] == (1, 1, 256) or split.trunk.output.shape[-1] == 256
    assert np.abs(np.asarray(split.top(split.trunk(images))) - raw).max() <= TOLERANCE * max(1.0, np.abs(raw).max())
    # the float16 store rounds the activations to 11 significant bits
    assert np.abs(cached - raw).max() <= 2e-3 * max(1.0, np.abs(raw).max())
    assert {w.path for w in split.top.trainable_weights} <= {w.path for w in full.trainable_weights}
    assert not any(w.path.startswith(("conv1", "fire2", "fire5")) for w in split.top.trainable_weights)


def test_views_are_the_images_their_mirror_and_seeded_draws():
    images, _ = images_and_labels(8)
    np.testing.assert_array_equal(view_transform(0, "shift", 0)(images), images)
    np.testing.assert_array_equal(view_transform(1, "shift", 0)(images), images[:, :, ::-1])
    first, again = view_transform(2, "shift", 5), view_transform(2, "shift", 5)
    batches = [first(images[:4]), first(images[4:])]
    np.testing.assert_array_equal(np.concatenate(batches), np.concatenate([again(images[:4]), again(images[4:])]))
    # the draws run on across batches: the same image in the next batch is transformed anew
    assert not np.array_equal(batches[0], first(images[:4]))
    assert not np.array_equal(batches[0], view_transform(3, "shift", 5)(images[:4]))


def scdh(seed=0):
    def build(net):
        keras.utils.set_random_seed(seed)
        return build_scdh(net, 4, 16)

    return build


def cached_fit(weights, tmp_path, epochs=1, views=2, policy="float32", mixup=0.0):
    recipe = FineTuning.for_backbone("squeezenet", backbone_learning_rate=0.01, learning_rate=0.05, dropout=0.5,
                                     trunk_cache={"cut": "fire5_concat", "views": views, "directory": str(tmp_path / "cache"),
                                                  "mixup": mixup})  # fmt: skip
    images, labels = images_and_labels()
    seen = {}

    def callbacks(split):
        seen["split"] = split
        return []

    model, history, cache = fit_on_cache(recipe, scdh(), lambda: backbone(weights, **recipe.backbone_options()), images, labels,
                                                epochs=epochs, batch_size=16, seed=0, backbone_name="squeezenet", policy=policy,
                                         callbacks=callbacks)  # fmt: skip
    return model, history, cache, seen["split"], images


def test_training_on_the_cache_moves_only_the_layers_above_the_cut(weights, tmp_path):
    start = backbone(weights).get_layer("network")
    model, history, cache, split, images = cached_fit(weights, tmp_path)
    assert np.isfinite(history.history["loss"]).all()
    network = model.backbone.get_layer("network")
    below = [layer.name for layer in start.layers if layer.weights and layer.name.startswith(("conv1", "fire2", "fire3", "fire4", "fire5"))]
    above = [layer.name for layer in start.layers if layer.weights and layer.name.startswith(("fire6", "fire7", "fire8", "fire9"))]
    assert below and above
    for name in below:
        for before, after in zip(start.get_layer(name).get_weights(), network.get_layer(name).get_weights(), strict=True):
            np.testing.assert_array_equal(before, after)
    moved = [name for name in above if any(not np.array_equal(b, a) for b, a in
                                           zip(start.get_layer(name).get_weights(), network.get_layer(name).get_weights(), strict=True))]  # fmt: skip
    assert moved == above
    assert cache.activations.shape[:2] == (2, len(images)) and cache.activations.dtype == np.float16
    assert model.compute_dtype == "float32"


def test_fine_tuning_fit_trains_above_the_cache_or_end_to_end(weights, tmp_path):
    images, labels = images_and_labels()
    options = {"backbone_learning_rate": 0.01, "learning_rate": 0.05}
    cached = FineTuning.for_backbone("squeezenet", trunk_cache={"cut": "fire5_concat", "views": 2, "directory": str(tmp_path / "cache")},
                                     **options)  # fmt: skip
    model = cached.fit(scdh(), images, labels, "squeezenet", epochs=1, batch_size=16, size=SIDE, weights=weights)
    assert model.compute_dtype == "float32" and any((tmp_path / "cache").iterdir())
    assert model.encode(images[:3]).shape == (3, 16)
    plain = FineTuning.for_backbone("squeezenet", trunk_cache=False, **options)
    assert plain.trunk_cache is None
    model = plain.fit(scdh(), images, labels, "squeezenet", epochs=1, batch_size=16, size=SIDE, weights=weights)
    assert np.isfinite(model.history.history["loss"]).all() and model.encode(images[:3]).shape == (3, 16)


def test_the_cache_streams_epoch_after_epoch_from_one_iterator(weights, tmp_path):
    """``fit`` keeps one iterator for the run (a new one each epoch stalled the next epoch's first
    step): the dataset runs on past an epoch, each epoch every row once, in an order and with views
    drawn anew from the seed and the epoch."""
    _, history, cache, _, _ = cached_fit(weights, tmp_path, epochs=2)
    assert len(history.history["loss"]) == 2
    count, batch = len(cache.labels), 16
    steps = cache.steps_per_epoch(batch)
    row_of = {cache.activations[v, i].tobytes(): i for v in range(cache.activations.shape[0]) for i in range(count)}

    def epochs(seed):
        batches = [np.asarray(features) for features, _ in cache.dataset(batch, seed).take(3 * steps)]
        assert len(batches) == 3 * steps  # three epochs from one iterator
        rows = [[row_of[f.tobytes()] for b in batches[e * steps:(e + 1) * steps] for f in b] for e in range(3)]
        features = [np.concatenate(batches[e * steps:(e + 1) * steps]) for e in range(3)]
        return rows, features

    rows, features = epochs(0)
    assert all(sorted(r) == list(range(count)) for r in rows)
    assert rows[0] != rows[1] != rows[2]
    again, features_again = epochs(0)
    assert again == rows and all(np.array_equal(a, b) for a, b in zip(features, features_again, strict=True))
    assert epochs(1)[0] != rows


def test_mixup_mixes_rows_and_their_scul_weights_alike():
    features = np.arange(12, dtype=np.float16).reshape(3, 2, 2)
    labels = np.array([[1, 0, 0], [0, 1, 1], [1, 0, 0]], np.float32)
    weights, partners = np.array([0.25, 1.0, 0.5]), np.array([1, 0, 2])
    mixed, targets = mixup_batch(features, labels, weights, partners)
    mixed, targets = np.asarray(mixed), {name: np.asarray(value) for name, value in targets.items()}
    assert mixed.dtype == np.float16
    np.testing.assert_allclose(mixed[0], 0.25 * features[0] + 0.75 * features[1])
    np.testing.assert_array_equal(mixed[1:], features[1:])  # weight 1 and a row mixed with itself are unchanged
    np.testing.assert_array_equal(targets["labels"], [[1, 1, 1], [0, 1, 1], [1, 0, 0]])
    np.testing.assert_allclose(targets["q"], [[0.25, 0.375, 0.375], [0, 0.5, 0.5], [1, 0, 0]])
    np.testing.assert_allclose(targets["u"], [[0.25, 0.75, 0.75], [0, 1, 1], [1, 0, 0]])


def test_mixup_trains_scdh_and_is_refused_for_a_method_without_clusters(weights, tmp_path):
    _, history, _, _, _ = cached_fit(weights, tmp_path, mixup=0.4)
    assert np.isfinite(history.history["loss"]).all()
    recipe = FineTuning.for_backbone("squeezenet", trunk_cache={"cut": "fire5_concat", "views": 1, "directory": str(tmp_path / "c"), "mixup": 0.4})
    images, labels = images_and_labels()

    def hclm(net):
        return build_hclm(net, 4, 16)

    with pytest.raises(CacheError, match="mixup mixes SCUL's label weights"):
        fit_on_cache(recipe, hclm, lambda: backbone(weights), images, labels, epochs=1, batch_size=16, seed=0,
                            backbone_name="squeezenet")  # fmt: skip
    assert not (tmp_path / "c").exists()  # refused before the cache was built
    with pytest.raises(CacheError, match="no trunk_cache; set trunk_cache=True"):
        fit_on_cache(FineTuning.for_backbone("squeezenet", trunk_cache=False), hclm, lambda: backbone(weights), images, labels, epochs=1,
                                                                              batch_size=16, seed=0, backbone_name="squeezenet")  # fmt: skip
    with pytest.raises(ValueError, match="mixup must be a finite number"):
        TrunkCacheSettings(mixup=-1)
    for bad in ({"epochs": 0, "batch_size": 16}, {"epochs": 1, "batch_size": 0}, {"epochs": 1, "batch_size": 2.5}, {"epochs": 1, "batch_size": float("nan")}):
        with pytest.raises(ValueError, match=f"fit_on_cache's {'epochs' if bad['epochs'] == 0 else 'batch_size'} must be a positive integer"):
            fit_on_cache(recipe, scdh(), lambda: backbone(weights), images, labels, seed=0, backbone_name="squeezenet", **bad)
    assert not (tmp_path / "c").exists()  # refused before the cache was built


def test_the_returned_model_encodes_raw_images_with_the_trained_weights(weights, tmp_path):
    import tensorflow as tf

    from tfhash.export import export_image_model

    model, _, _, split, images = cached_fit(weights, tmp_path)
    trained_top = split.top  # the cached model's layers above the cut
    features = np.asarray(trained_top(split.trunk(images)))
    np.testing.assert_allclose(np.asarray(model.backbone(images, training=False)), features, atol=TOLERANCE * max(1.0, np.abs(features).max()))
    codes = model.encode(images)
    export_image_model(model, str(tmp_path / "export"), SHAPE, 16)
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    exported = loaded.signatures["encode_pixels"](pixels=tf.constant(images))
    unpacked = np.unpackbits(exported["packed_codes"].numpy(), axis=1)[:, :16].astype(np.int8) * 2 - 1
    np.testing.assert_array_equal(unpacked, codes)
    # encoded with the mirror: the continuous codes of the image and its mirror averaged before the sign
    export_image_model(model, str(tmp_path / "mirrored"), SHAPE, 16, mirrored=True)
    mirrored = tf.saved_model.load(str(tmp_path / "mirrored")).signatures["encode_pixels"](pixels=tf.constant(images))
    averaged = (model.continuous_codes(images) + model.continuous_codes(images[:, :, ::-1])) / 2
    np.testing.assert_allclose(mirrored["codes"].numpy(), averaged, atol=1e-5)
    assert np.abs(averaged - model.continuous_codes(images)).max() > 1e-5  # the mirror changes the codes


def test_a_second_run_reuses_the_cache_and_a_bfloat16_run_trains(weights, tmp_path):
    _, _, first, _, _ = cached_fit(weights, tmp_path)
    _, _, again, _, _ = cached_fit(weights, tmp_path)
    assert again.path == first.path and len(os.listdir(tmp_path / "cache")) == 1
    model, history, bf16, _, _ = cached_fit(weights, tmp_path, policy="mixed_bfloat16")
    assert bf16.path != first.path  # the trunk's compute dtype is part of the key
    assert np.isfinite(history.history["loss"]).all() and model.compute_dtype == "float32"


def test_a_cut_the_backbone_does_not_have_is_refused(weights):
    with pytest.raises(CacheError, match=r"no layer 'pool_5'.*did you mean \['pool5'"):
        split_backbone(backbone(weights), "pool_5")
    # the catalogue's names, which check a recipe's cut before anything is built, are the network's
    assert tuple(layer_names(backbone(weights))) == SQUEEZENET_LAYERS
    with pytest.raises(ValueError, match=r"has no layer 'pool_5'; did you mean \['pool5'"):
        FineTuning.for_backbone("squeezenet", trunk_cache={"cut": "pool_5"})
    with pytest.raises(ValueError, match="last layer: nothing would train above it"):
        FineTuning.for_backbone("squeezenet", trunk_cache={"cut": "pool"})
    with pytest.raises(CacheError, match="nothing to train above the cut"):
        split_backbone(backbone(weights), "pool")
    with pytest.raises(ValueError, match="needs a cut for backbone 'resnet50'"):
        FineTuning.for_backbone("resnet50", trunk_cache=True)
    with pytest.raises(ValueError, match="unknown setting .training.fine_tuning.trunk_cache.layer."):
        FineTuning.for_backbone("squeezenet", trunk_cache={"layer": "pool5"})
    assert FineTuning.for_backbone("squeezenet", trunk_cache=True).trunk_cache == TrunkCacheSettings(cut="pool5")


def test_a_cache_built_for_another_image_size_or_backbone_is_refused(weights, tmp_path):
    images, labels = images_and_labels(8)
    cache = build_cache(split_backbone(backbone(weights), "pool5"), images, labels, str(tmp_path), "squeezenet", views=1)
    from dataclasses import replace

    with pytest.raises(CacheError, match=r"built for size 64 \(this run: 96\)"):
        open_cache(cache.path, replace(cache.key, size=96))
    with pytest.raises(CacheError, match=r"backbone 'squeezenet' \(this run: 'my_encoder.keras'\)"):
        open_cache(cache.path, replace(cache.key, backbone="my_encoder.keras"))
    with pytest.raises(CacheError, match="no trunk cache here"):
        open_cache(str(tmp_path), cache.key)


def test_a_cache_that_does_not_fit_the_disk_is_refused(weights, tmp_path, monkeypatch):
    import shutil

    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**6, 10**6 - 1000, 1000))
    images, labels = images_and_labels(8)
    with pytest.raises(CacheError, match=r"needs 0\.00 GB, and .* has 0\.00 GB free: use fewer views"):
        build_cache(split_backbone(backbone(weights), "pool5"), images, labels, str(tmp_path), "squeezenet", views=4)
    assert os.listdir(tmp_path) == []


def test_precision_policies(tmp_path):
    with_bf16, without = tmp_path / "bf16", tmp_path / "plain"
    with_bf16.write_text("processor : 0\nflags : fpu sse avx512f avx512_bf16\n")
    without.write_text("processor : 0\nflags : fpu sse avx2\n")
    assert precision_policy("bfloat16", gpu=False, cpuinfo=str(with_bf16)) == "mixed_bfloat16"
    assert precision_policy("bfloat16", gpu=False, cpuinfo=str(without)) == "float32"
    assert precision_policy("auto", gpu=False) == "float32" and precision_policy("auto", gpu=True) == "mixed_float16"
    assert precision_policy("on", gpu=False) == "mixed_float16" and precision_policy("off", gpu=True) == "float32"
    assert cpu_has_bfloat16(str(tmp_path / "missing")) is False
    assert cpu_flags(str(without)) == {"fpu", "sse", "avx2"} and cpu_flags(str(tmp_path / "missing")) == frozenset()
    with pytest.raises(ValueError, match="mixed_precision must be one of"):
        precision_policy("bf16", gpu=False)


def test_the_pipeline_config_refuses_a_trunk_cache_it_cannot_serve():
    from tfhash.training_spec import TrainingSpec

    for section, message in [({"backbone": "small_cnn", "fine_tuning": {"trunk_cache": {"cut": "conv"}}}, "serves one pretrained image network"),
                             ({"backbone": "squeezenet", "method": "mt_scdh", "fine_tuning": {"trunk_cache": True}}, "unknown method|serves one"),
                             ({"backbone": "resnet50", "backbone_weights": None, "fine_tuning": {"trunk_cache": True}}, "needs a cut"),
                             ({"backbone": "squeezenet", "fine_tuning": {"trunk_cache": {"views": 0}}}, "views must be an integer"),
                             ({"backbone": "squeezenet", "method": "hclm", "fine_tuning": {"trunk_cache": {"mixup": 0.4}}}, "mixup mixes SCUL's"),
                             ({"backbone": "squeezenet", "mixed_precision": "bf16"}, "mixed_precision must be one of")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            TrainingSpec(**section)
    config = TrainingSpec(backbone="squeezenet", mixed_precision="bfloat16", fine_tuning={"trunk_cache": {"views": 4}})
    assert config.fine_tuning.trunk_cache == TrunkCacheSettings(cut="pool5", views=4)
