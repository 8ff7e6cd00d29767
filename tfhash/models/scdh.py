"""SCDH and MT-SCDH models (SCDH Eq. 18 and 21)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tfhash.layers import HashHead, SemanticClusters
from tfhash.losses.mean_teacher import mean_teacher_consistency_per_example
from tfhash.losses.reduction import batch_shares, reduce_parts, rows_taking_part, taking_part_mask
from tfhash.losses.scdh import scdh_per_example, scdh_total
from tfhash.models.base import (
    EncoderMixin,
    NestedConfigMixin,
    loss_trackers,
    reduce_tracked_loss,
    unpack_sample_weight,
)
from tfhash.models.training import TrainingMixin

__all__ = ["SCDHModel", "MeanTeacherSCDH"]


@keras.saving.register_keras_serializable(package="tfhash")
class SCDHModel(TrainingMixin, NestedConfigMixin, EncoderMixin, keras.Model):
    """backbone -> HashHead (F, K units) -> SemanticClusters (-D), plus a classifier head ("fc8")
    on the backbone features; trained with SCUL + mu * l_1 + alpha * l_q.

    ``call`` returns ``{"codes": F, "neg_distances": -D, "logits": a}``. Targets for ``fit`` are
    ``(n, C)`` labels or ``{"labels", "q", "u"}`` with JCCH coefficients. Every term is per
    example, so ``sample_weight`` weights each example's loss (Keras's ``"sum_over_batch_size"``).

    Args:
        backbone: Keras model mapping inputs to a feature vector.
        num_classes, bits: C and K.
        lam, mu, alpha: SCDH weights (see :mod:`tfhash.models.presets`).
        similarity: ``"euclidean"`` (SCDH) or ``"dot"`` (with ``lam=0``: the SCDH-S ablation).
        p: Hoelder exponent of the quantization loss.
    """

    objective_name = "SCDH Eq. 18: SCUL + mu l_1 + alpha l_q"

    def __init__(self, backbone, num_classes: int, bits: int, lam: float = 0.005, mu: float = 0.2,
                 alpha: float = 0.05, similarity: str = "euclidean", p: float = 3.0, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.backbone = backbone
        self.num_classes, self.bits = int(num_classes), int(bits)
        self.lam, self.mu, self.alpha, self.p = float(lam), float(mu), float(alpha), float(p)
        self.similarity = similarity
        self.hash_head = HashHead(self.bits, name="hash_head")
        self.clusters = SemanticClusters(self.num_classes, self.bits, similarity=similarity, name="clusters")
        self.classifier = keras.layers.Dense(
            self.num_classes, kernel_initializer=keras.initializers.RandomNormal(stddev=0.01), name="classifier"
        )
        self._trackers = loss_trackers(self, ("scul", "classifier", "quantization"))

    def call(self, inputs, training=False):
        features = self.backbone(inputs, training=training)
        codes = self.hash_head(features)
        return {"codes": codes, "neg_distances": self.clusters(codes), "logits": self.classifier(features)}

    def supervised_per_example(self, labels, y_pred, q=None, u=None) -> dict:
        """:func:`tfhash.losses.scdh_per_example` of this model's outputs: ``(n,)`` values."""
        return scdh_per_example(labels, y_pred["neg_distances"], y_pred["logits"], y_pred["codes"],
                                self.lam, self.mu, self.alpha, q, u, self.p)  # fmt: skip

    def supervised_loss(self, labels, y_pred, q=None, u=None, sample_weight=None) -> dict:
        """The batch's SCDH loss and its parts: :meth:`supervised_per_example` reduced."""
        return reduce_parts(self.supervised_per_example(labels, y_pred, q, u), sample_weight, self.objective)

    def objective(self, parts: dict):
        """Eq. 18 from the (reduced) loss terms, :func:`tfhash.losses.scdh_total`."""
        return scdh_total(parts, self.mu, self.alpha)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        labels, q, u = self.unpack_targets(y)
        return reduce_tracked_loss(self, self.supervised_per_example(labels, y_pred, q, u), sample_weight, self.objective)

    nested_keys = ("backbone",)

    def config_params(self) -> dict:
        return {"num_classes": self.num_classes, "bits": self.bits, "lam": self.lam, "mu": self.mu,
                "alpha": self.alpha, "similarity": self.similarity, "p": self.p}  # fmt: skip


