"""Model builders: SCDH, SCDH-S, MT-SCDH and JCCH, each with ``encode(x) -> +-1 codes``.

Paper hyper-parameters are named presets (:data:`SCDH_PRESETS`); every value is overridable.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np

from tfhash.models.backbones import mlp, small_cnn
from tfhash.models.jcch import JCCHModel
from tfhash.models.presets import SCDH_PRESETS, resolve_preset
from tfhash.models.scdh import MeanTeacherSCDH, SCDHModel

_WARMUP_KEYS = ("warmup_norm", "warmup_epochs")


def build_scdh(backbone: keras.Model, num_classes: int, bits: int, preset: str | None = "cifar10",
               ablation: bool = False, **overrides) -> SCDHModel:  # fmt: skip
    """SCDH (or, with ``ablation=True``, SCDH-S: lambda = 0 and softmax on dot products).

    Warm-up settings of a preset (``warmup_norm``, ``warmup_epochs``) are not model parameters:
    pass them to :class:`tfhash.callbacks.ClusterNormWarmup` (see :func:`scdh_callbacks`).
    """
    params = {k: v for k, v in resolve_preset(preset, overrides).items() if k not in _WARMUP_KEYS}
    if ablation:
        params.update(lam=0.0, similarity="dot")
    return SCDHModel(backbone, num_classes, bits, **params)


def scdh_callbacks(model: SCDHModel, preset: str | None = "cifar10", **overrides) -> list:
    """The callbacks a preset implies (the ImageNet preset's centre-norm warm-up)."""
    from tfhash.callbacks import ClusterNormWarmup

    params = resolve_preset(preset, overrides)
    if params.get("warmup_epochs"):
        return [ClusterNormWarmup(model.clusters, norm=params["warmup_norm"], epochs=params["warmup_epochs"])]
    return []


def build_mt_scdh(backbone_fn: Callable[[], keras.Model], num_classes: int, bits: int, sample_input: np.ndarray,
                  preset: str | None = "cifar10", consistency: float = 50.0, rampup_steps: int = 1000,
                  ema_decay: float = 0.99, noise_stddev: float = 0.0, **overrides) -> MeanTeacherSCDH:  # fmt: skip
    """MT-SCDH: two identical SCDH models (``backbone_fn`` is called twice), the teacher starting
    from the student's weights. ``sample_input`` (a small batch) builds both."""
    student = build_scdh(backbone_fn(), num_classes, bits, preset, **overrides)
    teacher = build_scdh(backbone_fn(), num_classes, bits, preset, **overrides)
    student(sample_input)
    teacher(sample_input)
    teacher.set_weights(student.get_weights())
    return MeanTeacherSCDH(student, teacher, consistency, rampup_steps, ema_decay, noise_stddev)


def build_jcch(backbones: dict, num_classes: int, bits: int, preset: str | None = "cifar10",
               beta: float = 0.1, **overrides) -> JCCHModel:  # fmt: skip
    """JCCH with two towers sharing the semantic cluster centres."""
    params = {k: v for k, v in resolve_preset(preset, overrides).items() if k not in _WARMUP_KEYS}
    return JCCHModel(backbones, num_classes, bits, beta=beta, **params)


__all__ = [
    "SCDH_PRESETS",
    "JCCHModel",
    "MeanTeacherSCDH",
    "SCDHModel",
    "build_jcch",
    "build_mt_scdh",
    "build_scdh",
    "mlp",
    "scdh_callbacks",
    "small_cnn",
]
