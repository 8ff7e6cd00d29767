"""The pipeline on the other shipped datasets, each its own small real local run (LocalDagRunner,
Beam in memory): Wiki's cross-modal JCCH with the search service, CIFAR-10's JPEGs through both
shipped image configs, and MIRFlickr's tag vectors with the Tuner choosing the recipe."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.pipeline_fixtures import small_config
from tests.transform_runs import z_scores

CONFIGS = Path(__file__).resolve().parents[1] / "pipelines" / "configs"


@pytest.mark.beam
@pytest.mark.process
def test_cross_modal_wiki_pipeline_and_search(tmp_path):
    """JCCH on Wiki through the whole pipeline: both directions evaluated, one index per database
    modality, per-modality signatures; the search service answers image -> text like the library.
    ``index_embeddings: false``: the indexes store no embeddings, so the answers are in Hamming order."""
    import numpy as np
    import tensorflow as tf
    from tfhash.pipelines.runner import run_local
    from tfhash.serving.search_client import SearchClient
    from tfhash.serving.search_service import SearchServer, in_process_searcher

    from tfhash.index import load_embeddings, load_index

    config = small_config(tmp_path, name="tiny-wiki", dataset="wiki", limit=200, modalities=["image", "text"],
                          map_threshold=0.0, index_embeddings=False, training={"method": "jcch", "bits": 16, "backbone": "mlp",
                                                       "hidden": {"image": [64], "text": [32, 16]},
                                                       "epochs": 2, "batch_size": 64,
                                                       "input_map": {"image": "rbf", "text": "standardise"}})  # fmt: skip
    summary = run_local(config, log=lambda message: None)
    check_input_maps_learned_from_the_training_split(config)
    assert {"image->text", "text->image"} <= set(summary["metrics"]) and summary["blessed"] is True
    assert set(summary["indexes"]) == {"BFlat-image", "BFlat-text"}
    loaded = tf.saved_model.load(summary["model_dir"])
    assert {"serving_image", "serving_text", "encode_image", "encode_text"} <= set(loaded.signatures)
    kernels = {name: {tuple(v.shape) for v in loaded.signatures[f"encode_{name}"].variables if len(v.shape) == 2}
               for name in ("image", "text")}  # fmt: skip
    assert {(10, 32), (32, 16), (16, 16)} <= kernels["text"] and (64, 16) in kernels["image"]  # each tower its own widths
    files = sorted(tf.io.gfile.glob(os.path.join(config.layout.data, "query", "*")))
    queries = [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP").take(8)]
    packed = loaded.signatures["serving_image"](examples=tf.constant(queries))["packed_codes"].numpy()
    # the features signatures take the raw vectors and map them as the examples' signatures do
    _, raw = _raw_rows(config, "query", ["image", "text"])
    for name in ("image", "text"):
        by_example = loaded.signatures[f"serving_{name}"](examples=tf.constant(queries))["packed_codes"].numpy()
        by_vector = loaded.signatures[f"encode_{name}"](**{name: tf.constant(raw[name][:8])})["packed_codes"].numpy()
        np.testing.assert_array_equal(by_vector, by_example)
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN"):
        loaded.signatures["encode_text"](text=tf.constant(np.full((1, 10), np.nan, np.float32)))
    expected = load_index(summary["indexes"]["BFlat-text"]).search(packed, 5)
    server = SearchServer(in_process_searcher(config.layout.serving, config.layout.indexes, "BFlat-text",
                                              query_modality="image")).start()  # fmt: skip
    try:
        with SearchClient(server.address) as client:
            answer = client.search(examples=queries, k=5)
    finally:
        server.stop(0)
    assert not answer.refined and all(load_embeddings(path) is None for path in summary["indexes"].values())
    np.testing.assert_array_equal(np.stack(answer.ids), expected.ids)


def _raw_rows(config, split: str, names: list[str]):
    import numpy as np
    import tensorflow as tf

    files = sorted(tf.io.gfile.glob(os.path.join(config.layout.data, split, "*")))
    examples = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    rows = {name: np.array([e.features.feature[name].float_list.value for e in examples], np.float32) for name in names}
    rows["id"] = np.array([e.features.feature["id"].int64_list.value[0] for e in examples])
    return examples, rows


def check_input_maps_learned_from_the_training_split(config):
    """The Transform graph maps query rows exactly as NumPy does with the training rows' statistics
    alone (``image``: RBF on the training rows with the smallest id hashes, padded to 500 anchors,
    then per-feature z-scores, all unchanged by a z-score with one mean and variance first;
    ``text``: per-feature z-scores): a query row cannot have moved any of them."""
    import numpy as np
    import tensorflow as tf
    import tensorflow_transform as tft
    from tfhash.components.input_maps import RBF_ANCHORS
    from tfhash.components.label_statistics import anchor_key

    (graph,) = tf.io.gfile.glob(os.path.join(config.layout.pipeline_root, "Transform", "transform_graph", "*"))
    output = tft.TFTransformOutput(graph)
    _, train = _raw_rows(config, "train", ["image", "text"])
    queries, query = _raw_rows(config, "query", ["image", "text"])
    spec = {k: v for k, v in output.raw_feature_spec().items() if k in ("id", "image", "text")}
    mapped = output.transform_raw_features(tf.io.parse_example([e.SerializeToString() for e in queries], spec),
                                           drop_unused_features=True)  # fmt: skip
    train_text, query_text = (z_scores(x, train["text"]) for x in (train["text"], query["text"]))
    np.testing.assert_allclose(mapped["text"].numpy(), z_scores(query_text, train_text, axis=0), atol=2e-3)

    train_image, query_image = (z_scores(x, train["image"]) for x in (train["image"], query["image"]))
    anchors = train_image[np.argsort([anchor_key(i) for i in train["id"]])[:RBF_ANCHORS]]
    assert len(anchors) < RBF_ANCHORS  # 200 training rows: the padded case
    squared = lambda x: ((x[:, None, :] - anchors[None, :, :]) ** 2).sum(-1)  # noqa: E731
    sigma = np.sqrt(squared(anchors)).sum() / (len(anchors) * (len(anchors) - 1))  # between two distinct anchors
    features = lambda x: np.pad(np.exp(-squared(x) / (2 * sigma**2)), ((0, 0), (0, RBF_ANCHORS - len(anchors))))  # noqa: E731
    np.testing.assert_allclose(mapped["image"].numpy(), z_scores(features(query_image), features(train_image), axis=0),
                               atol=2e-3)  # fmt: skip


@pytest.mark.beam
@pytest.mark.process
def test_pretrained_image_pipelines(tmp_path):
    """The shipped CIFAR-10 configs' code paths on 200 images: JPEGs through ExampleGen,
    EfficientNet-Lite0 with its pip package's ImageNet weights trained one epoch at 32x32 (``cifar10``: above its cached
    trunk, in its precision; then ``cifar10-gpu``: every layer, the papers' schedule), exported with
    both image signatures, indexed; a query's encoded example and its raw pixels get the same code,
    and the index answers it. Both run in one run directory, as a user switching configs would: the
    second reuses TFX's cache up to Transform and trains, evaluates, pushes and indexes anew."""
    import numpy as np
    import tensorflow as tf
    from tfhash.pipelines.runner import run_local

    from tfhash.index import load_index

    versions = []
    for shipped, trunks in (("cifar10", 1), ("cifar10-gpu", 1)):  # the second trains every layer: no trunk of its own
        training = json.loads((CONFIGS / f"{shipped}.json").read_text())["training"]
        config = small_config(tmp_path, name="tiny-cifar10", dataset="cifar10", limit=200, map_threshold=0.0, max_regression=1.0,
                              training={**training, "bits": 16, "image_size": 32, "epochs": 1, "batch_size": 32})  # fmt: skip
        summary = run_local(config, log=lambda message: None)
        assert summary["blessed"] is True and summary["metrics"]["bits"] == 16, shipped
        assert len(os.listdir(config.layout.trunk_cache)) == trunks, shipped
        loaded = tf.saved_model.load(summary["model_dir"])
        assert {"serving_default", "encode_pixels"} <= set(loaded.signatures)
        files = sorted(tf.io.gfile.glob(os.path.join(config.layout.data, "query", "*")))
        queries = [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP").take(4)]
        pixels = np.stack([tf.io.decode_image(tf.train.Example.FromString(q).features.feature["image"].bytes_list.value[0]).numpy()
                           for q in queries])  # fmt: skip
        by_example = loaded.signatures["serving_default"](examples=tf.constant(queries))["packed_codes"].numpy()
        by_pixels = loaded.signatures["encode_pixels"](pixels=tf.constant(pixels))["packed_codes"].numpy()
        np.testing.assert_array_equal(by_example, by_pixels)
        assert load_index(summary["indexes"]["BFlat"]).search(by_pixels, 5).ids.shape == (4, 5)
        versions.append(summary["model_version"])
    assert len(set(versions)) == 2  # the second run pushed a version of its own


@pytest.mark.beam
@pytest.mark.process
def test_tuner_chooses_the_recipe_the_trainer_trains(tmp_path):
    """The stock Tuner component searches tfhash.tuning's space on the training rows; the Trainer
    trains exactly the recipe it chose; the summary records the choice and the trials."""
    from tfhash.components.trainer import tuned_training
    from tfhash.pipelines.runner import run_local, run_outputs

    from tfhash.artifacts import TUNER_CHOICE_FILE

    config = small_config(tmp_path, name="tiny-tuned", dataset="mirflickr25k", modality="text", limit=400, map_threshold=0.0,
                          training={"recipe": "multi-label", "bits": 16}, tuner={"max_units": 3, "trials": 3})  # fmt: skip
    summary = run_local(config, log=lambda message: None)
    tuning = summary["tuning"]
    from tfhash.tuning import SEARCH_SPACES

    assert tuning["chosen"]["kind"] == "multi-label" and tuning["chosen"]["variant"] in SEARCH_SPACES["multi-label"].methods
    assert 1 <= len(tuning["trials"]) <= 3 and all(0 <= t["score"] <= 1 for t in tuning["trials"])
    chosen = json.loads(open(os.path.join(run_outputs(config)[("Tuner", "best_hyperparameters")].uri, TUNER_CHOICE_FILE)).read())
    expected = tuned_training(config.training, chosen, ["text"])
    assert summary["training"] == json.loads(json.dumps(expected.to_dict())) and summary["blessed"] is True
    with pytest.raises(ValueError, match="tuner chooses among recipes for feature vectors"):
        small_config(tmp_path, tuner={"trials": 2})
    with pytest.raises(ValueError, match="tuner.trials must be a positive integer"):
        small_config(tmp_path, name="t", dataset="mirflickr25k", modality="text", training={"recipe": "multi-label"},
                     tuner={"trials": 0})  # fmt: skip


@pytest.mark.beam
@pytest.mark.process
def test_photo_tuner_searches_above_the_trainers_trunk_cache(tmp_path):
    """With an image network above a trunk cache, the stock Tuner searches the photo space
    (tfhash.tuning.PhotoSpace) on the training images, its trials above one trunk cache in the run's
    folder (the Trainer builds its own, of every training row), and the Trainer trains exactly the
    spec it chose."""
    from tfhash.components.trainer import tuned_training
    from tfhash.pipelines.runner import run_local, run_outputs

    from tfhash.artifacts import TUNER_CHOICE_FILE
    from tfhash.training_spec import PHOTOS

    training = json.loads((CONFIGS / "cifar10.json").read_text())["training"]
    config = small_config(tmp_path, name="tiny-photos", dataset="cifar10", limit=200, map_threshold=0.0, max_regression=1.0,
                          training={**training, "bits": 16, "image_size": 32, "epochs": 2, "batch_size": 32},
                          tuner={"max_units": 2, "factor": 2, "trials": 2})  # fmt: skip
    summary = run_local(config, log=lambda message: None)
    tuning = summary["tuning"]
    assert tuning["chosen"]["kind"] == PHOTOS and len(tuning["trials"]) == 2
    assert all(0 <= t["score"] <= 1 for t in tuning["trials"])
    assert len(os.listdir(config.layout.trunk_cache)) == 2  # the trials' cache and the Trainer's
    chosen = json.loads(open(os.path.join(run_outputs(config)[("Tuner", "best_hyperparameters")].uri, TUNER_CHOICE_FILE)).read())
    expected = tuned_training(config.training, chosen, ["image"])
    assert summary["training"] == json.loads(json.dumps(expected.to_dict())) and summary["blessed"] is True
