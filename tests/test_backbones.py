"""Image backbones by name or path, fine-tuning recipes, and their serving round trip (random
weights: CI downloads nothing)."""

from __future__ import annotations

import inspect
import io
import json
import logging
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from tfhash.serving.client import ModelClient
from tfhash.serving.deployment import model_config, models_config
from tfhash.serving.errors import ServingError
from tfhash.serving.model_server import DevModelServer

from tfhash.export import export_image_model
from tfhash.fine_tuning import FINE_TUNING_DEFAULTS, FineTuning
from tfhash.models import AUGMENTATIONS, IMAGE_NETWORKS, BackboneError, build_scdh, image_backbone
from tfhash.optimizers import compile_fine_tuning
from tfhash.schedules import learning_rate_schedule

SHAPE = (32, 32, 3)
BITS = 16


def pixels(n: int, seed: int = 0, shape=SHAPE) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)


def png_example(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[buffer.getvalue()]))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def user_encoder(folder, kind: str, pooled: bool = True) -> str:
    """A user's own encoder of 0..255 RGB pixels: a .keras file or a SavedModel directory."""
    inputs = keras.Input((24, 24, 3))
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.Conv2D(8, 3, activation="relu")(x)
    x = keras.layers.BatchNormalization()(x)
    if pooled:
        x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, x)
    if kind == "keras":
        path = str(folder / "encoder.keras")
        model.save(path)
    else:
        path = str(folder / "encoder_savedmodel")
        model.export(path, verbose=False)
    return path


def one_step_model(backbone_name: str, seed: int = 0):
    keras.utils.set_random_seed(seed)
    size = None if backbone_name.startswith("/") else 32  # an encoder runs at the size it declares
    backbone = image_backbone(backbone_name, SHAPE, size=size, weights=None, augment=True, dropout=0.5)
    model = build_scdh(backbone, 10, BITS)
    x, y = pixels(16, seed), np.eye(10, dtype="float32")[np.arange(16) % 10]
    compile_fine_tuning(model, FineTuning.for_backbone(backbone_name), epochs=1, steps_per_epoch=1)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    return model


#: One real round trip each: the cheapest ImageNet network of the catalogue and both kinds of a
#: user's encoder (every other network name: the structural checks below).
ROUND_TRIPS = ("squeezenet", "encoder.keras", "encoder-savedmodel")

FRESH_PROCESS = """
import json, sys, numpy as np, tensorflow as tf
images = np.load(sys.argv[1])
codes = {path: tf.saved_model.load(path).signatures["encode_pixels"](pixels=tf.constant(images))["packed_codes"].numpy().tolist()
         for path in sys.argv[2:]}
print(json.dumps(codes))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each of :data:`ROUND_TRIPS` built (with augmentation and feature dropout), trained one step
    and exported as version 1 of its own model base directory; with its Keras codes of six images."""
    root = tmp_path_factory.mktemp("backbones")
    images, found = pixels(6, seed=1), {}
    for name in ROUND_TRIPS:
        folder = root / name
        folder.mkdir()
        encoder = {"encoder.keras": "keras", "encoder-savedmodel": "savedmodel"}.get(name)
        backbone_name = user_encoder(folder, encoder) if encoder else name
        model = one_step_model(backbone_name)
        export_image_model(model, str(folder / "models" / "1"), SHAPE, BITS)
        found[name] = {"base": str(folder / "models"), "keras_codes": np.asarray(model(images.astype("float32"), training=False)["codes"])}
    return images, found


@pytest.mark.parametrize("name", ROUND_TRIPS)
def test_the_export_encodes_as_the_trained_model(name, exported):
    """Pixels and serialized examples get the Keras model's codes from the SavedModel."""
    images, found = exported
    loaded = tf.saved_model.load(os.path.join(found[name]["base"], "1"))
    by_pixels = loaded.signatures["encode_pixels"](pixels=tf.constant(images))
    by_examples = loaded.signatures["serving_default"](examples=tf.constant([png_example(i) for i in images]))
    np.testing.assert_allclose(by_pixels["codes"].numpy(), found[name]["keras_codes"], atol=1e-4)
    np.testing.assert_array_equal(by_examples["packed_codes"].numpy(), by_pixels["packed_codes"].numpy())


def _packed(base: str, images) -> np.ndarray:
    return tf.saved_model.load(os.path.join(base, "1")).signatures["encode_pixels"](pixels=tf.constant(images))["packed_codes"].numpy()


