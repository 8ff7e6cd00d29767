"""How to train, as one typed spec: :class:`TrainingSpec`, and the helpers of typed config
sections (:func:`config_key`, :func:`check_keys`), which the pipeline config uses too.

Every training setting is a field of :class:`TrainingSpec` with its default and what it does; a
value is checked when the spec is made, before TensorFlow loads (this module imports none).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import asdict, dataclass, field, fields

from tfhash import storage
from tfhash.codes import check_bits
from tfhash.recipes import PIPELINE_KINDS
from tfhash.registry import get_method, method_names

__all__ = ["TrainingSpec", "config_key", "REQUIRED", "check_keys", "check_count", "suggestion", "with_recipe"]

#: The default of a key that has none: the config must set it.
REQUIRED = dataclasses.MISSING


def config_key(default, text: str):
    """A config key: its default (a value, or a factory such as ``dict`` or a lambda for a
    mutable one; :data:`REQUIRED` for none) and what it does (:func:`key_table`)."""
    if default is REQUIRED:
        return field(metadata={"doc": text})
    if callable(default):
        return field(default_factory=default, metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


@dataclass
class TrainingSpec:
    """How to train: what the Trainer builds (a method of the library with its hyper-parameters)
    and how it trains it. A pipeline config's ``training`` section parses into one
    (:meth:`from_dict`), the Trainer's ``run_fn`` reads one (:meth:`to_dict` travels in its custom
    config); every setting's default, type and range are stated here once."""

    method: str = config_key("scdh", "the method the Trainer builds: one of `tfhash methods` trained by the pipeline")
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
    fine_tuning: dict = config_key(dict, "`tfhash.fine_tuning.FineTuning` settings over the backbone's defaults: "
                            "optimizer, learning_rate, backbone_learning_rate, schedule, augment, dropout, trunk_cache (train "
                            "above a cached frozen trunk: `{\"cut\": \"pool5\", \"views\": 8}`), ...")
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
                             "its method, settings, MLP and optimizer, under whatever this section sets itself")

    def __post_init__(self) -> None:
        from tfhash.networks import check_backbone_name
        from tfhash.towers import checked_widths

        if self.method not in method_names(in_pipeline=True):
            raise ValueError(f"unknown method {self.method!r}; the pipeline trains {method_names(in_pipeline=True)}"
                             f"{suggestion(self.method, method_names(in_pipeline=True))}")  # fmt: skip
        check_bits(self.bits)
        check_backbone_name(self.backbone)
        for key in ("epochs", "batch_size"):
            check_count(f"training.{key}", getattr(self, key))
        check_count("training.gpu_batch_size", self.gpu_batch_size, optional=True)
        checked_widths(self.hidden, "training.hidden")
        if not isinstance(self.encode_mirrored, bool) or (self.encode_mirrored and self.backbone == "mlp"):
            raise ValueError(f"training.encode_mirrored is true or false, for image backbones; got {self.encode_mirrored!r} "
                             f"with backbone {self.backbone!r}")  # fmt: skip
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"training.seed must be an integer, got {self.seed!r}")
        for key in ("overrides", "fine_tuning"):
            if not isinstance(getattr(self, key), dict):
                raise ValueError(f"training.{key} must be an object of settings, got {getattr(self, key)!r}")
        if self.image_size is not None and not (isinstance(self.image_size, int) and 16 <= self.image_size <= 1024):
            raise ValueError(f"image_size must be an integer side from 16 to 1024 pixels, got {self.image_size!r}")
        from tfhash.precision import PRECISIONS

        if self.mixed_precision not in PRECISIONS:
            raise ValueError(f"mixed_precision must be one of {list(PRECISIONS)}, got {self.mixed_precision!r}")
        cache = self.optimisation().trunk_cache  # raises ValueError on unknown or invalid fine-tuning settings
        if cache is not None and cache.directory is not None and storage.is_uri(cache.directory):
            raise ValueError(f"training.fine_tuning.trunk_cache.directory {cache.directory!r} is a URI; the cache is memory maps, "
                             "a local folder (leave it null: the run's folder, or on remote storage the cache folder of the "
                             "machine that trains)")  # fmt: skip
        if cache is not None:
            method = get_method(self.method)
            if self.backbone in ("small_cnn", "mlp") or method.cross_modal or method.semi_supervised:
                raise ValueError(f"training.fine_tuning.trunk_cache serves one pretrained image network (an ImageNet "
                                 f"network or your encoder), not method {self.method!r} with backbone {self.backbone!r}")  # fmt: skip
            if cache.mixup and not method.label_coefficients:
                raise ValueError(f"training.fine_tuning.trunk_cache.mixup mixes SCUL's label weights: method {self.method!r} "
                                 "has none (use scdh, or set mixup to 0)")  # fmt: skip
        if self.recipe is not None:
            recipe = pipeline_recipe(self.recipe)
            if (self.method, self.backbone) != (recipe.method, "mlp"):
                raise ValueError(f"training.recipe {self.recipe!r} is expanded from a config section: build the "
                                 "section with TrainingSpec.from_dict(section), as PipelineConfig does")  # fmt: skip

    @classmethod
    def from_dict(cls, section: dict, where: str = "training.") -> TrainingSpec:
        """The spec of a config's training section: unknown keys refused with the nearest known one
        (``where`` prefixes the key in the message), a ``recipe`` expanded (:func:`with_recipe`),
        every value checked.

        Raises:
            ValueError: naming the key and what it takes.
        """
        if not isinstance(section, dict):
            raise ValueError(f"{where.rstrip('.')} must be an object of training settings, got {section!r}")
        check_keys(section, [f.name for f in fields(cls)], where)
        return cls(**with_recipe(section))

    def to_dict(self) -> dict:
        """The spec as JSON holds it (:meth:`from_dict` reads it back to an equal spec)."""
        return asdict(self)

    def optimisation(self):
        """The :class:`tfhash.fine_tuning.FineTuning` of this run: the backbone's defaults updated
        by ``fine_tuning``."""
        from tfhash.fine_tuning import FineTuning

        return FineTuning.for_backbone(self.backbone, **self.fine_tuning)


