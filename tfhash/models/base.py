"""What every tfhash model shares: ``encode`` to +-1 codes and target unpacking."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops


def binarize(codes):
    """sign with sign(0) = +1, as ``int8`` +-1 (DESIGN.md s.2); stock ops only."""
    return ops.cast(ops.where(codes >= 0, 1, -1), "int8")


def unpack_targets(y):
    """``y`` is the labels, or a dict with ``labels`` and optional JCCH ``q`` / ``u``."""
    if isinstance(y, dict):
        if "labels" not in y:
            raise ValueError("a target dict must hold 'labels' (and optionally 'q', 'u')")
        return y["labels"], y.get("q"), y.get("u")
    return y, None, None


class EncoderMixin:
    """``encode(x)``: +-1 ``int8`` codes of the model's continuous ``codes`` output."""

    def continuous_codes(self, x, batch_size: int = 512) -> np.ndarray:
        return np.asarray(self.predict(x, batch_size=batch_size, verbose=0)["codes"])

    def encode(self, x, batch_size: int = 512) -> np.ndarray:
        return np.asarray(binarize(self.continuous_codes(x, batch_size)))


def loss_trackers(model: keras.Model, names) -> dict:
    """Create one ``Mean`` metric per loss part, set as attributes so Keras tracks and resets them."""
    trackers = {}
    for name in names:
        tracker = keras.metrics.Mean(name=name)
        setattr(model, f"_{name}_tracker", tracker)
        trackers[name] = tracker
    return trackers


class NestedConfigMixin:
    """``get_config`` / ``from_config`` for models whose constructor takes Keras objects (a
    backbone, a dict of backbones, sub-models): ``nested_keys`` names those arguments, and
    :meth:`config_params` returns the plain ones."""

    nested_keys: tuple[str, ...] = ()

    def config_params(self) -> dict:
        raise NotImplementedError

    def get_config(self):
        nested = {}
        for key in self.nested_keys:
            value = getattr(self, key)
            if isinstance(value, dict):
                nested[key] = {name: keras.saving.serialize_keras_object(obj) for name, obj in value.items()}
            else:
                nested[key] = keras.saving.serialize_keras_object(value)
        return {**super().get_config(), **nested, **self.config_params()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in cls.nested_keys:
            value = config[key]
            if isinstance(value, dict) and "class_name" not in value:
                config[key] = {name: keras.saving.deserialize_keras_object(obj) for name, obj in value.items()}
            else:
                config[key] = keras.saving.deserialize_keras_object(value)
        return cls(**config)