@pytest.mark.process
def test_a_fresh_process_loads_each_export_and_gets_the_same_codes(exported, tmp_path):
    images, found = exported
    np.save(tmp_path / "images.npy", images)
    paths = [os.path.join(entry["base"], "1") for entry in found.values()]
    fresh = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(tmp_path / "images.npy"), *paths],
                           capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, check=True)  # fmt: skip
    codes = json.loads(fresh.stdout.strip().splitlines()[-1])
    for name, entry in found.items():
        np.testing.assert_array_equal(np.asarray(codes[os.path.join(entry["base"], "1")], np.uint8), _packed(entry["base"], images), name)


@pytest.mark.server
def test_the_development_model_server_serves_each_export(exported):
    images, found = exported
    server = DevModelServer(models_config([model_config(name, entry["base"]) for name, entry in found.items()]),
                            poll_seconds=0.2).start()  # fmt: skip
    try:
        for name, entry in found.items():
            with ModelClient(server.address, name) as client:
                np.testing.assert_array_equal(client.encode_pixels(images).packed_codes, _packed(entry["base"], images), name)
                with pytest.raises(ServingError, match="uint8"):
                    client.encode_pixels(images.astype("float32"))
    finally:
        server.stop(0)


def family(name: str) -> str:
    """The network's family: names that differ only in their scale (efficientnetb0-b7, the two
    mobilenetv3) build from the same code."""
    return re.sub(r"(b\d|small|large)$", "", name)


#: One network of each family is built; the others are checked against their constructor.
BUILT = sorted({family(name): name for name in sorted(IMAGE_NETWORKS, reverse=True)}.values())


@pytest.mark.parametrize("name", sorted(IMAGE_NETWORKS))
def test_every_network_name_names_a_constructor_that_takes_its_options(name):
    """The cheap structural check of every network name (one real round trip: squeezenet, above;
    one build per family: below): its constructor exists and takes what the backbone passes."""
    network = IMAGE_NETWORKS[name]
    if network.constructor is None:  # tfhash's own SqueezeNet
        return
    accepted = inspect.signature(getattr(keras.applications, network.constructor)).parameters
    assert {"include_top", "weights", "input_shape", "pooling", "name", *network.options} <= set(accepted)


@pytest.mark.parametrize("name", BUILT)
def test_a_network_of_each_family_builds_as_the_catalogue_says(name):
    """Built from its constructor and options with augmentation and feature dropout, at a small
    side, it maps a batch of raw pixels to one finite feature vector per image, inside the
    backbone's "network" layer, with the preprocessing the catalogue names."""
    network = IMAGE_NETWORKS[name]
    backbone = image_backbone(name, SHAPE, size=32, weights=None, augment=True, dropout=0.5)
    features = backbone(pixels(2).astype("float32"), training=False).numpy()
    assert features.ndim == 2 and features.shape[0] == 2 and np.isfinite(features).all()
    assert backbone.get_layer("network").output.shape[-1] == features.shape[1]
    layers = {layer.name for layer in backbone.layers}
    assert ("caffe_preprocess" in layers) == (network.preprocess == "caffe") and {"augmentation", "feature_dropout"} <= layers


