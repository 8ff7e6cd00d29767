"""Fine-tuning recipes: how a tfhash model with a (pretrained) backbone is optimised.

The papers fine-tune an ImageNet network end to end with two learning rates, one for the
pretrained layers and ten times more for the new ones (SCDH Sec. V-A: 0.001 before fc7, 0.01
after, SGD with momentum 0.9, the rate cut by 80% at fixed epochs; HyP2 Sec. 4.1: SGD, momentum
0.9, weight decay 5e-4). :class:`FineTuning` states such a recipe, :func:`compile_fine_tuning`
compiles a model with it, and :data:`FINE_TUNING_DEFAULTS` holds tfhash's default per backbone.

The two rates live in one optimizer of :mod:`tfhash.optimizers`. This module imports no
TensorFlow (Keras is imported when an optimizer or schedule is made), so a pipeline config's
fine-tuning settings are checked before anything heavy loads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

SCHEDULES = ("constant", "step", "cosine")
OPTIMIZERS = ("sgd", "adam", "adamw")


def learning_rate_schedule(base: float, schedule: str, epochs: int, steps_per_epoch: int, decay_epochs=(),
                           decay_rate: float = 0.2):  # fmt: skip
    """The learning rate over optimizer steps: ``"constant"``; ``"step"``, multiplied by
    ``decay_rate`` at each epoch of ``decay_epochs`` (SCDH: 0.2, "decreases by 80%"); ``"cosine"``,
    from ``base`` to 0 over ``epochs`` (SGDR without restarts)."""
    import keras

    if schedule == "constant":
        return float(base)
    if schedule == "step":
        # PiecewiseConstantDecay switches after a boundary step: the decayed rate starts with the
        # first step of epoch e (0-based step e * steps_per_epoch).
        boundaries = [int(e) * int(steps_per_epoch) - 1 for e in sorted(decay_epochs)]
        if not boundaries:
            return float(base)
        values = [float(base) * float(decay_rate) ** i for i in range(len(boundaries) + 1)]
        return keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, values)
    if schedule == "cosine":
        return keras.optimizers.schedules.CosineDecay(float(base), max(1, int(epochs) * int(steps_per_epoch)))
    raise ValueError(f"unknown learning-rate schedule {schedule!r}; choose one of {SCHEDULES}")


@dataclass
class FineTuning:
    """A training recipe.

    Attributes:
        optimizer: ``"sgd"`` (momentum), ``"adam"`` or ``"adamw"``.
        learning_rate: the new layers' rate (hash head, centres, proxies, classifier).
        backbone_learning_rate: the pretrained layers' rate; None = ``learning_rate``.
        momentum: SGD momentum.
        weight_decay: coupled L2 on every variable (sgd, adam); AdamW's decoupled decay (adamw).
        schedule, decay_epochs, decay_rate: see :func:`learning_rate_schedule`.
        frozen_epochs: epochs at the start during which the backbone does not move.
        freeze_batch_norm: keep the backbone's batch-norm statistics (see
            :func:`tfhash.models.backbones.image_backbone`).
        augment: augmentation of the training images: False, True (random shift and flip) or a
            policy of :data:`tfhash.networks.AUGMENTATIONS`.
        dropout: dropout rate on the backbone's feature vector in training (the papers' AlexNet
            feeds the hash layer through fc7's dropout of 0.5; SqueezeNet drops 0.5 before its
            classifier); for an MLP backbone, the dropout after each hidden layer.
        input_dropout: MLP backbones: dropout on the input features, one rate or
            ``{modality: rate}`` (0 for a modality not named).
    """

    optimizer: str = "adam"
    learning_rate: float = 1e-3
    backbone_learning_rate: float | None = None
    momentum: float = 0.9
    weight_decay: float = 0.0
    schedule: str = "constant"
    decay_epochs: list[int] = field(default_factory=list)
    decay_rate: float = 0.2
    frozen_epochs: int = 0
    freeze_batch_norm: bool = True
    augment: bool | str = False
    dropout: float = 0.0
    input_dropout: float | dict = 0.0

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {OPTIMIZERS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown learning-rate schedule {self.schedule!r}; choose one of {SCHEDULES}")
        rates = [self.learning_rate] + ([self.backbone_learning_rate] if self.backbone_learning_rate is not None else [])
        if not all(isinstance(r, (int, float)) and math.isfinite(r) and r >= 0 for r in rates) or self.learning_rate <= 0:
            raise ValueError(f"learning rates must be finite, learning_rate > 0 and backbone_learning_rate >= 0; got {rates}")
        if self.weight_decay < 0 or self.frozen_epochs < 0 or not 0 <= self.momentum < 1:
            raise ValueError("weight_decay and frozen_epochs must be >= 0 and momentum in [0, 1)")
        inputs = self.input_dropout.values() if isinstance(self.input_dropout, dict) else [self.input_dropout]
        if not all(isinstance(r, (int, float)) and 0 <= r < 1 for r in [self.dropout, *inputs]):
            raise ValueError(f"dropout and input_dropout must be in [0, 1); got {self.dropout}, {self.input_dropout}")
        from tfhash.networks import augmentation_policy

        augmentation_policy(self.augment)

    @classmethod
    def for_backbone(cls, backbone: str, **overrides) -> FineTuning:
        """:data:`FINE_TUNING_DEFAULTS` of ``backbone`` (the from-scratch recipe for a name without
        defaults) updated by ``overrides``.

        Raises:
            ValueError: an unknown setting.
        """
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown fine-tuning settings {sorted(unknown)}; known: {sorted(f.name for f in fields(cls))}")
        from tfhash.networks import IMAGE_NETWORKS, is_encoder_path

        if backbone in FINE_TUNING_DEFAULTS:
            base = FINE_TUNING_DEFAULTS[backbone]
        elif backbone in IMAGE_NETWORKS or is_encoder_path(backbone):
            base = FINE_TUNING_DEFAULTS["pretrained"]
        else:
            base = {}
        return cls(**{**base, **overrides})

    def to_dict(self) -> dict:
        return asdict(self)

    def backbone_options(self) -> dict:
        """The settings of this recipe that :func:`tfhash.models.image_backbone` takes, as its
        keyword arguments (augmentation, batch-norm freeze, feature dropout)."""
        return {"augment": self.augment, "freeze_batch_norm": self.freeze_batch_norm, "dropout": self.dropout}

    def mlp_options(self, modality: str | None = None) -> dict:
        """The settings of this recipe that :func:`tfhash.models.mlp` takes for ``modality``'s tower."""
        rate = self.input_dropout.get(modality, 0.0) if isinstance(self.input_dropout, dict) else self.input_dropout
        return {"dropout": self.dropout, "input_dropout": float(rate)}

    def scaled_to_batch(self, factor: float) -> FineTuning:
        """This recipe for a batch ``factor`` times larger: learning rates scaled linearly (the
        linear scaling rule of Goyal et al., 2017), the rest unchanged."""
        if factor == 1:
            return self
        backbone = None if self.backbone_learning_rate is None else self.backbone_learning_rate * factor
        return replace(self, learning_rate=self.learning_rate * factor, backbone_learning_rate=backbone)

    def make_optimizer(self, epochs: int, steps_per_epoch: int):
        """The optimizer of this recipe (backbone variables still to be registered)."""
        from tfhash.optimizers import BackboneRateAdam, BackboneRateAdamW, BackboneRateSGD

        rate = learning_rate_schedule(self.learning_rate, self.schedule, epochs, steps_per_epoch, self.decay_epochs, self.decay_rate)
        scale = 1.0 if self.backbone_learning_rate is None else self.backbone_learning_rate / self.learning_rate
        common = {"backbone_scale": scale, "frozen_steps": self.frozen_epochs * int(steps_per_epoch), "l2": self.weight_decay}
        if self.optimizer == "sgd":
            return BackboneRateSGD(learning_rate=rate, momentum=self.momentum, **common)
        if self.optimizer == "adamw":
            return BackboneRateAdamW(learning_rate=rate, weight_decay=self.weight_decay, **{**common, "l2": 0.0})
        return BackboneRateAdam(learning_rate=rate, **common)


#: Default recipes. Pretrained networks: the SCDH recipe (SGD momentum 0.9, backbone 0.001, new
#: layers 0.01) with HyP2's weight decay, step decay by 80% and augmentation; the decay epochs are
#: set from the run's epochs by :func:`compile_fine_tuning` when not given. From scratch (small_cnn,
#: mlp): Adam 1e-3, constant, no augmentation (tfhash's recipe before fine-tuning existed); the MLP
#: keeps :func:`tfhash.models.mlp`'s dropout of 0.2.
FINE_TUNING_DEFAULTS: dict[str, dict] = {
    "pretrained": {"optimizer": "sgd", "learning_rate": 0.01, "backbone_learning_rate": 0.001, "momentum": 0.9,
                   "weight_decay": 5e-4, "schedule": "step", "decay_rate": 0.2, "augment": True},
    "small_cnn": {},
    "mlp": {"dropout": 0.2},
}  # fmt: skip


def backbone_variables(model) -> list:
    """The pretrained variables of a tfhash model: those of the backbone that training updates for
    each of its modalities (``model.modality_backbone``: every tower of a cross-modal model, the
    student's of MT-SCDH, whose teacher is not trained)."""
    return [v for modality in model.modalities for v in model.modality_backbone(modality).trainable_variables]


def compile_fine_tuning(model, recipe: FineTuning, epochs: int, steps_per_epoch: int, **compile_kwargs):
    """Compile ``model`` with ``recipe``; its backbone variables take the backbone rate (the same
    rate when ``backbone_learning_rate`` is None, as for a backbone trained from scratch). A step
    schedule without ``decay_epochs`` decays at 5/8 and 7/8 of ``epochs`` (SCDH's 100 and 140 of
    160). Returns the optimizer."""
    if recipe.schedule == "step" and not recipe.decay_epochs:
        recipe = replace(recipe, decay_epochs=sorted({max(1, round(epochs * 5 / 8)), max(1, round(epochs * 7 / 8))}))
    optimizer = recipe.make_optimizer(epochs, steps_per_epoch)
    model.compile(optimizer=optimizer, **compile_kwargs)
    optimizer.set_backbone_variables(backbone_variables(model))
    return optimizer
