"""Proxy layers: fixed hash-consistent proxies (HCLM) and learnable proxies (HyP2)."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

__all__ = ["FixedProxies", "LearnableProxies"]


@keras.saving.register_keras_serializable(package="tfhash")
class FixedProxies(keras.layers.Layer):
    """Last layer whose weights are the given proxies: logits nu(x).w_c (HCLM). The proxies are
    fixed unless ``learn=True`` (the "learned proxies" arm of the HCLM ablation).

    Args:
        proxies: ``(C, K)`` finite array: +-1 HCLM proxies (:func:`tfhash.proxies.hclm_proxies`),
            or real-valued ones (e.g. Tammes points) for the ablation.
        learn: train the proxies (initialised from ``proxies``).
    """

    def __init__(self, proxies, learn: bool = False, **kwargs):
        super().__init__(**kwargs)
        proxies = np.asarray(proxies, dtype=np.float32)
        if proxies.ndim != 2 or not np.all(np.isfinite(proxies)):
            raise ValueError("proxies must be a finite (C, K) array")
        self.num_classes, self.bits = proxies.shape
        self.learn = bool(learn)
        self.proxies = self.add_weight(
            name="proxies", shape=proxies.shape, initializer=keras.initializers.Constant(proxies), trainable=self.learn
        )

    def call(self, codes):
        return ops.matmul(codes, ops.transpose(self.proxies))

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.num_classes)

    def get_config(self):
        return {**super().get_config(), "proxies": ops.convert_to_numpy(self.proxies).tolist(), "learn": self.learn}


@keras.saving.register_keras_serializable(package="tfhash")
class LearnableProxies(keras.layers.Layer):
    """C trainable proxies in R^K (HyP2), initialised N(0, 2/C) as the official code does; returns
    the cosine of each code to each proxy, ``(n, C)``."""

    def __init__(self, num_classes: int, bits: int, **kwargs):
        super().__init__(**kwargs)
        self.num_classes, self.bits = int(num_classes), int(bits)
        self.proxies = self.add_weight(
            name="proxies",
            shape=(self.num_classes, self.bits),
            initializer=keras.initializers.RandomNormal(stddev=float(np.sqrt(2.0 / self.num_classes))),
            trainable=True,
        )

    def call(self, codes):
        unit_codes = codes / ops.maximum(ops.norm(codes, axis=-1, keepdims=True), 1e-12)
        unit_proxies = self.proxies / ops.maximum(ops.norm(self.proxies, axis=-1, keepdims=True), 1e-12)
        return ops.matmul(unit_codes, ops.transpose(unit_proxies))

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.num_classes)

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "bits": self.bits}
