"""Fine-tuning recipes: how a tfhash model with a (pretrained) backbone is optimised.

:class:`FineTuning` states a recipe and trains with it (:meth:`FineTuning.fit`), and
:data:`FINE_TUNING_DEFAULTS` holds tfhash's default per backbone. The pretrained layers and the new
ones get two learning rates, which live in one optimizer of :mod:`tfhash.optimizers`
(:func:`tfhash.optimizers.compile_fine_tuning` compiles a model with a recipe's); training on a
cached frozen trunk is :func:`tfhash.trunk_cache.fit_on_cache`. This module imports no TensorFlow
(Keras is imported when an optimizer or schedule is made), so a pipeline config's fine-tuning
settings are checked before anything heavy loads.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field, fields, replace

from tfhash.config_keys import check_keys
from tfhash.schedules import SCHEDULES
from tfhash.towers import checked_input_dropout, dropout_rate

__all__ = ["FineTuning", "TrunkCacheSettings", "FINE_TUNING_DEFAULTS", "DEFAULT_CUTS"]

#: The cut of :class:`TrunkCacheSettings` per network tfhash knows: SqueezeNet v1.1's last pooling, below
#: fire6-fire9 (a third of the network's training cost at 224x224 and most of its parameters);
#: EfficientNet-Lite's first stage at stride 16 (its output: ``block7`` in Lite0, ``block10`` in
#: Lite1/2, 80 or 88 channels), below the second stride-16 stage and the stride-32 stages, which
#: train (validation on CIFAR-10 preferred it to the cut one stage higher: benchmarks/results/trunk_cache.md).
DEFAULT_CUTS = {"squeezenet": "pool5", "efficientnet_lite0": "block7", "efficientnet_lite1": "block10",
                "efficientnet_lite2": "block10"}  # fmt: skip
OPTIMIZERS = ("sgd", "adam", "adamw", "auto")


@dataclass(frozen=True)
class TrunkCacheSettings:
    """Train on a cache of the frozen lower layers (:mod:`tfhash.trunk_cache`).

    Attributes:
        cut: the layer whose output is cached; the layers up to it do not train (default: the
            network's entry of :data:`DEFAULT_CUTS`; required for other backbones).
        views: augmented views of each training image stored (view 0 as is, view 1 mirrored, the
            rest drawn by the recipe's ``augment`` policy); each epoch draws one view per image.
        directory: where caches are kept, one entry per key, a local folder (the Trainer's default:
            ``trunk_cache`` in the run directory, or for a run on remote storage the cache folder
            of the machine that trains, :func:`tfhash.storage.cache_dir`).
        mixup: mixup of the cached activations (Zhang et al., 2018) with a ``Beta(mixup, mixup)``
            weight per row, the partner a row of the same batch; 0 (default) is off. The mixed
            row's targets are the union of both label sets with the SCUL weights ``q`` / ``u``
            mixed by the same weight, so it needs a method taking label coefficients (SCDH).
    """

    cut: str | None = None
    views: int = 8
    directory: str | None = None
    mixup: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.views, bool) or not isinstance(self.views, int) or not 1 <= self.views <= 256:
            raise ValueError(f"trunk_cache.views must be an integer from 1 to 256, got {self.views!r}")
        if self.cut is not None and (not isinstance(self.cut, str) or not self.cut):
            raise ValueError(f"trunk_cache.cut must be a layer name, got {self.cut!r}")
        if isinstance(self.mixup, bool) or not isinstance(self.mixup, (int, float)) or not 0 <= self.mixup < math.inf:
            raise ValueError(f"trunk_cache.mixup must be a finite number >= 0 (0 is off), got {self.mixup!r}")

    @classmethod
    def of(cls, value, backbone: str | None) -> TrunkCacheSettings | None:
        """The setting ``trunk_cache`` of a recipe: None / False (off), True (defaults) or a dict of
        fields; the cut defaults to ``backbone``'s :data:`DEFAULT_CUTS`.

        Raises:
            ValueError: unknown fields, no cut for a backbone without a default, or a cut that
                ``backbone`` is known not to have (:func:`tfhash.networks.check_cut`).
        """
        if value is None or value is False:
            return None
        if isinstance(value, TrunkCacheSettings):
            settings = value
        elif value is True or isinstance(value, dict):
            settings = value if value is not True else {}
            check_keys(settings, [f.name for f in fields(cls)], "training.fine_tuning.trunk_cache.")
            settings = cls(**settings)
        else:
            raise ValueError(f"trunk_cache must be false, true or an object of settings, got {value!r}")
        if settings.cut is None and backbone is not None:
            if backbone not in DEFAULT_CUTS:
                raise ValueError(f"trunk_cache needs a cut for backbone {backbone!r}: name the layer whose output is "
                                 "cached, e.g. {\"cut\": \"conv4_block6_out\"} for resnet50")
            settings = replace(settings, cut=DEFAULT_CUTS[backbone])
        if backbone is not None:
            from tfhash.networks import check_cut

            check_cut(backbone, settings.cut)
        return settings


@dataclass(frozen=True)
class FineTuning:
    """A training recipe.

    The papers fine-tune an ImageNet network end to end with two learning rates, one for the
    pretrained layers and ten times more for the new ones (SCDH Sec. V-A: 0.001 before fc7, 0.01
    after, SGD with momentum 0.9, the rate cut by 80% at fixed epochs; HyP2 Sec. 4.1: SGD,
    momentum 0.9, weight decay 5e-4); a recipe states such settings.

    Attributes:
        optimizer: ``"sgd"`` (momentum), ``"adam"``, ``"adamw"`` or ``"auto"`` (AdamW when
            ``weight_decay`` > 0, else Adam: what the recipes train with).
        learning_rate: the new layers' rate (hash head, centres, proxies, classifier).
        backbone_learning_rate: the pretrained layers' rate; None = ``learning_rate``.
        momentum: SGD momentum.
        weight_decay: coupled L2 on every variable (sgd, adam); AdamW's decoupled decay (adamw).
        schedule, decay_epochs, decay_rate: see :func:`tfhash.schedules.learning_rate_schedule`.
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
        trunk_cache: train the layers above a cut on cached activations of the frozen layers
            below it (:class:`TrunkCacheSettings`; a dict of its fields, True for its defaults).
        weight_averaging: weight averaging (Polyak and Juditsky, 1992): the optimizer keeps an
            exponential moving average of the trained weights with this decay per step, and the
            trained model ends with the average (Keras's optimizer EMA); 0 (default) is off,
            0.99-0.999 usual (the average spans about ``1 / (1 - decay)`` steps).
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
    trunk_cache: TrunkCacheSettings | dict | bool | None = None
    weight_averaging: float = 0.0

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {OPTIMIZERS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown learning-rate schedule {self.schedule!r}; choose one of {SCHEDULES}")
        rates = [self.learning_rate] + ([self.backbone_learning_rate] if self.backbone_learning_rate is not None else [])
        if not all(isinstance(r, (int, float)) and math.isfinite(r) and r >= 0 for r in rates) or self.learning_rate <= 0:
            raise ValueError(f"learning rates must be finite, learning_rate > 0 and backbone_learning_rate >= 0; got {rates}")
        for name, within, wanted in (("weight_decay", lambda v: v >= 0, ">= 0 (0: no decay)"),
                                     ("momentum", lambda v: 0 <= v < 1, "in [0, 1)"),
                                     ("decay_rate", lambda v: 0 < v <= 1, "in (0, 1], the factor applied at each decay epoch")):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not within(value):
                raise ValueError(f"{name} must be a finite number {wanted}; got {value!r}")
        if isinstance(self.frozen_epochs, bool) or not isinstance(self.frozen_epochs, numbers.Integral) or self.frozen_epochs < 0:
            raise ValueError(f"frozen_epochs must be a whole number of epochs >= 0; got {self.frozen_epochs!r}")
        if not isinstance(self.decay_epochs, (list, tuple)) or not all(
                isinstance(e, numbers.Integral) and not isinstance(e, bool) and e >= 1 for e in self.decay_epochs):  # fmt: skip
            raise ValueError(f"decay_epochs must be a list of epochs >= 1 (e.g. [100, 140]); got {self.decay_epochs!r}")
        if not isinstance(self.freeze_batch_norm, bool):
            raise ValueError(f"freeze_batch_norm must be true or false; got {self.freeze_batch_norm!r}")
        object.__setattr__(self, "dropout", dropout_rate(self.dropout, "dropout"))
        object.__setattr__(self, "input_dropout", checked_input_dropout(self.input_dropout))
        if isinstance(self.weight_averaging, bool) or not isinstance(self.weight_averaging, (int, float)) \
                or not 0 <= self.weight_averaging < 1:  # fmt: skip
            raise ValueError(f"weight_averaging is the decay of the weights' moving average, from 0 (off) to below 1, "
                             f"e.g. 0.999; got {self.weight_averaging!r}")  # fmt: skip
        from tfhash.networks import augmentation_policy

        augmentation_policy(self.augment)
        object.__setattr__(self, "trunk_cache", TrunkCacheSettings.of(self.trunk_cache, None))

    @classmethod
    def for_backbone(cls, backbone: str, **overrides) -> FineTuning:
        """:data:`FINE_TUNING_DEFAULTS` of ``backbone`` (the from-scratch recipe for a name without
        defaults) updated by ``overrides``.

        Raises:
            ValueError: an unknown setting.
        """
        check_keys(overrides, [f.name for f in fields(cls)], "training.fine_tuning.")
        from tfhash.networks import IMAGE_NETWORKS, is_encoder_path

        if backbone in FINE_TUNING_DEFAULTS:
            base = FINE_TUNING_DEFAULTS[backbone]
        elif backbone in IMAGE_NETWORKS or is_encoder_path(backbone):
            base = FINE_TUNING_DEFAULTS["pretrained"]
        else:
            base = {}
        recipe = cls(**{**base, **overrides})
        return replace(recipe, trunk_cache=TrunkCacheSettings.of(recipe.trunk_cache, backbone))

    def to_dict(self) -> dict:
        return asdict(self)

    def backbone_options(self) -> dict:
        """The settings of this recipe that :func:`tfhash.models.image_backbone` takes, as its
        keyword arguments (augmentation, batch-norm freeze, feature dropout)."""
        return {"augment": self.augment, "freeze_batch_norm": self.freeze_batch_norm, "dropout": self.dropout}

    def fit(self, build, images, labels, backbone: str, epochs: int, batch_size: int = 32, seed: int = 0, size: int | None = None,
            weights: str | None = "imagenet", precision: str = "off", callbacks=(), verbose: int = 0, data_root=None):  # fmt: skip
        """Train the tfhash model that ``build`` makes around the image network ``backbone`` on
        ``images`` (uint8 pixels ``(n, H, W[, 3])``) and ``labels`` with these settings; returns the
        trained float32 model on raw images. With :attr:`trunk_cache` set, only the layers above its
        cut train, on cached activations of the frozen layers below it (:mod:`tfhash.trunk_cache`,
        the cache kept in its ``directory`` for the next run, by default this machine's cache
        folder, :func:`tfhash.storage.cache_dir`); otherwise the network trains end to end.

        Args:
            build: a backbone -> a tfhash model, e.g. ``lambda net: build_scdh(net, 10, 48)``.
            backbone: a name of :data:`tfhash.models.IMAGE_NETWORKS` (or an encoder's path), built
                by :func:`tfhash.registry.image_network` (:func:`tfhash.models.image_backbone`) at ``size`` with ``weights`` and these
                settings' :meth:`backbone_options`.
            precision: the mixed precision of the cached training (:func:`tfhash.precision.precision_policy`:
                ``"off"``, ``"on"``, ``"auto"`` or ``"bfloat16"``); end-to-end training is float32.
            callbacks, verbose: as for ``keras.Model.fit``.
            data_root: where the network's local ImageNet weights are looked for (``weights="imagenet"``).

        Raises:
            tfhash.trunk_cache.CacheError: a cut the network does not have, a method with several
                backbones; tfhash.models.BackboneError: an unknown network or unusable weights.
        """
        import keras
        import numpy as np

        from tfhash.optimizers import compile_fine_tuning
        from tfhash.precision import precision_policy
        from tfhash.registry import image_network
        from tfhash.trunk_cache import fit_on_cache

        def make_backbone():
            return image_network(backbone, np.shape(images)[1:], self, size=size, weights=weights, data_root=data_root)

        if self.trunk_cache is not None:
            recipe = self
            if self.trunk_cache.directory is None:  # this machine's cache folder, as the Trainer's for a remote run
                from tfhash.storage import cache_dir

                recipe = replace(self, trunk_cache=replace(self.trunk_cache, directory=cache_dir("trunk_cache")))
            model, _, _ = fit_on_cache(recipe, build, make_backbone, images, labels, epochs=epochs, batch_size=batch_size, seed=seed,
                                       backbone_name=backbone, policy=precision_policy(precision, gpu=False), callbacks=callbacks,
                                       verbose=verbose)  # fmt: skip
            return model
        keras.utils.set_random_seed(seed)
        model = build(make_backbone())
        compile_fine_tuning(model, self, epochs, math.ceil(len(images) / batch_size))
        model.fit(images, labels, epochs=epochs, batch_size=batch_size, callbacks=list(callbacks), verbose=verbose)
        return model

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
        from tfhash.schedules import learning_rate_schedule

        rate = learning_rate_schedule(self.learning_rate, self.schedule, epochs, steps_per_epoch, self.decay_epochs, self.decay_rate)
        scale = 1.0 if self.backbone_learning_rate is None else self.backbone_learning_rate / self.learning_rate
        common = {"backbone_scale": scale, "frozen_steps": self.frozen_epochs * int(steps_per_epoch), "l2": self.weight_decay,
                  "use_ema": bool(self.weight_averaging), "ema_momentum": float(self.weight_averaging) or 0.99}  # fmt: skip
        kind = ("adamw" if self.weight_decay else "adam") if self.optimizer == "auto" else self.optimizer
        if kind == "sgd":
            return BackboneRateSGD(learning_rate=rate, momentum=self.momentum, **common)
        if kind == "adamw":
            return BackboneRateAdamW(learning_rate=rate, weight_decay=self.weight_decay, **{**common, "l2": 0.0})
        return BackboneRateAdam(learning_rate=rate, **common)


#: Default recipes. Pretrained networks: the SCDH recipe (SGD momentum 0.9, backbone 0.001, new
#: layers 0.01) with HyP2's weight decay, step decay by 80% and augmentation; the decay epochs are
#: set from the run's epochs by :func:`tfhash.optimizers.compile_fine_tuning` when not given. From scratch (small_cnn,
#: mlp): Adam 1e-3, constant, no augmentation (tfhash's recipe before fine-tuning existed); the MLP
#: keeps :func:`tfhash.models.mlp`'s dropout of 0.2.
FINE_TUNING_DEFAULTS: dict[str, dict] = {
    "pretrained": {"optimizer": "sgd", "learning_rate": 0.01, "backbone_learning_rate": 0.001, "momentum": 0.9,
                   "weight_decay": 5e-4, "schedule": "step", "decay_rate": 0.2, "augment": True},
    "small_cnn": {},
    "mlp": {"dropout": 0.2},
}  # fmt: skip
