"""The hash layer: K units producing the continuous code F(x)."""

from __future__ import annotations

import keras

from tfhash.codes import check_bits

__all__ = ["HashHead"]


@keras.saving.register_keras_serializable(package="tfhash")
class HashHead(keras.layers.Layer):
    """Dense layer with ``bits`` outputs: the continuous code F(x) in R^K.

    Args:
        bits: code length K, a positive multiple of 8 (:func:`tfhash.codes.check_bits`: packed
            codes, indexes and metrics store whole bytes), refused otherwise when the model is built.
        activation: ``None`` (linear, SCDH) or ``"tanh"`` (HCLM's nu(x)).
        kernel_initializer: defaults to N(0, 0.01^2), the paper's init for new layers (SCDH s.IV).
    """

    def __init__(self, bits: int, activation: str | None = None, kernel_initializer=None, **kwargs):
        super().__init__(**kwargs)
        if activation not in (None, "tanh", "linear"):
            raise ValueError(f"activation must be None or 'tanh', got {activation!r}")
        self.bits = check_bits(bits)
        self.activation = activation
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer or keras.initializers.RandomNormal(stddev=0.01)
        )
        self.dense = keras.layers.Dense(
            self.bits,
            activation=activation,
            kernel_initializer=self.kernel_initializer,
            name="dense",
        )

    def build(self, input_shape):
        self.dense.build(input_shape)

    def call(self, inputs):
        return self.dense(inputs)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.bits)

    def get_config(self):
        return {
            **super().get_config(),
            "bits": self.bits,
            "activation": self.activation,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }
