"""Backbones: the networks that map an input to a feature vector, ahead of a tfhash head.

* :func:`image_backbone` by name: ImageNet networks (SqueezeNet v1.1, EfficientNet-Lite0/1/2, the
  ``keras.applications`` families of :data:`IMAGE_NETWORKS`) or a user's own encoder, holding
  everything from raw pixels to the feature vector so that an exported graph receives raw pixels.
* :func:`small_cnn` (images, from scratch) and :func:`mlp` (feature vectors).

The catalogue of networks and the checks of a backbone's name and weights are
:mod:`tfhash.networks` (no TensorFlow there).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import keras

from tfhash.networks import (
    EFFICIENTNET_LITE,
    IMAGE_NETWORKS,
    IMAGENET,
    OTHER_BACKBONES,
    BackboneError,
    augmentation_policy,
    check_backbone_name,
    resolve_weights,
)
from tfhash.state_dicts import CheckpointError

__all__ = ["small_cnn", "mlp", "Augmentation", "squeezenet_network", "image_backbone", "squeezenet", "NETWORK", "network_node"]


logger = logging.getLogger(__name__)

#: The name of the nested network inside a backbone of :func:`image_backbone` (the layers that
#: hold the pretrained weights, between the preprocessing and the feature dropout).
NETWORK = "network"


def small_cnn(input_shape: Sequence[int] = (28, 28), width: int = 32, features: int = 256, name: str = "small_cnn") -> keras.Model:
    """A CPU-sized CNN for 28x28 grey or 32x32 colour images given as raw ``uint8`` pixels
    (rescaled to [0, 1] inside the model)."""
    shape = tuple(input_shape)
    inputs = keras.Input(shape=shape, name="image")
    x = keras.layers.Rescaling(1.0 / 255.0)(inputs)
    if len(shape) == 2:
        x = keras.layers.Reshape((*shape, 1))(x)
    for multiplier in (1, 2):
        x = keras.layers.Conv2D(width * multiplier, 3, padding="same", activation="relu")(x)
        x = keras.layers.Conv2D(width * multiplier, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dropout(0.3)(x)
    x = keras.layers.Dense(features, activation="relu")(x)
    return keras.Model(inputs, x, name=name)


def mlp(input_dim: int, hidden: Sequence[int] = (1024,), dropout: float = 0.2, name: str = "mlp",
        input_dropout: float = 0.0, input_map: Sequence[keras.layers.Layer] = ()) -> keras.Model:  # fmt: skip
    """Fully connected feature extractor for feature vectors (SIFT, LDA topics, tag BoW): ReLU
    layers of ``hidden`` units, each followed by ``dropout``; ``input_dropout`` drops input features
    first (a regulariser for small training sets of weak features, e.g. Wiki's SIFT words). With
    ``hidden=()`` the features pass through unchanged (a linear hash layer follows). ``input_map``:
    adapted layers applied to the raw vectors first (:func:`tfhash.layers.input_map_layers`), so
    the model takes raw vectors."""
    for rate in (dropout, input_dropout):
        if not 0 <= rate < 1:
            raise ValueError(f"dropout rates must be in [0, 1); got {rate}")
    inputs = keras.Input(shape=(int(input_dim),), name="features")
    x = inputs
    for layer in input_map:
        x = layer(x)
    x = keras.layers.Dropout(input_dropout)(x) if input_dropout else keras.layers.Identity()(x)
    for units in hidden:
        x = keras.layers.Dense(units, activation="relu")(x)
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, x, name=name)


@keras.saving.register_keras_serializable(package="tfhash")
class CaffePreprocess(keras.layers.Layer):
    """RGB pixels in 0..255 -> Caffe-style input: BGR order minus the ImageNet channel means
    [103.939, 116.779, 123.68] (what the shared SqueezeNet weights and ResNet50 expect)."""

    MEAN_BGR = (103.939, 116.779, 123.68)

    def call(self, images):
        images = keras.ops.cast(images, "float32")
        return images[..., ::-1] - keras.ops.convert_to_tensor(self.MEAN_BGR, dtype="float32")


@keras.saving.register_keras_serializable(package="tfhash")
class Augmentation(keras.layers.Layer):
    """A policy of :data:`AUGMENTATIONS`, applied only when called with ``training=True`` (Keras's
    random layers default to augmenting when a model is called without ``training``; a backbone
    called on its own must encode, not augment)."""

    def __init__(self, policy: str = "shift", seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.policy, self.seed = augmentation_policy(policy), seed
        steps = [keras.layers.RandomZoom((-0.3, 0.0), fill_mode="reflect", seed=seed)] if self.policy == "zoom" else []
        self.steps = [*steps, keras.layers.RandomTranslation(0.125, 0.125, fill_mode="reflect", seed=seed),
                      keras.layers.RandomFlip("horizontal", seed=seed)]  # fmt: skip

    def build(self, input_shape):
        for step in self.steps:
            step.build(input_shape)

    def call(self, images, training=False):
        if not training:
            return images
        for step in self.steps:
            images = step(images, training=True)
        return images

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "policy": self.policy, "seed": self.seed}


def _fire(x, index: int, squeeze: int, expand: int):
    s = keras.layers.Conv2D(squeeze, 1, activation="relu", name=f"fire{index}_squeeze1x1")(x)
    e1 = keras.layers.Conv2D(expand, 1, activation="relu", name=f"fire{index}_expand1x1")(s)
    e3 = keras.layers.Conv2D(expand, 3, padding="same", activation="relu", name=f"fire{index}_expand3x3")(s)
    return keras.layers.Concatenate(name=f"fire{index}_concat")([e1, e3])


def squeezenet_network(input_shape: Sequence[int] = (224, 224, 3), weights: str | None = None, name: str = "squeezenet") -> keras.Model:
    """SqueezeNet v1.1 without its classifier, global-average-pooled to 512 features, on
    Caffe-preprocessed input (:class:`CaffePreprocess`). ``weights``: a weights file (the shared
    ImageNet file matches by layer order) or None."""
    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x = keras.layers.Conv2D(64, 3, strides=2, activation="relu", name="conv1")(inputs)
    x = keras.layers.MaxPooling2D(3, strides=2, name="pool1")(x)
    x = _fire(x, 2, 16, 64)
    x = _fire(x, 3, 16, 64)
    x = keras.layers.MaxPooling2D(3, strides=2, name="pool3")(x)
    x = _fire(x, 4, 32, 128)
    x = _fire(x, 5, 32, 128)
    x = keras.layers.MaxPooling2D(3, strides=2, name="pool5")(x)
    for index, (squeeze, expand) in zip(range(6, 10), ((48, 192), (48, 192), (64, 256), (64, 256)), strict=True):
        x = _fire(x, index, squeeze, expand)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    model = keras.Model(inputs, x, name=name)
    if weights is not None:
        model.load_weights(weights)
    return model


def _network(backbone: str, side: int, weights: str | None, data_root) -> keras.Model:
    """The named network at ``side`` x ``side`` with its weights (:func:`tfhash.networks.resolve_weights`),
    logging which weights file it loaded."""
    path = resolve_weights(backbone, weights, data_root)
    network = IMAGE_NETWORKS[backbone]
    logger.info("backbone %s at %dx%d: %s", backbone, side, side, f"weights {path}" if path else "random initial weights")
    try:
        if backbone in EFFICIENTNET_LITE:
            from tfhash.models.efficientnet_lite import efficientnet_lite

            return efficientnet_lite(backbone, (side, side, 3), path, name=NETWORK)
        if network.constructor is None:
            return squeezenet_network((side, side, 3), path, NETWORK)
        build = getattr(keras.applications, network.constructor)
        return build(include_top=False, weights=path, input_shape=(side, side, 3), pooling="avg", name=NETWORK, **network.options)
    except CheckpointError as err:
        raise BackboneError(f"backbone {backbone!r}: weights {path!r} refused: {err}") from err
    except (ValueError, KeyError, OSError) as err:
        if path is None:
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BackboneError(f"backbone {backbone!r}: the weights in {path!r} do not fit its architecture "
                            f"({first[:300]}); give weights saved from the same network, or weights=None") from err  # fmt: skip


def load_encoder(path: str) -> keras.Model | keras.layers.Layer:
    """A user's encoder: a ``.keras`` / ``.h5`` model file (fine-tuned with the rest), or a
    SavedModel directory, wrapped as a :class:`keras.layers.TFSMLayer` on its ``serving_default``
    signature and used frozen: Keras optimizers cannot make slots for the restored variables
    (their names hold ``:0``), so save the encoder as a ``.keras`` file to fine-tune it.

    Raises:
        BackboneError: the path does not exist or holds neither.
    """
    if os.path.isdir(path):
        import tensorflow as tf

        try:
            return keras.layers.TFSMLayer(path, call_endpoint=tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY, trainable=False, name=NETWORK)
        except Exception as err:  # TF raises many types for a folder that is not a SavedModel
            raise BackboneError(f"{path}: not a SavedModel with a serving_default signature ({str(err).splitlines()[0][:300]})") from err
    if not os.path.isfile(path):
        raise BackboneError(f"backbone {path!r}: no such file or folder (a .keras file or a SavedModel directory)")
    try:
        return keras.saving.load_model(path, compile=False)
    except Exception as err:  # Keras raises many types for a file that is not a model
        raise BackboneError(f"{path}: not a Keras model file ({str(err).splitlines()[0][:300]})") from err


def _encoder_input_side(encoder, path: str) -> int | None:
    """The square input side a user's encoder declares, None when it takes any size."""
    if isinstance(encoder, keras.layers.TFSMLayer):
        specs = encoder.call_endpoint_fn.structured_input_signature
        flat = [s for s in keras.tree.flatten(specs) if hasattr(s, "shape")]
        shape = tuple(flat[0].shape) if len(flat) == 1 else None
    else:
        shape = tuple(encoder.inputs[0].shape) if len(encoder.inputs) == 1 else None
    if shape is None or len(shape) != 4 or shape[-1] != 3:
        raise BackboneError(f"{path}: an encoder must take one batch of RGB images (batch, height, width, 3); "
                            f"it takes {shape if shape is not None else 'several inputs'}")  # fmt: skip
    if shape[1] != shape[2]:
        raise BackboneError(f"{path}: encoder input {shape[1]}x{shape[2]} is not square; tfhash resizes to a square side")
    return None if shape[1] is None else int(shape[1])


def _single_output(outputs, path: str):
    if isinstance(outputs, dict):
        if len(outputs) != 1:
            raise BackboneError(f"{path}: the encoder returns several outputs {sorted(outputs)}; it must return one feature vector")
        (outputs,) = outputs.values()
    return outputs


def image_backbone(backbone: str, image_shape: Sequence[int], size: int | None = None, weights: str | None = IMAGENET,
                   augment: bool | str = False, freeze_batch_norm: bool = True, dropout: float = 0.0, data_root=None,
                   name: str = "backbone") -> keras.Model:  # fmt: skip
    """An image backbone for images stored as ``image_shape`` (``(H, W)`` grey or ``(H, W, 3)``).

    The model takes the images as stored (``uint8`` or float pixels in 0..255, any fixed size,
    grey or RGB) and holds everything in between, so an exported graph receives raw pixels: it
    casts the pixels (0..255) to float, in training optionally augments them (a policy of
    :data:`AUGMENTATIONS`), repeats grey to three channels, resizes to ``size`` x ``size``
    (bilinear), applies the network's preprocessing and runs the network.

    The ImageNet networks are SqueezeNet v1.1 with the shared weights, EfficientNet-Lite0/1/2 with
    the weights of their pip packages and the ``keras.applications`` families of
    :data:`IMAGE_NETWORKS`; a user's own encoder is a ``.keras`` file or a SavedModel directory
    mapping images to a feature vector. Nothing is ever downloaded: ``weights="imagenet"``
    resolves to a local file (SqueezeNet's shared weights, an installed package's file) or fails
    with a message that says which file to fetch and where to pass it. Which weights file a
    network loaded is logged (logger ``tfhash.models.backbones``, INFO).

    Args:
        backbone: a name of :data:`IMAGE_NETWORKS` or the path of a user's encoder
            (:func:`load_encoder`), which takes float RGB pixels in 0..255 and does its own
            preprocessing.
        size: the side the network runs at; default the network's own (an encoder's declared one).
        weights: ``"imagenet"`` (a local file, see :func:`resolve_weights`), a weights file, or
            None. Ignored for an encoder path (it carries its weights).
        augment: False, True (``"shift"``) or a name of :data:`AUGMENTATIONS`.
        freeze_batch_norm: batch-norm layers keep their ImageNet statistics and scales (Keras runs a
            non-trainable BatchNormalization in inference mode), the usual choice for fine-tuning
            with small batches.
        dropout: dropout rate on the feature vector, active in training only.

    Raises:
        BackboneError: an unknown name, unusable weights or encoder, a network whose output is a
            feature map rather than a vector, or an image shape that is not grey or RGB.
    """
    check_backbone_name(backbone)
    policy = augmentation_policy(augment)
    if backbone in OTHER_BACKBONES:
        raise BackboneError(f"{backbone!r} is not an image network; use tfhash.models.{backbone} or one of {sorted(IMAGE_NETWORKS)}")
    image_shape = tuple(int(s) for s in image_shape)
    if len(image_shape) not in (2, 3) or (len(image_shape) == 3 and image_shape[-1] not in (1, 3)):
        raise BackboneError(f"images of shape {image_shape} are neither grey (H, W) nor RGB (H, W, 3)")
    if backbone in IMAGE_NETWORKS:
        side = int(size or IMAGE_NETWORKS[backbone].size)
        network, preprocess = _network(backbone, side, weights, data_root), IMAGE_NETWORKS[backbone].preprocess
    else:
        network, preprocess = load_encoder(backbone), "included"
        declared = _encoder_input_side(network, backbone)
        if size and declared and int(size) != declared:
            raise BackboneError(f"{backbone}: the encoder takes {declared}x{declared} images, not size {size}")
        side = int(size or declared or image_shape[0])
    if freeze_batch_norm:
        for layer in getattr(network, "layers", []):
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.trainable = False
    inputs = keras.Input(shape=image_shape, name="image")
    x = keras.ops.cast(inputs, "float32")
    if len(image_shape) == 2:
        x = keras.layers.Reshape((*image_shape, 1), name="channel")(x)
    if policy:
        x = Augmentation(policy, name="augmentation")(x)
    if x.shape[-1] == 1:
        x = keras.layers.Concatenate(name="grey_to_rgb")([x, x, x])
    if image_shape[:2] != (side, side):
        x = keras.layers.Resizing(side, side, name="resize")(x)
    if preprocess == "caffe":
        x = CaffePreprocess(name="caffe_preprocess")(x)
    features = _single_output(network(x), backbone)
    if len(features.shape) != 2:
        raise BackboneError(f"backbone {backbone!r} outputs a feature map of shape {tuple(features.shape)}, not a feature "
                            "vector: end the encoder with a pooling layer (e.g. keras.layers.GlobalAveragePooling2D)")  # fmt: skip
    if dropout:
        features = keras.layers.Dropout(float(dropout), name="feature_dropout")(features)
    return keras.Model(inputs, features, name=name)


def squeezenet(input_shape: Sequence[int] = (128, 128, 3), weights: str | None = "shared", resize_from=None,
               data_root=None, name: str = "squeezenet") -> keras.Model:  # fmt: skip
    """SqueezeNet v1.1 with the shared ImageNet weights (``weights="shared"``, or a file, or None)
    running at ``input_shape``, on raw pixels of shape ``resize_from`` (default ``input_shape``):
    :func:`image_backbone` without augmentation."""
    image_shape = tuple(resize_from or input_shape)
    return image_backbone("squeezenet", image_shape, size=int(input_shape[0]),
                          weights=IMAGENET if weights == "shared" else weights, data_root=data_root, name=name)  # fmt: skip


def network_node(backbone: keras.Model):
    """The nested network of an :func:`image_backbone` and the tensors of the backbone's graph that
    enter and leave it; the backbone itself (its input and output) for a plain functional model."""
    names = [layer.name for layer in backbone.layers]
    if NETWORK in names:
        network = backbone.get_layer(NETWORK)
        node = network._inbound_nodes[0]
        return network, node.input_tensors[0], node.output_tensors[0]
    return backbone, backbone.input, backbone.output
