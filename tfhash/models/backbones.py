"""Small backbones for the real datasets (any Keras model mapping inputs to features works)."""

from __future__ import annotations

from collections.abc import Sequence

import keras


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


def mlp(input_dim: int, hidden: Sequence[int] = (1024,), dropout: float = 0.2, name: str = "mlp") -> keras.Model:
    """Fully connected feature extractor for feature vectors (SIFT, LDA topics, tag BoW)."""
    inputs = keras.Input(shape=(int(input_dim),), name="features")
    x = inputs
    for units in hidden:
        x = keras.layers.Dense(units, activation="relu")(x)
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, x, name=name)


@keras.saving.register_keras_serializable(package="tfhash")
class CaffePreprocess(keras.layers.Layer):
    """RGB uint8 pixels -> Caffe-style input: BGR order minus the ImageNet channel means
    [103.939, 116.779, 123.68] (what the shared SqueezeNet weights expect)."""

    MEAN_BGR = (103.939, 116.779, 123.68)

    def call(self, images):
        images = keras.ops.cast(images, "float32")
        return images[..., ::-1] - keras.ops.convert_to_tensor(self.MEAN_BGR, dtype="float32")


def _fire(x, index: int, squeeze: int, expand: int):
    s = keras.layers.Conv2D(squeeze, 1, activation="relu", name=f"fire{index}_squeeze1x1")(x)
    e1 = keras.layers.Conv2D(expand, 1, activation="relu", name=f"fire{index}_expand1x1")(s)
    e3 = keras.layers.Conv2D(expand, 3, padding="same", activation="relu", name=f"fire{index}_expand3x3")(s)
    return keras.layers.Concatenate(name=f"fire{index}_concat")([e1, e3])


def squeezenet(input_shape: Sequence[int] = (128, 128, 3), weights: str | None = "shared", resize_from=None,
               data_root=None, name: str = "squeezenet") -> keras.Model:  # fmt: skip
    """SqueezeNet v1.1 without its classifier, global-average-pooled to 512 features.

    Args:
        input_shape: the shape the network runs at.
        weights: ``"shared"`` loads the ImageNet weights of ``<data root>/weights/`` (legacy HDF5,
            matched by layer order), a path loads that file, ``None`` keeps the random init.
        resize_from: the shape of the raw input, resized to ``input_shape`` inside the model
            (e.g. ``(32, 32, 3)`` for CIFAR-10 pixels).
    """
    inputs = keras.Input(shape=tuple(resize_from or input_shape), name="image")
    x = inputs
    if resize_from is not None:
        x = keras.layers.Resizing(input_shape[0], input_shape[1], name="resize")(keras.ops.cast(x, "float32"))
    x = CaffePreprocess(name="caffe_preprocess")(x)
    x = keras.layers.Conv2D(64, 3, strides=2, activation="relu", name="conv1")(x)
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
    if weights == "shared":
        from tfhash.data import find_data_file

        weights = str(find_data_file("weights/squeezenet_v1.1_notop_tf.h5", data_root))
    if weights is not None:
        model.load_weights(weights)
    return model
