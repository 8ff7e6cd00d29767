"""Keras ``Loss`` wrappers over the per-example loss functions, registered under package "tfhash".

One wrapper per loss term, so a paper's total is a weighted sum of wrappers over the model's outputs, e.g. SCDH (Eq. 18) =
``SemanticClusterUnaryLoss(lam)`` on ``-D`` + mu ``ClassifierCrossEntropy()`` on the logits + alpha ``QuantizationLoss()``
on the codes. ``call`` returns the ``(n,)`` per-example values and Keras's reduction applies ``sample_weight`` (by default
``"sum_over_batch_size"``: sum_i w_i L_i / n, as :func:`tfhash.losses.reduce_per_example`). Labels (``y_true``) are read
by :func:`labels_of`; the wrappers normalised over the whole batch leave rows of sample weight zero out of the batch's
counts, as the models do (:mod:`tfhash.losses.reduction`).
"""

from __future__ import annotations

import keras

from tfhash.labels import LabelError, multi_hot
from tfhash.losses.mean_teacher import softmax_squared_distance
from tfhash.losses.pairwise import (
    check_cosine_scale,
    pairwise_likelihood_per_example,
    pairwise_similarity,
)
from tfhash.losses.proxy import (
    balanced_binary_cross_entropy_per_example,
    check_pair_scope,
    hamming_triplet_per_example,
    hyp2_pair_per_example,
    hyp2_proxy_per_example,
)
from tfhash.losses.quantization import quantization_per_example
from tfhash.losses.reduction import rows_taking_part, taking_part_mask
from tfhash.losses.scdh import alignment_per_example
from tfhash.losses.semantic_cluster import (
    classifier_cross_entropy_per_example,
    semantic_cluster_unary_per_example,
)

__all__ = ["SemanticClusterUnaryLoss", "QuantizationLoss", "ClassifierCrossEntropy", "SoftmaxSquaredDistance", "CodeAlignmentLoss", "BalancedBinaryCrossEntropy", "HammingTripletLoss", "HyP2ProxyLoss", "HyP2PairLoss", "PairwiseLikelihoodLoss"]


def labels_of(y_true, num_classes: int | None):
    """``y_true`` (class ids or multi-hot) as ``(n, C)`` multi-hot, checked in the graph.

    Labels are class ids ``(n,)`` or one-hot / multi-hot ``(n, C)``, normalised by
    :func:`tfhash.labels.multi_hot` in the graph: a wrong width or an id out of range is an error,
    not a silent broadcast. The wrappers on the codes (triplet, HyP2 pairs, pairwise likelihood)
    need ``num_classes`` for class ids; on class scores C is the scores' width.
    """
    return multi_hot(y_true, num_classes, name="y_true")


def split_label_coefficients(y_true, num_classes: int):
    """Split ``y_true`` into (labels, q, u): class ids ``(n,)`` or ``(n, C)`` labels give
    (labels, None, None), ``(n, 3C)`` the three blocks. Any other width is an error."""
    if y_true.shape.rank == 2 and y_true.shape[-1] == 3 * num_classes:
        labels = labels_of(y_true[:, :num_classes], num_classes)
        return labels, y_true[:, num_classes : 2 * num_classes], y_true[:, 2 * num_classes :]
    if y_true.shape.rank == 2 and y_true.shape[-1] not in (1, num_classes):
        raise LabelError(f"y_true has {y_true.shape[-1]} columns but the model has {num_classes} classes: pass class ids "
                         f"of shape (n,), one-hot / multi-hot of shape (n, {num_classes}), or labels+q+u of shape "
                         f"(n, {3 * num_classes})")  # fmt: skip
    return labels_of(y_true, num_classes), None, None


class _ConfiguredLoss(keras.losses.Loss):
    """A loss whose constructor arguments are the attributes named in ``params``."""

    params: tuple[str, ...] = ()

    def get_config(self):
        return {**super().get_config(), **{name: getattr(self, name) for name in self.params}}


