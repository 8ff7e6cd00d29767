"""Centre-norm warm-up of SCDH (Sec. IV-D): the centres are held at norm s for the first epochs."""

from __future__ import annotations

import keras
from keras import ops

__all__ = ["ClusterNormWarmup"]


class ClusterNormWarmup(keras.callbacks.Callback):
    """After every training batch of the first ``epochs`` epochs, rescale each centre of
    ``clusters`` to Euclidean norm ``norm`` (SCDH: s = 8 for 5 epochs on ImageNet)."""

    def __init__(self, clusters, norm: float = 8.0, epochs: int = 5):
        super().__init__()
        if norm <= 0 or epochs < 0:
            raise ValueError("norm must be positive and epochs non-negative")
        self.clusters, self.norm, self.epochs = clusters, float(norm), int(epochs)
        self._epoch = 0

    def hold(self) -> None:
        centres = self.clusters.centres
        lengths = ops.sqrt(ops.maximum(ops.sum(ops.square(centres), axis=-1, keepdims=True), 1e-12))
        centres.assign(centres * (self.norm / lengths))

    def on_train_begin(self, logs=None):
        if self.epochs > 0:
            self.hold()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self._epoch < self.epochs:
            self.hold()
