"""The DPSH-style pairwise baseline model (see :mod:`tfhash.losses.pairwise`)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tfhash.layers import HashHead
from tfhash.losses.pairwise import pairwise_likelihood_per_example, pairwise_similarity
from tfhash.losses.reduction import rows_taking_part
from tfhash.models.base import (
    EncoderMixin,
    NestedConfigMixin,
    loss_trackers,
    reduce_tracked_loss,
    unpack_sample_weight,
)
from tfhash.models.training import TrainingMixin

__all__ = ["PairwiseHashModel"]


@keras.saving.register_keras_serializable(package="tfhash")
class PairwiseHashModel(TrainingMixin, NestedConfigMixin, EncoderMixin, keras.Model):
    """backbone -> HashHead (linear u) trained with DPSH's pairwise likelihood against a memory of
    the latest codes and labels of all ``num_train`` training examples (DPSH Algorithm 1: the
    batch's rows of the memory are overwritten with the batch's codes, then the batch is paired
    with every row). One epoch therefore costs O(n^2 K).

    Targets for ``fit`` are ``{"labels": (n, C), "index": (n,)}``: ``index`` is each example's row
    in the training set, in ``[0, num_train)``. Rows not yet visited have zero code and no label,
    so they add no gradient. The loss is per example (its pairs with the whole memory), so
    ``sample_weight`` weights each example's loss; an example of weight zero does not write its
    code and labels into the memory either.

    Args:
        num_classes, bits: C and K.
        num_train: size of the training set (rows of the memory).
        eta: weight of DPSH's quantization term in the mean-normalised loss (our default 0.01: of
            0.1 / 0.01 / 0.001, the value that trained best in one MNIST run of the evidence report).
    """

    class_scores = None
    objective_name = "DPSH Eq. 5: pairwise likelihood against the training-set memory + eta x quantization"

    def __init__(self, backbone, num_classes: int, bits: int, num_train: int, eta: float = 0.01, **kwargs):
        super().__init__(**kwargs)
        if int(num_train) <= 0:
            raise ValueError(f"num_train must be positive, got {num_train}")
        self.backbone = backbone
        self.num_classes, self.bits, self.num_train = int(num_classes), int(bits), int(num_train)
        self.eta = float(eta)
        self.hash_head = HashHead(self.bits, name="hash_head")
        self.code_memory = self.add_weight(shape=(self.num_train, self.bits), initializer="zeros",
                                           trainable=False, name="code_memory")  # fmt: skip
        self.label_memory = self.add_weight(shape=(self.num_train, self.num_classes), initializer="zeros",
                                            trainable=False, name="label_memory")  # fmt: skip
        self._trackers = loss_trackers(self, ())

    def normalised_targets(self, y, name: str = "y"):
        if not isinstance(y, dict) or "index" not in y or "labels" not in y:
            raise ValueError("PairwiseHashModel needs targets {'labels': ..., 'index': ...} (each row's index in the training set)")
        return super().normalised_targets(y, name)

    def check_targets(self, y: dict, name: str) -> None:
        """In-memory ``index`` targets must be rows of the training set (an out-of-range row would
        be dropped silently by a compiled scatter)."""
        super().check_targets(y, name)
        if not tf.is_tensor(y["index"]):
            rows = np.asarray(y["index"])
            if rows.size and (not np.issubdtype(rows.dtype, np.integer) or rows.min() < 0 or rows.max() >= self.num_train):
                raise ValueError(f"every {name}['index'] target must be an integer row in [0, {self.num_train})")

    def call(self, inputs, training=False):
        return {"codes": self.hash_head(self.backbone(inputs, training=training))}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        labels = self.unpack_targets(y)[0]
        sample_weight = unpack_sample_weight(sample_weight)
        rows = tf.reshape(tf.cast(y["index"], tf.int32), (-1, 1))
        codes = y_pred["codes"]
        self._remember(self.code_memory, rows, tf.stop_gradient(codes), sample_weight)
        self._remember(self.label_memory, rows, labels, sample_weight)
        similarity = pairwise_similarity(labels, self.label_memory.value)
        per_example = pairwise_likelihood_per_example(codes, self.code_memory.value, similarity, self.eta)
        return reduce_tracked_loss(self, {"loss": per_example}, sample_weight)

    @staticmethod
    def _remember(memory, rows, values, sample_weight) -> None:
        """Overwrite the memory's ``rows`` with ``values``, except rows of sample weight zero."""
        values = tf.cast(values, memory.dtype)
        taking_part = rows_taking_part(sample_weight)
        if taking_part is not None:
            values = tf.where(taking_part[:, None], values, tf.gather_nd(memory.value, rows))
        memory.assign(tf.tensor_scatter_nd_update(memory.value, rows, values))

    nested_keys = ("backbone",)

    def config_params(self) -> dict:
        return {"num_classes": self.num_classes, "bits": self.bits, "num_train": self.num_train, "eta": self.eta}