class _BatchLoss(_ConfiguredLoss):
    """A loss normalised over the batch: ``call`` receives ``y_true`` as ``{"y": ..., "part": ...}``,
    ``part`` the 0/1 rows that take part (weight not zero), and returns each row's share."""

    def __call__(self, y_true, y_pred, sample_weight=None):
        taking_part = rows_taking_part(sample_weight)
        part = taking_part_mask(keras.ops.shape(y_pred)[0], taking_part)
        return super().__call__({"y": y_true, "part": part}, y_pred, sample_weight)

    def unpack(self, y_true, num_classes: int | None = None):
        """(multi-hot labels, rows taking part or None): ``call`` also accepts plain targets."""
        if isinstance(y_true, dict):
            return labels_of(y_true["y"], num_classes), y_true["part"] > 0
        return labels_of(y_true, num_classes), None


@keras.saving.register_keras_serializable(package="tfhash")
class SemanticClusterUnaryLoss(_ConfiguredLoss):
    """SCUL on the ``-D`` output of :class:`tfhash.layers.SemanticClusters` (SCDH Eq. 10/16).

    ``y_true`` may be the labels or the concatenation ``[labels, q, u]`` of shape ``(n, 3C)``
    carrying JCCH coefficients.
    """

    params = ("lam",)

    def __init__(self, lam: float = 0.005, name: str = "semantic_cluster_unary_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.lam = float(lam)

    def call(self, y_true, y_pred):
        labels, q, u = split_label_coefficients(y_true, y_pred.shape[-1])
        return semantic_cluster_unary_per_example(labels, y_pred, self.lam, q, u)


@keras.saving.register_keras_serializable(package="tfhash")
class QuantizationLoss(_ConfiguredLoss):
    """Hoelder quantization loss on continuous codes (SCDH Sec. IV-C; ``y_true`` is ignored)."""

    params = ("p",)

    def __init__(self, p: float = 3.0, name: str = "quantization_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.p = float(p)

    def call(self, y_true, y_pred):
        del y_true
        return quantization_per_example(y_pred, self.p)


@keras.saving.register_keras_serializable(package="tfhash")
class ClassifierCrossEntropy(_ConfiguredLoss):
    """Multi-label-aware softmax cross-entropy of the classifier head (SCDH Eq. 18, l_1)."""

    def __init__(self, name: str = "classifier_cross_entropy", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        return classifier_cross_entropy_per_example(labels_of(y_true, y_pred.shape[-1]), y_pred)


@keras.saving.register_keras_serializable(package="tfhash")
class SoftmaxSquaredDistance(_ConfiguredLoss):
    """MT-SCDH's consistency term d(u, v) = ||softmax(u) - softmax(v)||^2 (SCDH Eq. 21):
    ``y_pred`` the student's logits (or -D), ``y_true`` the teacher's (held constant)."""

    def __init__(self, name: str = "softmax_squared_distance", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        return softmax_squared_distance(y_pred, y_true)


@keras.saving.register_keras_serializable(package="tfhash")
class CodeAlignmentLoss(_ConfiguredLoss):
    """JCCH's pairing term 1 - cos(F1_i, F2_i) (JCCH Eq. 17, beta): ``y_pred`` one tower's codes,
    ``y_true`` the other's."""

    def __init__(self, name: str = "code_alignment", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        return alignment_per_example(y_pred, y_true)


@keras.saving.register_keras_serializable(package="tfhash")
class BalancedBinaryCrossEntropy(_ConfiguredLoss):
    """HCLM's multi-label class-balanced BCE on the proxy logits, c_k = 1 - frequency of tag k."""

    params = ("tag_frequencies",)

    def __init__(self, tag_frequencies, name: str = "balanced_binary_cross_entropy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.tag_frequencies = [float(f) for f in tag_frequencies]

    def call(self, y_true, y_pred):
        return balanced_binary_cross_entropy_per_example(labels_of(y_true, len(self.tag_frequencies)), y_pred,
                                                         self.tag_frequencies)  # fmt: skip


@keras.saving.register_keras_serializable(package="tfhash")
class HammingTripletLoss(_BatchLoss):
    """HCLM's Hamming triplet loss (Eq. 22-24, batch-all mining) on the tanh codes."""

    params = ("margin", "num_classes")

    def __init__(self, margin: float, num_classes: int | None = None, name: str = "hamming_triplet_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.margin = float(margin)
        self.num_classes = num_classes

    def call(self, y_true, y_pred):
        labels, taking_part = self.unpack(y_true, self.num_classes)
        return hamming_triplet_per_example(labels, y_pred, self.margin, taking_part)


@keras.saving.register_keras_serializable(package="tfhash")
class HyP2ProxyLoss(_BatchLoss):
    """HyP2's proxy term (Eq. 2-3) on the cosines of the codes to the proxies
    (what :class:`tfhash.layers.LearnableProxies` returns)."""

    params = ("zeta",)

    def __init__(self, zeta: float, name: str = "hyp2_proxy_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.zeta = float(zeta)

    def call(self, y_true, y_pred):
        labels, taking_part = self.unpack(y_true, y_pred.shape[-1])
        return hyp2_proxy_per_example(labels, y_pred, self.zeta, taking_part)


@keras.saving.register_keras_serializable(package="tfhash")
class HyP2PairLoss(_BatchLoss):
    """HyP2's irrelevant-pair term (Eq. 4-6) on the codes.

    HyP2's total is ``HyP2ProxyLoss(zeta)`` on the cosines + beta ``HyP2PairLoss(zeta)`` on the codes.
    """

    params = ("zeta", "pair_scope", "num_classes")

    def __init__(self, zeta: float, pair_scope: str = "multi-label", num_classes: int | None = None,
                 name: str = "hyp2_pair_loss", **kwargs):  # fmt: skip
        super().__init__(name=name, **kwargs)
        self.zeta = float(zeta)
        self.pair_scope = check_pair_scope(pair_scope)
        self.num_classes = num_classes

    def call(self, y_true, y_pred):
        labels, taking_part = self.unpack(y_true, self.num_classes)
        return hyp2_pair_per_example(labels, y_pred, self.zeta, self.pair_scope, taking_part)


@keras.saving.register_keras_serializable(package="tfhash")
class PairwiseLikelihoodLoss(_BatchLoss):
    """DPSH's pairwise likelihood (Eq. 3, 5) over the pairs *within the batch* (labels as
    ``y_true``, codes as ``y_pred``). :class:`tfhash.models.PairwiseHashModel` pairs every example
    with a memory of the whole training set instead. With ``cosine_scale`` the likelihood takes
    that times the codes' cosine (:func:`tfhash.losses.pairwise_likelihood_per_example`), the term
    :class:`tfhash.models.HyP2Model` adds with ``pairwise_weight``."""

    params = ("eta", "num_classes", "cosine_scale")

    def __init__(self, eta: float = 0.01, num_classes: int | None = None, cosine_scale: float | None = None,
                 name: str = "pairwise_likelihood_loss", **kwargs):  # fmt: skip
        super().__init__(name=name, **kwargs)
        self.eta = float(eta)
        self.num_classes = num_classes
        self.cosine_scale = check_cosine_scale(cosine_scale, allow_none=True)

    def call(self, y_true, y_pred):
        labels, taking_part = self.unpack(y_true, self.num_classes)
        values = pairwise_likelihood_per_example(y_pred, y_pred, pairwise_similarity(labels, labels), self.eta, taking_part,
                                                 self.cosine_scale)  # fmt: skip
        return values * taking_part_mask(keras.ops.shape(y_pred)[0], taking_part)

