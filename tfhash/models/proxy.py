"""HCLM / sHCLM (+ Hamming triplet) and HyP2 models."""

from __future__ import annotations

import keras
import numpy as np

from tfhash.layers import FixedProxies, HashHead, LearnableProxies
from tfhash.losses.pairwise import (
    check_cosine_scale,
    check_pairwise_weight,
    in_batch_pairwise_per_example,
)
from tfhash.losses.proxy import (
    balanced_binary_cross_entropy_per_example,
    check_pair_scope,
    hamming_triplet_per_example,
    hyp2_per_example,
    hyp2_zeta,
)
from tfhash.losses.reduction import rows_taking_part
from tfhash.losses.semantic_cluster import classifier_cross_entropy_per_example
from tfhash.models.base import (
    EncoderMixin,
    NestedConfigMixin,
    loss_trackers,
    reduce_tracked_loss,
    unpack_sample_weight,
)
from tfhash.models.training import TrainingMixin

__all__ = ["HCLMModel", "HyP2Model"]


@keras.saving.register_keras_serializable(package="tfhash")
class HCLMModel(TrainingMixin, NestedConfigMixin, EncoderMixin, keras.Model):
    """backbone -> HashHead(tanh) = nu(x) -> FixedProxies (logits nu.w_c).

    Loss: softmax cross-entropy (single-label) or the class-balanced BCE (multi-label, with
    ``tag_frequencies``), plus ``triplet_weight`` times the Hamming triplet loss (HCLM Eq. 22-24),
    plus ``pairwise_weight`` times our in-batch pairwise likelihood
    (:func:`tfhash.losses.pairwise.in_batch_pairwise_per_example`).
    ``call`` returns ``{"codes": nu, "logits": ...}``. ``sample_weight`` weights each example's
    loss; the triplet term is a mean over the batch's triplets, each anchor's share weighted, and
    rows of weight zero are in no triplet (nor in a pair).

    Args:
        backbone: Keras feature extractor.
        proxies: ``(C, K)`` proxies: +-1 HCLM / sHCLM proxies, or real-valued ones (ablation).
        learn_proxies: train the proxies too (the ablation's "learned proxies").
        tag_frequencies: ``(C,)`` training-set tag frequencies; given = multi-label balanced BCE.
        triplet_weight: lambda of the joint objective (0 = no triplet term; the paper uses 1).
        margin: triplet margin m in Hamming units (default K / 8; our choice, the paper leaves it open).
        pairwise_weight, pairwise_scale: ours, not the paper's: the weight of the pairwise
            likelihood over every in-batch pair on ``pairwise_scale`` x the codes' cosine (as
            :class:`HyP2Model`'s). 0 (default): HCLM as published.
    """

    objective_name = "HCLM Eq. 22-24: cross-entropy over the proxies + lambda x Hamming triplet (+ pairwise_weight x pairwise likelihood)"

    def __init__(self, backbone, proxies, tag_frequencies=None, triplet_weight: float = 0.0, margin: float | None = None,
                 learn_proxies: bool = False, pairwise_weight: float = 0.0, pairwise_scale: float = 2.0, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.backbone = backbone
        proxies = np.asarray(proxies)
        self.num_classes, self.bits = proxies.shape
        self.proxy_layer = FixedProxies(proxies, learn=learn_proxies, name="proxies")
        self.hash_head = HashHead(self.bits, activation="tanh", name="hash_head")
        self.tag_frequencies = None if tag_frequencies is None else [float(f) for f in np.asarray(tag_frequencies)]
        if self.tag_frequencies is not None and len(self.tag_frequencies) != self.num_classes:
            raise ValueError("tag_frequencies needs one value per class")
        self.triplet_weight = float(triplet_weight)
        self.margin = float(self.bits / 8.0 if margin is None else margin)
        self.pairwise_weight = check_pairwise_weight(pairwise_weight, "HCLM")
        self.pairwise_scale = check_cosine_scale(pairwise_scale, "pairwise_scale")
        self._trackers = loss_trackers(self, ("proxy_loss", "triplet"))

    def call(self, inputs, training=False):
        codes = self.hash_head(self.backbone(inputs, training=training))
        return {"codes": codes, "logits": self.proxy_layer(codes)}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        labels, _, _ = self.unpack_targets(y)
        sample_weight = unpack_sample_weight(sample_weight)
        if self.tag_frequencies is None:
            proxy_loss = classifier_cross_entropy_per_example(labels, y_pred["logits"])
        else:
            proxy_loss = balanced_binary_cross_entropy_per_example(labels, y_pred["logits"], self.tag_frequencies)
        taking_part = rows_taking_part(sample_weight)
        if self.triplet_weight:
            triplet = hamming_triplet_per_example(labels, y_pred["codes"], self.margin, taking_part)
        else:
            triplet = 0.0 * proxy_loss
        loss = proxy_loss + self.triplet_weight * triplet
        if self.pairwise_weight:
            loss += self.pairwise_weight * in_batch_pairwise_per_example(y_pred["codes"], labels, self.pairwise_scale, taking_part)
        per_example = {"loss": loss, "proxy_loss": proxy_loss, "triplet": triplet}
        return reduce_tracked_loss(self, per_example, sample_weight)

    nested_keys = ("backbone",)

    def config_params(self) -> dict:
        return {"proxies": self.proxy_layer.get_config()["proxies"], "tag_frequencies": self.tag_frequencies,
                "triplet_weight": self.triplet_weight, "margin": self.margin, "learn_proxies": self.proxy_layer.learn,
                "pairwise_weight": self.pairwise_weight, "pairwise_scale": self.pairwise_scale}  # fmt: skip


@keras.saving.register_keras_serializable(package="tfhash")
class HyP2Model(TrainingMixin, NestedConfigMixin, EncoderMixin, keras.Model):
    """backbone -> HashHead (linear F) with learnable proxies, trained with the HyP2 loss.
    ``call`` returns ``{"codes": F, "cosines": cos(F, p)}``. HyP2's terms are normalised over the
    batch; with ``sample_weight`` each example's share is weighted and rows of weight zero take no
    part (:func:`tfhash.losses.hyp2_per_example`).

    Args:
        zeta: margin; default :func:`tfhash.losses.hyp2_zeta` of (C, K).
        beta: weight of the irrelevant-pair term (official default 0.5).
        pair_scope: which examples form irrelevant pairs (:func:`tfhash.losses.hyp2_loss`).
        pairwise_weight, pairwise_scale: ours, not the paper's: the weight of a pairwise likelihood
            over every in-batch pair, relevant (sharing a label) or not, on ``pairwise_scale`` x
            the codes' cosine (:func:`tfhash.losses.pairwise.in_batch_pairwise_per_example`).
            HyP2's terms pull codes to their proxies and push apart pairs that share nothing;
            this term also orders the pairs between, which mAP over the whole database counts.
            0 (default): HyP2 as published.
    """

    class_scores = "cosines"
    objective_name = "HyP2 Eq. 2-6: proxy loss + beta x irrelevant-pair loss (+ pairwise_weight x pairwise likelihood)"

    def __init__(self, backbone, num_classes: int, bits: int, zeta: float | None = None, beta: float = 0.5,
                 pair_scope: str = "multi-label", pairwise_weight: float = 0.0, pairwise_scale: float = 2.0, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.backbone = backbone
        self.num_classes, self.bits = int(num_classes), int(bits)
        self.zeta = float(hyp2_zeta(self.num_classes, self.bits) if zeta is None else zeta)
        self.beta = float(beta)
        self.pair_scope = check_pair_scope(pair_scope)
        self.pairwise_weight = check_pairwise_weight(pairwise_weight, "HyP2")
        self.pairwise_scale = check_cosine_scale(pairwise_scale, "pairwise_scale")
        self.hash_head = HashHead(self.bits, name="hash_head")
        self.proxy_layer = LearnableProxies(self.num_classes, self.bits, name="proxies")
        self._trackers = loss_trackers(self, ())

    def call(self, inputs, training=False):
        codes = self.hash_head(self.backbone(inputs, training=training))
        return {"codes": codes, "cosines": self.proxy_layer(codes)}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        labels, _, _ = self.unpack_targets(y)
        sample_weight = unpack_sample_weight(sample_weight)
        taking_part = rows_taking_part(sample_weight)
        loss = hyp2_per_example(labels, y_pred["codes"], self.proxy_layer.proxies, self.zeta, self.beta, self.pair_scope,
                                taking_part)  # fmt: skip
        if self.pairwise_weight:
            loss += self.pairwise_weight * in_batch_pairwise_per_example(y_pred["codes"], labels, self.pairwise_scale, taking_part)
        return reduce_tracked_loss(self, {"loss": loss}, sample_weight)

    nested_keys = ("backbone",)

    def config_params(self) -> dict:
        return {"num_classes": self.num_classes, "bits": self.bits, "zeta": self.zeta, "beta": self.beta,
                "pair_scope": self.pair_scope, "pairwise_weight": self.pairwise_weight, "pairwise_scale": self.pairwise_scale}  # fmt: skip