def test_images_of_another_size_are_refused_by_the_export(exported):
    loaded = tf.saved_model.load(os.path.join(exported[1]["squeezenet"]["base"], "1"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="not 32x32x3, the size the model takes"):
        loaded.signatures["serving_default"](examples=tf.constant([png_example(pixels(1, shape=(40, 32, 3))[0])]))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        loaded.signatures["encode_pixels"](pixels=tf.constant(pixels(1, shape=(64, 64, 3))))


def test_grey_images_feed_an_rgb_network():
    backbone = image_backbone("squeezenet", (28, 28), size=32, weights=None)
    assert backbone(np.zeros((2, 28, 28), "float32")).shape == (2, 512)


def test_bad_backbones_are_clear_errors(tmp_path):
    with pytest.raises(BackboneError, match="unknown backbone 'resnet5'.*resnet50"):
        image_backbone("resnet5", SHAPE)
    with pytest.raises(BackboneError, match="never downloads"):
        image_backbone("resnet50", SHAPE)
    for name, network in IMAGE_NETWORKS.items():  # every name without an offline file says so
        if network.imagenet_file is None and network.imagenet_package is None:
            with pytest.raises(BackboneError, match=f"keras.applications.{network.constructor}"):
                image_backbone(name, SHAPE)
    weights = tmp_path / "squeezenet.weights.h5"
    image_backbone("squeezenet", SHAPE, size=32, weights=None).get_layer("network").save_weights(str(weights))
    with pytest.raises(BackboneError, match="do not fit its architecture"):
        image_backbone("resnet50", SHAPE, size=32, weights=str(weights))
    with pytest.raises(BackboneError, match="missing.h5.* is neither .imagenet. nor an existing weights file"):
        image_backbone("resnet50", SHAPE, size=32, weights=str(tmp_path / "missing.h5"))
    with pytest.raises(BackboneError, match="feature map of shape"):
        image_backbone(user_encoder(tmp_path, "keras", pooled=False), SHAPE)
    with pytest.raises(BackboneError, match="no such file"):
        image_backbone(str(tmp_path / "nothing.keras"), SHAPE)
    with pytest.raises(BackboneError, match="neither grey"):
        image_backbone("squeezenet", (32, 32, 4), weights=None)


@pytest.mark.parametrize("augment", [True, *AUGMENTATIONS])
def test_augmentation_is_training_only(augment):
    plain = image_backbone("squeezenet", SHAPE, size=32, weights=None)
    augmented = image_backbone("squeezenet", SHAPE, size=32, weights=None, augment=augment)
    augmented.get_layer("network").set_weights(plain.get_layer("network").get_weights())
    x = pixels(4).astype("float32")
    np.testing.assert_allclose(augmented(x), plain(x), rtol=1e-5, atol=1e-5)
    assert not np.allclose(augmented(x, training=True), plain(x), rtol=1e-3, atol=1e-3)
    with pytest.raises(BackboneError, match="unknown augmentation 'crop'.*zoom"):
        image_backbone("squeezenet", SHAPE, weights=None, augment="crop")
    with pytest.raises(ValueError, match="unknown augmentation 'crop'"):
        FineTuning.for_backbone("squeezenet", augment="crop")


def test_the_shared_squeezenet_weights_load(caplog):
    with caplog.at_level(logging.INFO, logger="tfhash.models.backbones"):
        backbone = image_backbone("squeezenet", SHAPE, size=64)
    assert backbone(pixels(2).astype("float32")).shape == (2, 512)
    assert "backbone squeezenet at 64x64: weights " in caplog.text and "squeezenet_v1.1_notop_tf.h5" in caplog.text


@pytest.mark.parametrize("distributed", [False, True])
def test_backbone_rate_and_frozen_warmup(distributed):
    """SGD without momentum: the backbone moves at backbone_learning_rate / learning_rate of the
    rate it would move at alone, and not at all during frozen epochs; the head always moves. Also
    under the Trainer's MirroredStrategy (distributed variables)."""
    x, y = pixels(8).astype("float32"), np.eye(10, dtype="float32")[np.arange(8)]

    def backbone_step(**recipe):
        keras.utils.set_random_seed(0)
        strategy = tf.distribute.MirroredStrategy() if distributed else tf.distribute.get_strategy()
        with strategy.scope():
            backbone = image_backbone("squeezenet", SHAPE, size=32, weights=None)
            model = build_scdh(backbone, 10, BITS)
            model(x[:1])
            before = [v.numpy().copy() for v in backbone.trainable_variables]
            head = model.hash_head.trainable_variables[0].numpy().copy()
            settings = {"optimizer": "sgd", "momentum": 0.0, "weight_decay": 0.0, "augment": False, "schedule": "constant"}
            compile_fine_tuning(model, FineTuning(**{**settings, **recipe}), epochs=1, steps_per_epoch=1)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        moved = sum(float(np.abs(v.numpy() - b).sum()) for v, b in zip(backbone.trainable_variables, before, strict=True))
        return moved, float(np.abs(model.hash_head.trainable_variables[0].numpy() - head).sum())

    full, head_full = backbone_step(learning_rate=0.01)
    tenth, head_tenth = backbone_step(learning_rate=0.01, backbone_learning_rate=0.001)
    frozen, head_frozen = backbone_step(learning_rate=0.01, backbone_learning_rate=0.001, frozen_epochs=1)
    assert full > 0 and tenth == pytest.approx(full / 10, rel=1e-3)
    assert frozen == 0.0 and head_frozen == pytest.approx(head_full, rel=1e-5) and head_tenth == pytest.approx(head_full, rel=1e-5)


def test_adamw_decays_the_backbone_at_its_own_rate_and_not_while_frozen():
    """Zero gradients, so every change is AdamW's decoupled decay: rate x weight_decay per step for
    the head, backbone rate x weight_decay for the backbone once it is no longer frozen."""
    optimizer = FineTuning(optimizer="adamw", learning_rate=0.1, backbone_learning_rate=0.01, weight_decay=0.5,
                           frozen_epochs=1).make_optimizer(epochs=2, steps_per_epoch=1)  # fmt: skip
    head, backbone = keras.Variable(np.ones(3, "float32")), keras.Variable(np.ones(3, "float32"))
    optimizer.build([head, backbone])
    optimizer.set_backbone_variables([backbone])
    zeros = [np.zeros(3, "float32")] * 2
    optimizer.apply_gradients(zip(zeros, [head, backbone], strict=True))
    assert np.allclose(head.numpy(), 0.95) and np.allclose(backbone.numpy(), 1.0)  # frozen: no decay either
    optimizer.apply_gradients(zip(zeros, [head, backbone], strict=True))
    assert np.allclose(head.numpy(), 0.95 * 0.95) and np.allclose(backbone.numpy(), 1.0 - 0.01 * 0.5)


def test_fine_tuning_recipes():
    assert FineTuning.for_backbone("squeezenet").backbone_learning_rate == FINE_TUNING_DEFAULTS["pretrained"]["backbone_learning_rate"]
    assert FineTuning.for_backbone("small_cnn") == FineTuning()
    step = learning_rate_schedule(0.01, "step", epochs=8, steps_per_epoch=10, decay_epochs=[5, 7], decay_rate=0.2)
    assert [float(step(s)) for s in (0, 49, 50, 69, 70)] == pytest.approx([0.01, 0.01, 0.002, 0.002, 0.0004])
    cosine = learning_rate_schedule(0.01, "cosine", epochs=2, steps_per_epoch=5)
    assert float(cosine(0)) == pytest.approx(0.01) and float(cosine(10)) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="unknown setting .training.fine_tuning.learning_rat.: did you mean .learning_rate."):
        FineTuning.for_backbone("squeezenet", learning_rat=0.1)
    with pytest.raises(ValueError, match="learning rates must be finite"):
        FineTuning(learning_rate=float("nan"))
    with pytest.raises(ValueError, match="unknown optimizer"):
        FineTuning(optimizer="rmsprop")
    with pytest.raises(ValueError, match="unknown learning-rate schedule"):
        FineTuning(schedule="linear")
    options = FineTuning.for_backbone("squeezenet", dropout=0.5).backbone_options()
    assert image_backbone("squeezenet", SHAPE, size=32, weights=None, **options).get_layer("feature_dropout").rate == 0.5
    for rate in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match=r"dropout must be a dropout rate in \[0, 1\)"):
            FineTuning(dropout=rate)


