"""HCLM / sHCLM (+ Hamming triplet) and HyP2 models."""

from __future__ import annotations

import keras
import numpy as np

from tfhash.layers import FixedProxies, HashHead, LearnableProxies
from tfhash.losses.proxy import balanced_binary_cross_entropy, hamming_triplet_loss, hyp2_loss
from tfhash.losses.semantic_cluster import classifier_cross_entropy
from tfhash.models.base import EncoderMixin, NestedConfigMixin, loss_trackers, unpack_targets


@keras.saving.register_keras_serializable(package="tfhash")
class HCLMModel(NestedConfigMixin, EncoderMixin, keras.Model):
    """backbone -> HashHead(tanh) = nu(x) -> FixedProxies (logits nu.w_c).

    Loss: softmax cross-entropy (single-label) or the class-balanced BCE (multi-label, with
    ``tag_frequencies``), plus ``triplet_weight`` times the Hamming triplet loss (HCLM Eq. 22-24).
    ``call`` returns ``{"codes": nu, "logits": ...}``.

    Args:
        backbone: Keras feature extractor.
        proxies: ``(C, K)`` proxies: +-1 HCLM / sHCLM proxies, or real-valued ones (ablation).
        learn_proxies: train the proxies too (the ablation's "learned proxies").
        tag_frequencies: ``(C,)`` training-set tag frequencies; given = multi-label balanced BCE.
        triplet_weight: lambda of the joint objective (0 = no triplet term; the paper uses 1).
        margin: triplet margin m in Hamming units (default K / 8; our choice, the paper leaves it open).
    """

    def __init__(self, backbone, proxies, tag_frequencies=None, triplet_weight: float = 0.0, margin: float | None = None,
                 learn_proxies: bool = False, **kwargs):  # fmt: skip
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
        self._trackers = loss_trackers(self, ("proxy_loss", "triplet"))

    def call(self, inputs, training=False):
        codes = self.hash_head(self.backbone(inputs, training=training))
        return {"codes": codes, "logits": self.proxy_layer(codes)}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        labels, _, _ = unpack_targets(y)
        if self.tag_frequencies is None:
            proxy_loss = classifier_cross_entropy(labels, y_pred["logits"])
        else:
            proxy_loss = balanced_binary_cross_entropy(labels, y_pred["logits"], self.tag_frequencies)
        triplet = hamming_triplet_loss(labels, y_pred["codes"], self.margin) if self.triplet_weight else 0.0 * proxy_loss
        self._trackers["proxy_loss"].update_state(proxy_loss)
        self._trackers["triplet"].update_state(triplet)
        return proxy_loss + self.triplet_weight * triplet

    nested_keys = ("backbone",)

    def config_params(self) -> dict:
        return {"proxies": self.proxy_layer.get_config()["proxies"], "tag_frequencies": self.tag_frequencies,
                "triplet_weight": self.triplet_weight, "margin": self.margin,
                "learn_proxies": self.proxy_layer.learn}  # fmt: skip


@keras.saving.register_keras_serializable(package="tfhash")
class HyP2Model(NestedConfigMixin, EncoderMixin, keras.Model):
    """backbone -> HashHead (linear F) with learnable proxies, trained with the HyP2 loss.
    ``call`` returns ``{"codes": F, "cosines": cos(F, p)}``.

    Args:
        zeta: margin; default :func:`tfhash.losses.hyp2_zeta` of (C, K).
        beta: weight of the irrelevant-pair term (official default 0.5).
        pair_scope: which examples form irrelevant pairs (:func:`tfhash.losses.hyp2_loss`).
    """

    def __init__(self, backbone, num_classes: int, bits: int, zeta: float | None = None, beta: float = 0.5,
                 pair_scope: str = "multi-label", **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        from tfhash.losses.proxy import hyp2_zeta

        self.backbone = backbone
        self.num_classes, self.bits = int(num_classes), int(bits)
        self.zeta = float(hyp2_zeta(self.num_classes, self.bits) if zeta is None else zeta)
        self.beta = float(beta)
        from tfhash.losses.proxy import PAIR_SCOPES

        if pair_scope not in PAIR_SCOPES:
            raise ValueError(f"unknown pair_scope {pair_scope!r}; choose one of {PAIR_SCOPES}")
        self.pair_scope = pair_scope
        self.hash_head = HashHead(self.bits, name="hash_head")
        self.proxy_layer = LearnableProxies(self.num_classes, self.bits, name="proxies")
        self._trackers = loss_trackers(self, ())

    def call(self, inputs, training=False):
        codes = self.hash_head(self.backbone(inputs, training=training))
        return {"codes": codes, "cosines": self.proxy_layer(codes)}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        labels, _, _ = unpack_targets(y)
        return hyp2_loss(labels, y_pred["codes"], self.proxy_layer.proxies, self.zeta, self.beta, self.pair_scope)

    nested_keys = ("backbone",)

    def config_params(self) -> dict:
        return {"num_classes": self.num_classes, "bits": self.bits, "zeta": self.zeta, "beta": self.beta,
                "pair_scope": self.pair_scope}  # fmt: skip
