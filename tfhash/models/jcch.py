"""JCCH cross-modal model: two towers, shared semantic cluster centres (JCCH Eq. 16-17)."""

from __future__ import annotations

import keras
import numpy as np

from tfhash.layers import HashHead, SemanticClusters
from tfhash.losses.scdh import cross_modal_per_example, cross_modal_total
from tfhash.models.base import (
    EncoderMixin,
    NestedConfigMixin,
    loss_trackers,
    reduce_tracked_loss,
)
from tfhash.models.training import TrainingMixin

__all__ = ["JCCHModel"]


@keras.saving.register_keras_serializable(package="tfhash")
class JCCHModel(TrainingMixin, NestedConfigMixin, EncoderMixin, keras.Model):
    """Two towers (one backbone + HashHead + classifier per modality) whose codes are scored
    against one shared :class:`SemanticClusters` layer.

    Inputs are a dict ``{modality_a: x_a, modality_b: x_b}`` of paired examples; ``call`` returns
    ``{modality: {"codes", "neg_distances", "logits"}}``. Targets: labels or
    ``{"labels", "q", "u"}`` (JCCH coefficients; JCCH-B without them). Every term is per pair,
    so ``sample_weight`` weights each pair's loss (both towers and the alignment). ``modalities``
    are the two input names, sorted; ``encoder(modality)`` is that tower (backbone + hash head).

    Args:
        backbones: ``{modality: keras model}`` for exactly two modalities.
        num_classes, bits: C and K.
        lam, mu, alpha: SCDH weights, per tower; beta: weight of 1 - cos(F1, F2) (0 if unpaired).
        centres: ``None`` (the paper: centres learned from N(0, 0.5^2)), or a fixed ``(C, K)``
            array the centres are held at (ours; :func:`tfhash.models.build_jcch` makes them from
            hash-consistent proxies).
    """

    objective_name = "JCCH Eq. 17: each tower's SCDH loss + beta x code alignment"

    def __init__(self, backbones: dict, num_classes: int, bits: int, lam: float = 0.005, mu: float = 0.2,
                 alpha: float = 0.05, beta: float = 0.1, p: float = 3.0, centres=None, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        if len(backbones) != 2:
            raise ValueError("JCCHModel needs exactly two modalities")
        self.modalities = tuple(sorted(backbones))
        self.backbones = {m: backbones[m] for m in self.modalities}
        self.num_classes, self.bits = int(num_classes), int(bits)
        self.lam, self.mu, self.alpha, self.beta, self.p = float(lam), float(mu), float(alpha), float(beta), float(p)
        self.hash_heads = {m: HashHead(self.bits, name=f"hash_head_{m}") for m in self.modalities}
        self.classifiers = {
            m: keras.layers.Dense(self.num_classes, kernel_initializer=keras.initializers.RandomNormal(stddev=0.01),
                                  name=f"classifier_{m}")  # fmt: skip
            for m in self.modalities
        }
        self.centres = None if centres is None else np.asarray(centres, dtype="float32")
        if self.centres is not None and (self.centres.shape != (self.num_classes, self.bits) or not np.isfinite(self.centres).all()):
            raise ValueError(f"centres must be a finite ({self.num_classes}, {self.bits}) array; got shape {self.centres.shape}")
        fixed = None if self.centres is None else keras.initializers.Constant(self.centres.tolist())
        self.clusters = SemanticClusters(self.num_classes, self.bits, centre_initializer=fixed, trainable=fixed is None,
                                         name="clusters")  # fmt: skip
        self._trackers = loss_trackers(self, ("scul", "classifier", "quantization", "alignment"))

    def tower(self, modality: str, x, training=False) -> dict:
        features = self.modality_backbone(modality)(x, training=training)
        codes = self.hash_heads[modality](features)
        return {"codes": codes, "neg_distances": self.clusters(codes), "logits": self.classifiers[modality](features)}

    def call(self, inputs, training=False):
        missing = [m for m in self.modalities if m not in inputs]
        if missing:
            raise ValueError(f"inputs lack modalities {missing}")
        return {m: self.tower(m, inputs[m], training) for m in self.modalities}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        labels, q, u = self.unpack_targets(y)
        per_example = cross_modal_per_example(labels, [y_pred[m] for m in self.modalities], self.lam, self.mu, self.alpha,
                                              self.beta, q, u, self.p)  # fmt: skip
        return reduce_tracked_loss(self, per_example, sample_weight,
                                   lambda reduced: cross_modal_total(reduced, self.mu, self.alpha, self.beta))  # fmt: skip

    @property
    def towers(self) -> tuple[str, ...]:
        return self.modalities

    def tower_outputs(self, y_pred) -> dict:
        return {m: y_pred[m] for m in self.modalities}

    def modality_backbone(self, modality: str | None = None) -> keras.Model:
        return self.backbones[self.check_modality(modality)]

    def modality_head(self, modality: str | None = None):
        return self.hash_heads[self.check_modality(modality)]

    nested_keys = ("backbones",)

    def config_params(self) -> dict:
        return {"num_classes": self.num_classes, "bits": self.bits, "lam": self.lam, "mu": self.mu,
                "alpha": self.alpha, "beta": self.beta, "p": self.p,
                "centres": None if self.centres is None else self.centres.tolist()}  # fmt: skip