def test_fine_tuning_optimizer_is_serializable():
    optimizer = FineTuning.for_backbone("squeezenet", frozen_epochs=2).make_optimizer(epochs=4, steps_per_epoch=3)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(restored) is type(optimizer)
    assert (restored.backbone_scale, restored.frozen_steps, restored.l2) == (0.1, 6, 5e-4)


def test_pipeline_config_backbone_settings(tmp_path):
    from tfhash.pipelines.config import PipelineConfig

    from tfhash.registry import make_backbone
    from tfhash.training_spec import TrainingSpec

    encoder = user_encoder(tmp_path, "keras")
    (tmp_path / "run.json").write_text(json.dumps({"name": "x", "training": {
        "backbone": "encoder.keras", "fine_tuning": {"optimizer": "adam", "learning_rate": 1e-4}}}))  # fmt: skip
    config = PipelineConfig.load(tmp_path / "run.json")
    assert config.training.backbone == encoder  # relative to the config file
    assert config.training.fine_tuning.optimizer == "adam" and config.training.fine_tuning.augment  # over the pretrained defaults
    shipped = PipelineConfig.load(os.path.join(os.path.dirname(__file__), "..", "pipelines", "configs", "cifar10.json"))
    assert shipped.training.backbone == "efficientnet_lite1" and shipped.training.bits == 48
    for training, message in [({"backbone": "vgg16"}, "unknown backbone 'vgg16'"),
                              ({"backbone": "squeezenet", "fine_tuning": {"lr": 1}}, "unknown setting .training.fine_tuning.lr."),
                              ({"backbone": "squeezenet", "image_size": 8}, "image_size must be"),
                              ({"backbone": "squeezenet", "mixed_precision": "yes"}, "mixed_precision must be")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            PipelineConfig(name="x", training=training)
    with pytest.raises(BackboneError, match="takes images, but this input holds vectors"):
        make_backbone(TrainingSpec(backbone="squeezenet", backbone_weights=None), [128])
