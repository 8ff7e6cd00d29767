"""Model builders: SCDH, SCDH-S, MT-SCDH, JCCH, HCLM / sHCLM (+ triplet), HyP2 and two baselines
(DPSH-style pairwise, CNNBH-style softmax classifier), each with ``encode(x) -> +-1 codes``.

Paper hyper-parameters are named presets (:data:`SCDH_PRESETS`); every value is overridable.

Importing this package registers every class a saved tfhash model may hold with Keras (models,
layers, losses, metrics, optimizers, augmentation), so ``keras.saving.load_model("m.keras")``
needs only ``import tfhash.models`` first. Every builder refuses a code length that packed codes
cannot store (:func:`tfhash.codes.check_bits`) before any work.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np

import tfhash.losses  # noqa: F401  (registers the loss wrappers)
import tfhash.metrics.keras_metrics  # noqa: F401  (registers the compile metrics)
import tfhash.optimizers  # noqa: F401  (registers the optimizers a compiled model saves)
from tfhash.codes import check_bits
from tfhash.models.backbones import (
    image_backbone,
    mlp,
    small_cnn,
    squeezenet,
)
from tfhash.models.inputs import InputError, NonFiniteWeightsError
from tfhash.models.jcch import JCCHModel
from tfhash.models.pairwise import PairwiseHashModel
from tfhash.models.presets import SCDH_PRESETS, resolve_preset
from tfhash.models.proxy import HCLMModel, HyP2Model
from tfhash.models.scdh import MeanTeacherSCDH, SCDHModel
from tfhash.networks import AUGMENTATIONS, IMAGE_NETWORKS, BackboneError

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
               beta: float = 0.1, fixed_centres: float | None = None, seed: int = 0, **overrides) -> JCCHModel:  # fmt: skip
    """JCCH with two towers sharing the semantic cluster centres.

    ``fixed_centres`` (ours): instead of learning the centres, hold them at this scale times the
    hash-consistent proxies of :func:`tfhash.proxies.hclm_proxies` (``seed``), so every centre
    coordinate has the same magnitude and a code near its centre has the centre's signs. On Wiki
    it lifts image->text mAP (docs/evidence.md, Cross-modal: Wiki); None learns them (the paper).
    """
    check_bits(bits)
    params = {k: v for k, v in resolve_preset(preset, overrides).items() if k not in _WARMUP_KEYS}
    centres = None
    if fixed_centres is not None:
        from tfhash.proxies import hclm_proxies

        if not (np.isfinite(fixed_centres) and fixed_centres > 0):
            raise ValueError(f"fixed_centres must be a positive scale; got {fixed_centres}")
        centres = float(fixed_centres) * hclm_proxies(num_classes, bits, seed=seed).astype("float32")
    return JCCHModel(backbones, num_classes, bits, beta=beta, centres=centres, **params)


def build_hclm(backbone: keras.Model, num_classes: int, bits: int, similarity: np.ndarray | None = None,
               seed: int = 0, tag_frequencies=None, triplet_weight: float = 0.0, margin: float | None = None,
               proxies: np.ndarray | None = None, pairwise_weight: float = 0.0, pairwise_scale: float = 2.0) -> HCLMModel:  # fmt: skip
    """HCLM (fixed proxies from :func:`tfhash.proxies.hclm_proxies`), sHCLM when a class
    ``similarity`` is given, + the Hamming triplet term when ``triplet_weight > 0``, + our in-batch
    pairwise likelihood when ``pairwise_weight > 0`` (:class:`HCLMModel`); multi-label balanced
    BCE when ``tag_frequencies`` is given. ``proxies`` overrides the construction (the ablation's
    random / learned-free alternatives)."""
    from tfhash.proxies import hclm_proxies

    check_bits(bits)
    if proxies is None:
        proxies = hclm_proxies(num_classes, bits, similarity=similarity, seed=seed)
    return HCLMModel(backbone, proxies, tag_frequencies=tag_frequencies, triplet_weight=triplet_weight, margin=margin,
                     pairwise_weight=pairwise_weight, pairwise_scale=pairwise_scale)  # fmt: skip


def build_hyp2(backbone: keras.Model, num_classes: int, bits: int, zeta: float | None = None, beta: float = 0.5,
               pair_scope: str = "multi-label", pairwise_weight: float = 0.0, pairwise_scale: float = 2.0) -> HyP2Model:  # fmt: skip
    """HyP2 with learnable proxies; zeta defaults to the code-table margin of (C, K); a
    ``pairwise_weight`` > 0 adds our in-batch pairwise likelihood (:class:`HyP2Model`)."""
    return HyP2Model(backbone, num_classes, bits, zeta=zeta, beta=beta, pair_scope=pair_scope,
                     pairwise_weight=pairwise_weight, pairwise_scale=pairwise_scale)  # fmt: skip


def build_pairwise(backbone: keras.Model, num_classes: int, bits: int, num_train: int, eta: float = 0.01) -> PairwiseHashModel:
    """Baseline: DPSH's pairwise likelihood over all training pairs (:class:`PairwiseHashModel`)."""
    return PairwiseHashModel(backbone, num_classes, bits, num_train, eta=eta)


def build_softmax_codes(backbone: keras.Model, num_classes: int, bits: int, seed: int = 0) -> HCLMModel:
    """Baseline in the style of CNNBH (Guo and Li, 2017): a K-unit hash layer between the backbone
    and a learned softmax classifier, trained with cross-entropy only; codes = sign of the hash layer.

    Our choices: the hash layer is tanh (CNNBH thresholds a sigmoid at 0.5, the same code up to an
    affine map) and the classifier has no bias; its weights start N(0, 1/K). This is
    :class:`HCLMModel` with learnable, randomly initialised proxies.
    """
    rng = np.random.default_rng(seed)
    weights = rng.normal(scale=1.0 / np.sqrt(bits), size=(num_classes, bits)).astype("float32")
    return HCLMModel(backbone, weights, learn_proxies=True)


__all__ = [
    "AUGMENTATIONS",
    "IMAGE_NETWORKS",
    "BackboneError",
    "InputError",
    "NonFiniteWeightsError",
    "image_backbone",
    "squeezenet",
    "HCLMModel",
    "HyP2Model",
    "PairwiseHashModel",
    "build_pairwise",
    "build_softmax_codes",
    "build_hclm",
    "build_hyp2",
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
