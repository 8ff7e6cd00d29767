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