@keras.saving.register_keras_serializable(package="tfhash")
class MeanTeacherSCDH(TrainingMixin, NestedConfigMixin, EncoderMixin, keras.Model):
    """MT-SCDH (SCDH Eq. 21): a student SCDH model trained on labelled and unlabelled data and a
    teacher whose weights are the exponential moving average of the student's.

    Unlabelled examples are rows whose labels are all zero (or class id -1). Per batch the loss is the SCDH loss of
    the labelled rows, alpha * l_q of the unlabelled rows' codes, and w(t) times the consistency
    mu d(a, a^T) + d(-D, -D^T) over all rows, the student and the teacher each seeing the input
    with its own Gaussian noise. w(t) = consistency * exp(-5 (1 - t)^2) ramps up over
    ``rampup_steps`` optimizer steps (Mean Teacher's sigmoid ramp-up); the EMA update follows
    each optimizer step. ``encode`` uses the teacher (Mean Teacher's evaluation model).

    ``sample_weight`` weights each row's whole loss: a labelled row's SCDH loss, an unlabelled
    row's alpha * l_q, and every row's consistency. The SCDH loss is a mean over the labelled rows
    and alpha * l_q one over the unlabelled rows, so a row's value is its share of those means
    (:func:`tfhash.losses.batch_shares`); a row of weight zero leaves the batch (it does not count
    among the labelled or unlabelled rows).

    Args:
        student, teacher: two :class:`SCDHModel` of identical architecture.
        consistency: w at the end of the ramp-up (50 as in Mean Teacher).
        rampup_steps: ramp-up length in optimizer steps.
        ema_decay: teacher EMA decay.
        noise_stddev: standard deviation of the input noise, in input units.
    """

    accepts_unlabelled = True
    objective_name = "SCDH Eq. 21: SCDH on the labelled rows, alpha l_q on the unlabelled ones, w(t) x consistency"

    def __init__(self, student: SCDHModel, teacher: SCDHModel, consistency: float = 50.0,
                 rampup_steps: int = 1000, ema_decay: float = 0.99, noise_stddev: float = 0.0, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.student, self.teacher = student, teacher
        self.teacher.trainable = False
        self.consistency = float(consistency)
        self.rampup_steps = int(rampup_steps)
        self.ema_decay = float(ema_decay)
        self.noise_stddev = float(noise_stddev)
        if not (np.isfinite(self.consistency) and self.consistency >= 0 and np.isfinite(self.noise_stddev)
                and self.noise_stddev >= 0 and self.rampup_steps >= 0 and 0.0 <= self.ema_decay <= 1.0):  # fmt: skip
            raise ValueError(f"MT-SCDH needs consistency >= 0, noise_stddev >= 0, rampup_steps >= 0 and ema_decay in "
                             f"[0, 1]; got {consistency!r}, {noise_stddev!r}, {rampup_steps!r}, {ema_decay!r}")  # fmt: skip
        self._trackers = loss_trackers(self, ("scul", "classifier", "quantization", "consistency"))

    def _perturb(self, x, training):
        if not training or self.noise_stddev <= 0:
            return x
        x = tf.cast(x, tf.float32)
        return x + tf.random.normal(tf.shape(x), stddev=self.noise_stddev)

    def call(self, inputs, training=False):
        if not training:
            return self.teacher(inputs, training=False)
        return self.student(self._perturb(inputs, training), training=True)

    @property
    def modalities(self) -> tuple[str, ...]:
        return self.teacher.modalities

    @property
    def num_classes(self) -> int:
        return self.student.num_classes

    @property
    def bits(self) -> int:
        return self.student.bits

    def modality_backbone(self, modality: str | None = None) -> keras.Model:
        """The student's backbone (the teacher follows it by EMA, not by training)."""
        return self.student.modality_backbone(modality)

    def build_encoder(self, modality: str) -> keras.Model:
        """The teacher's encoder (Mean Teacher's evaluation model)."""
        return self.teacher.encoder(modality)

    def consistency_weight(self):
        if self.rampup_steps <= 0:
            return tf.constant(self.consistency)
        t = tf.clip_by_value(tf.cast(self.optimizer.iterations, tf.float32) / self.rampup_steps, 0.0, 1.0)
        return self.consistency * tf.exp(-5.0 * tf.square(1.0 - t))

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        labels, q, u = self.unpack_targets(y)
        sample_weight = unpack_sample_weight(sample_weight)
        taking_part = rows_taking_part(sample_weight)
        part = taking_part_mask(tf.shape(y_pred["codes"])[0], taking_part)
        labelled = tf.cast(tf.reduce_sum(tf.cast(labels, tf.float32), axis=-1) > 0, tf.float32) * part
        unlabelled = part - labelled
        supervised = self.student.supervised_per_example(labels, y_pred, q, u)
        per_example = {name: batch_shares(labelled * supervised[name], tf.reduce_sum(labelled), taking_part)
                       for name in ("scul", "classifier", "quantization", "loss")}  # fmt: skip
        unlabelled_quantization = batch_shares(unlabelled * supervised["quantization"], tf.reduce_sum(unlabelled), taking_part)
        teacher_out = self.teacher(self._perturb(x, training), training=False)
        per_example["consistency"] = mean_teacher_consistency_per_example(
            y_pred["logits"], teacher_out["logits"], y_pred["neg_distances"], teacher_out["neg_distances"], self.student.mu
        )
        per_example["loss"] = (per_example["loss"] + self.student.alpha * unlabelled_quantization
                               + self.consistency_weight() * per_example["consistency"])  # fmt: skip
        return reduce_tracked_loss(self, per_example, sample_weight)

    def train_step(self, data):
        logs = super().train_step(data)
        for teacher_w, student_w in zip(self.teacher.weights, self.student.weights, strict=True):
            teacher_w.assign(self.ema_decay * teacher_w + (1.0 - self.ema_decay) * student_w)
        return logs

    nested_keys = ("student", "teacher")

    def config_params(self) -> dict:
        return {"consistency": self.consistency, "rampup_steps": self.rampup_steps, "ema_decay": self.ema_decay,
                "noise_stddev": self.noise_stddev}  # fmt: skip