def suggestion(word: str, known) -> str:
    """``"; did you mean 'x'?"`` for the known word nearest ``word`` (empty when none is near)."""
    near = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else ""


def check_keys(section: dict, known, where: str) -> None:
    """Refuse keys of ``section`` that are not ``known``, each with the nearest known key."""
    unknown = sorted(set(section) - set(known))
    if unknown:
        hints = "; ".join(f"{where + key!r}{suggestion(key, known).replace('; ', ': ', 1)}" for key in unknown)
        raise ValueError(f"unknown setting{'s' if len(unknown) > 1 else ''} {hints} (known: {sorted(known)})")


def check_count(name: str, value, optional: bool = False) -> None:
    """``value`` must be a positive integer (or None when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer{' or null' if optional else ''}, got {value!r}")


def with_recipe(training: dict) -> dict:
    """``training`` over the recommended recipe it names (``"recipe": kind``): the recipe's method,
    its settings as ``overrides``, the MLP widths, epochs, batch and its optimizer as
    ``fine_tuning``; a key the section sets wins, and ``overrides`` / ``fine_tuning`` merge key by
    key. Without ``recipe``, ``training`` unchanged.

    Raises:
        ValueError: an unknown kind, or a backbone other than ``mlp`` (the recipes are for feature
            vectors).
    """
    kind = training.get("recipe")
    if kind is None:
        return training
    recipe = pipeline_recipe(kind)
    if training.get("backbone", "mlp") != "mlp":
        raise ValueError(f"training.recipe {kind!r} trains an MLP on feature vectors; "
                         f"drop it to use backbone {training['backbone']!r}")  # fmt: skip
    if training.get("method", recipe.method) != recipe.method:
        raise ValueError(f"training.recipe {kind!r} trains {recipe.method!r}; drop method {training['method']!r} or the recipe")
    tuning = dict(training.get("fine_tuning", {}))
    # the section's own rates etc. go through the recipe, so its optimizer follows them (AdamW when decayed)
    tuned = dataclasses.replace(recipe, **{k: tuning[k] for k in RECIPE_TRAINING_KEYS if k in tuning})
    return {**recipe.pipeline_section(), **training, "overrides": {**recipe.options, **training.get("overrides", {})},
            "fine_tuning": {**tuned.fine_tuning_settings(), **tuning}}  # fmt: skip


#: Recipe fields a section's ``fine_tuning`` may set over the recipe's.
RECIPE_TRAINING_KEYS = ("learning_rate", "weight_decay", "schedule", "dropout", "input_dropout")


def pipeline_recipe(kind: str):
    """The recommended recipe of ``kind`` for a pipeline run.

    Raises:
        ValueError: an unknown kind, or one the pipeline does not train.
    """
    from tfhash.recipes import recommended

    recipe = recommended(kind)
    if kind not in PIPELINE_KINDS:
        raise ValueError(f"training.recipe {kind!r} is for fixed feature vectors (python -m benchmarks.peers); the "
                         f"pipeline takes {PIPELINE_KINDS}: for single-label images set method and backbone instead")  # fmt: skip
    return recipe
