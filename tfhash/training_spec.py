"""How to train, as one typed spec: :class:`TrainingSpec`.

Every training setting is a field of :class:`TrainingSpec` with its default and what it does; a
value is checked when the spec is made, before TensorFlow loads (this module imports none).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from tfhash import storage
from tfhash.codes import check_bits
from tfhash.config_keys import check_count, check_keys, config_key, suggestion
from tfhash.fine_tuning import FineTuning
from tfhash.registry import get_method, method_names
from tfhash.towers import Tower, checked_input_map, checked_widths, towers_of, values_of

__all__ = ["TrainingSpec", "PIPELINE_KINDS", "PHOTOS"]

#: The kinds of data whose recommended recipes (:data:`tfhash.recipes.RECOMMENDED`) the TFX pipeline
#: trains (``training.recipe``, its Tuner): the single-label recipes are for fixed feature vectors,
#: while the pipeline's single-label datasets are images.
PIPELINE_KINDS = ("multi-label", "cross-modal")
#: The kind of data of the search over image recipes (:mod:`tfhash.tuning.photos`): one label per
#: image, pixels through a pretrained network; the pipeline's Tuner searches it for image backbones.
PHOTOS = "single-label photos"

@dataclass(frozen=True)
class TrainingSpec:
    """How to train: which model :func:`tfhash.registry.build_model` builds (a method of the
    library with its hyper-parameters, on which backbones) and how it trains it. A pipeline
    config's ``training`` section parses into one (:meth:`from_dict`), the Trainer's ``run_fn``
    reads one (:meth:`to_dict` travels in its custom config), a :class:`tfhash.recipes.Recipe`
    builds through one; every setting's default, type and range are stated here once. Frozen:
    derive another with ``dataclasses.replace``.

    ``fine_tuning`` is the optimisation's typed section (:class:`tfhash.fine_tuning.FineTuning`):
    given as a dict of its settings, it holds the backbone's defaults updated by them."""

    method: str = config_key("scdh", "the method the Trainer builds: one of `tfhash methods` (the pipeline trains those "
                             "marked for it)")
    bits: int = config_key(48, "code length K, a multiple of 8")
    backbone: str = config_key("small_cnn", "`small_cnn`, `mlp` (feature vectors), an ImageNet network (`efficientnet_lite0`, "
                        "`squeezenet`, `resnet50`, ...: `tfhash.networks.IMAGE_NETWORKS`) or the path of your "
                        "own encoder (`.keras` file or SavedModel folder)")
    backbone_weights: str | None = config_key("imagenet", "an image network's weights: `imagenet` (a local file or an "
                                       "installed package's; never a download), the path of a weights file, or null for a random init")
    image_size: int | None = config_key(None, "the side an image network runs at (null: its own, 224 for SqueezeNet)")
    hidden: list[int] | dict = config_key(lambda: [1024], "the widths of the `mlp` backbone's layers: one list for every "
                                          "tower, or `{modality: widths}` naming each")
    preset: str | None = config_key("cifar10", "SCDH / JCCH loss weights (`cifar10`, `nuswide`, `imagenet`: "
                             "`tfhash.models.SCDH_PRESETS`; null for the model's own defaults)")
    overrides: dict = config_key(dict, "the method's own settings over the preset, e.g. `{\"lam\": 0.01}`")
    epochs: int = config_key(20, "training epochs (one pass over the training split each)")
    batch_size: int = config_key(64, "training batch")
    fine_tuning: FineTuning | dict = config_key(dict, "`tfhash.fine_tuning.FineTuning` settings over the backbone's defaults: "
                            "optimizer, learning_rate, backbone_learning_rate, schedule, augment, dropout, trunk_cache (train "
                            "above a cached frozen trunk: `{\"cut\": \"pool5\", \"views\": 8}`), weight_averaging (the decay of "
                            "the weights' moving average, which the trained model keeps; 0 is off), ...")
    mixed_precision: str = config_key("auto", "`auto` (mixed_float16 when a GPU is present), `on` (mixed_float16), "
                               "`bfloat16` (mixed_bfloat16 where the CPU or GPU has it, else float32) or `off`")
    encode_mirrored: bool = config_key(False, "image inputs: the exported model averages each image's continuous codes with "
                                "its mirror's before the sign (twice the encoding cost)")
    gpu_batch_size: int | None = config_key(None, "the batch when a GPU is present (null: batch_size)")
    seed: int = config_key(0, "seeds the initial weights and the shuffling")
    label_coefficients: bool = config_key(False, "train with the JCCH coefficients q / u computed in Transform (needs "
                                   "jcch_anchors)")
    input_map: str | dict = config_key("none", "what Transform maps feature vectors through, with statistics of the training "
                                "split (`tfhash.towers.INPUT_MAPS`): `none` (z-scores with one mean and variance), "
                                "`standardise` (z-scores per feature), `rbf` (RBF features on 500 anchors, then "
                                "standardised); one for every vector input or `{modality: map}`")
    recipe: str | None = config_key(None, "a kind of data of `tfhash.recipes.RECOMMENDED` (`multi-label`, `cross-modal`): "
                             "its method, settings, MLP and optimizer, under whatever this section sets itself; or "
                             "`single-label photos`: `tfhash.recipes.recommended_photos` at the section's bits (network, "
                             "side, trunk cache, schedule; the hash loss by code length) likewise")

    def __post_init__(self) -> None:
        from tfhash.networks import OTHER_BACKBONES, check_backbone_name

        if self.method not in method_names():
            raise ValueError(f"unknown method {self.method!r}; choose one of {method_names()}{suggestion(self.method, method_names())}")
        check_bits(self.bits)
        check_backbone_name(self.backbone)
        for key in ("epochs", "batch_size"):
            check_count(f"training.{key}", getattr(self, key))
        check_count("training.gpu_batch_size", self.gpu_batch_size, optional=True)
        checked_widths(self.hidden, "training.hidden")
        maps = checked_input_map(self.input_map, "training.input_map")
        if not isinstance(self.encode_mirrored, bool) or (self.encode_mirrored and self.backbone == "mlp"):
            raise ValueError(f"training.encode_mirrored is true or false, for image backbones; got {self.encode_mirrored!r} "
                             f"with backbone {self.backbone!r}")  # fmt: skip
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"training.seed must be an integer, got {self.seed!r}")
        if not isinstance(self.overrides, dict):
            raise ValueError(f"training.overrides must be an object of settings, got {self.overrides!r}")
        if isinstance(self.fine_tuning, dict):
            object.__setattr__(self, "fine_tuning", FineTuning.for_backbone(self.backbone, **self.fine_tuning))
        elif not isinstance(self.fine_tuning, FineTuning):
            raise ValueError(f"training.fine_tuning must be an object of settings, got {self.fine_tuning!r}")
        if self.image_size is not None and not (isinstance(self.image_size, int) and 16 <= self.image_size <= 1024):
            raise ValueError(f"image_size must be an integer side from 16 to 1024 pixels, got {self.image_size!r}")
        from tfhash.precision import PRECISIONS

        if self.mixed_precision not in PRECISIONS:
            raise ValueError(f"mixed_precision must be one of {list(PRECISIONS)}, got {self.mixed_precision!r}")
        if self.backbone != "mlp" and (set(values_of(maps)) != {"none"} or any(values_of(self.fine_tuning.input_dropout))):
            raise ValueError(f"training.input_map and training.fine_tuning.input_dropout are for feature vectors (the mlp "
                             f"backbone); backbone {self.backbone!r} takes images: drop them")  # fmt: skip
        cache = self.fine_tuning.trunk_cache
        if cache is not None and cache.directory is not None and storage.is_uri(cache.directory):
            raise ValueError(f"training.fine_tuning.trunk_cache.directory {cache.directory!r} is a URI; the cache is memory maps, "
                             "a local folder (leave it null: the run's folder, or on remote storage the cache folder of the "
                             "machine that trains)")  # fmt: skip
        if cache is not None:
            method = get_method(self.method)
            if self.backbone in OTHER_BACKBONES or method.cross_modal or method.semi_supervised:
                raise ValueError(f"training.fine_tuning.trunk_cache serves one pretrained image network (an ImageNet "
                                 f"network or your encoder), not method {self.method!r} with backbone {self.backbone!r}")  # fmt: skip
            if cache.mixup and not method.label_coefficients:
                raise ValueError(f"training.fine_tuning.trunk_cache.mixup mixes SCUL's label weights: method {self.method!r} "
                                 "has none (use scdh, or set mixup to 0)")  # fmt: skip
        photo_recipe = self.recipe == PHOTOS and self.backbone not in OTHER_BACKBONES
        if self.recipe is not None and not photo_recipe and (self.recipe not in PIPELINE_KINDS or self.backbone != "mlp"):
            raise ValueError(f"training.recipe names the recommended recipe a section started from, one of {PIPELINE_KINDS} "
                             f"with backbone mlp, or {PHOTOS!r} with an image network; got {self.recipe!r} with backbone "
                             f"{self.backbone!r}")  # fmt: skip

    @classmethod
    def from_dict(cls, section: dict, where: str = "training.") -> TrainingSpec:
        """The spec of a config's training section: unknown keys refused with the nearest known one
        (``where`` prefixes the key in the message), every value checked. A section that names a
        ``recipe`` is laid over it first by :func:`tfhash.recipes.with_recipe` (the pipeline
        config does so).

        Raises:
            ValueError: naming the key and what it takes.
        """
        if not isinstance(section, dict):
            raise ValueError(f"{where.rstrip('.')} must be an object of training settings, got {section!r}")
        check_keys(section, [f.name for f in fields(cls)], where)
        return cls(**section)

    def to_dict(self) -> dict:
        """The spec as JSON holds it (:meth:`from_dict` reads it back to an equal spec)."""
        return asdict(self)

    def towers(self, modalities) -> dict[str, Tower]:
        """``{modality: Tower}``: the settings of each feature-vector tower of the data's inputs
        ``modalities`` (``hidden``, ``input_map``, ``fine_tuning.input_dropout``;
        :func:`tfhash.towers.towers_of`).

        Raises:
            ValueError: a per-tower setting naming a tower the data does not have, or ``hidden``
                leaving one out.
        """
        return towers_of(self.hidden, self.input_map, self.fine_tuning.input_dropout, modalities,
                         ("training.hidden", "training.input_map", "training.fine_tuning.input_dropout"))  # fmt: skip
