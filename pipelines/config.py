"""One typed config file describes a pipeline run (JSON).

A config is checked completely when it is read, before TensorFlow or TFX load: unknown keys (with
the nearest known key suggested), values of the wrong type or range, a backbone, its weights file
and the data folders that do not exist. :meth:`PipelineConfig.load` names the file in every
message. Each key documents itself beside its default (:func:`config_key`); :func:`key_table` makes the
pipeline page's table of them (docs/pipeline.md), which a test checks.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import numbers
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from tfhash import storage
from tfhash.artifacts import DEFAULT_RUN_DIR, RunLayout, read_data_description
from tfhash.codes import check_bits
from tfhash.index.factory import parse_index_type
from tfhash.index.milvus import MilvusIndex, is_local
from tfhash.recipes import PIPELINE_KINDS
from tfhash.registry import get_method, method_names

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
class TrainingConfig:
    """What the Trainer builds: a method of the library with its hyper-parameters."""

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
                                 "section with TrainingConfig(**with_recipe(section)), as PipelineConfig does")  # fmt: skip

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


def resolve_training_paths(training: dict, locate) -> dict:
    """``training`` with its encoder path (``backbone``) and weights file located by ``locate(key,
    value)`` (:meth:`PipelineConfig.load`: relative to the config file's folder)."""
    from tfhash.networks import IMAGENET, is_encoder_path

    training = dict(training)
    backbone, weights = training.get("backbone"), training.get("backbone_weights")
    if isinstance(backbone, str) and is_encoder_path(backbone):
        training["backbone"] = locate("training.backbone", backbone)
    if isinstance(weights, str) and weights not in (IMAGENET, "none"):
        training["backbone_weights"] = locate("training.backbone_weights", weights)
    return training


def cluster_location(key: str, value: str, base) -> str:
    """``value`` of the location ``key`` in a config compiled for a cluster: a URI, or an absolute
    path of a volume the pods mount or of their image; a relative path means nothing in a pod. The
    run directory must be a URI: it holds the pipeline root, which Kubeflow Pipelines' launcher
    reads and writes on object storage only (``gs://``, ``s3://``).

    Raises:
        ValueError: a relative path (naming the folder it would have meant on this machine), or a
            run directory that is no URI.
    """
    if storage.is_uri(value):
        return value
    if key == "run_dir":
        raise ValueError(f"run_dir {value!r} is not a URI: on a cluster the run directory holds the pipeline root, which "
                         "Kubeflow Pipelines keeps on object storage; set it to e.g. gs://my-bucket/runs/mnist")  # fmt: skip
    if os.path.isabs(value):
        return value
    raise ValueError(f"{key} {value!r} is relative: on a cluster it cannot mean {storage.resolve(base, value)!r} of this "
                     "machine; give a URI of storage the pods read (e.g. gs://my-bucket/...) or an absolute path of a "
                     "volume they mount")  # fmt: skip


@dataclass
class TunerConfig:
    """The Tuner component (:mod:`tfhash.tuning`): the method and recipe chosen on a validation split
    of the training rows, which the Trainer then trains on all of them."""

    kind: str | None = config_key(None, "the search space (`tfhash.tuning.SEARCH_SPACES`) of feature vectors the pipeline "
                           "trains: `multi-label` or `cross-modal` (null: from the labels and modalities)")
    max_units: int = config_key(9, "Hyperband's top fidelity: a trial of u units trains u / max_units of its recipe's epochs")
    factor: int = config_key(3, "Hyperband's reduction factor (1 / factor of the trials go on to the next rung)")
    trials: int | None = config_key(None, "start no trial after this many (null: Hyperband's whole schedule)")
    seconds: float | None = config_key(None, "start no trial after this wall time (null: no limit)")
    train_in_database: float = config_key(0.5, "the share of the validation database drawn from the rows trained on: your "
                                   "catalogue's (the items trained on themselves: up to 0.9; mostly unseen items: low)")

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in PIPELINE_KINDS:
            raise ValueError(f"tuner.kind must be one of {list(PIPELINE_KINDS)} or null, got {self.kind!r}"
                             f"{suggestion(self.kind, PIPELINE_KINDS)}")  # fmt: skip
        check_count("tuner.max_units", self.max_units)
        check_count("tuner.factor", self.factor)
        check_count("tuner.trials", self.trials, optional=True)
        if self.seconds is not None and (isinstance(self.seconds, bool) or not isinstance(self.seconds, numbers.Real)):
            raise ValueError(f"tuner.seconds must be a number of seconds or null, got {self.seconds!r}")
        if isinstance(self.train_in_database, bool) or not isinstance(self.train_in_database, numbers.Real) or not (
                0 <= self.train_in_database <= 0.9):  # fmt: skip
            raise ValueError(f"tuner.train_in_database must be a share from 0 to 0.9, got {self.train_in_database!r}")
        self.budget()  # refuses a budget that cannot run one trial

    def budget(self):
        """The search's :class:`tfhash.tuning.Budget`."""
        from tfhash.tuning import Budget

        return Budget.of(asdict(self))


@dataclass
class PipelineConfig:
    """A pipeline run: data, training, blessing, serving and index settings.

    Paths are relative to the config file's folder unless absolute; ``run_dir`` holds the data
    export, the pipeline root, the ML Metadata SQLite file, the serving base directory and the
    indexes.
    """

    name: str = config_key(REQUIRED, "the run's name: its folders under run_dir and the served model's name")
    dataset: str = config_key("mnist", "a shipped dataset (`mnist`, `cifar10`, `mirflickr25k`, `wiki`), exported with its "
                       "standard split; not with data_dir")
    data_root: str | None = config_key(None, "the folder holding the shipped datasets and weights (null: $TFHASH_DATA_ROOT "
                                "or ../shared/data)")
    data_dir: str | None = config_key(None, "a folder or URI (`gs://...`) written by `tfhash data export-user` (your own data) "
                               "or `tfhash data export`, read instead of dataset")
    split_seed: int = config_key(0, "the seed of a shipped dataset's standard split")
    limit: int | None = config_key(None, "keep the first N examples of each split (small runs)")
    modality: str = config_key("image", "the feature the model reads (`image`, or a name of export-user's --features)")
    modalities: list[str] = config_key(list, "two feature names for a cross-modal method (jcch); the first is the query side")
    run_dir: str = config_key(DEFAULT_RUN_DIR, "where the run writes: pipeline root, ML Metadata, pushed models, indexes; a "
                              "folder or a URI (`gs://bucket/runs/x`: ML Metadata then in this machine's cache folder)")
    training: TrainingConfig = config_key(TrainingConfig, "the training section (keys `training.*` below)")
    map_threshold: float = config_key(0.5, "bless a model when its mAP@all reaches this")
    max_regression: float = config_key(0.01, "and when it is at most this below the model serving now's (the newest pushed "
                                       "version's)")
    index_kinds: list[str] = config_key(lambda: ["BFlat"], "the indexes built for the pushed model (`BFlat`, `BIVF<n>`, "
                                 "`BMultiHash<n>`, `ScaNN`, `ScaNNBrute`, `Milvus`)")
    milvus_uri: str | None = config_key(None, "the Milvus of the `Milvus` index: a server URI or a Milvus Lite file (null: a "
                                 "file in run_dir)")
    jcch_anchors: int | None = config_key(None, "anchors of the JCCH coefficients computed in Transform (null: off)")
    bad_records: str = config_key("fail", "RecordFilter: `fail` stops the run on any bad record, `drop` leaves them out and "
                           "reports them")
    beam_args: list[str] = config_key(lambda: ["--direct_running_mode=in_memory", "--direct_num_workers=1"],
                               "arguments of every Beam job (runner, workers)")
    image: str = config_key("tfhash-pipeline:latest", "the container image the Kubeflow spec's pods run (`pipelines/Dockerfile`)")
    tuner: TunerConfig | None = config_key(None, "choose the method and recipe with the Tuner component on a validation split "
                                    "of the training rows (keys `tuner.*` below; null: train the training section as it is)")
    #: A config for a cluster's pods (:meth:`load` with ``for_cluster``): its data are not looked for here.
    for_cluster: dataclasses.InitVar[bool] = False

    def __post_init__(self, for_cluster: bool = False) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"name must be a non-empty string (it names the run's folders), got {self.name!r}")
        if isinstance(self.training, dict):
            check_keys(self.training, [f.name for f in fields(TrainingConfig)], "training.")
            self.training = TrainingConfig(**with_recipe(self.training))
        elif not isinstance(self.training, TrainingConfig):
            raise ValueError(f"training must be an object of training settings, got {self.training!r}")
        if isinstance(self.tuner, dict):
            check_keys(self.tuner, [f.name for f in fields(TunerConfig)], "tuner.")
            self.tuner = TunerConfig(**self.tuner)
        elif self.tuner is not None and not isinstance(self.tuner, TunerConfig):
            raise ValueError(f"tuner must be an object of tuner settings or null, got {self.tuner!r}")
        if self.tuner is not None and self.training.backbone != "mlp":
            raise ValueError(f"tuner chooses among recipes for feature vectors (the mlp backbone), not backbone "
                             f"{self.training.backbone!r}; drop the tuner or train on features")  # fmt: skip
        self._check_data(for_cluster)
        check_count("limit", self.limit, optional=True)
        check_count("jcch_anchors", self.jcch_anchors, optional=True)
        if isinstance(self.split_seed, bool) or not isinstance(self.split_seed, int):
            raise ValueError(f"split_seed must be an integer, got {self.split_seed!r}")
        for key, low, high in (("map_threshold", 0.0, 1.0), ("max_regression", 0.0, 1.0)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not low <= value <= high:
                raise ValueError(f"{key} must be a number from {low} to {high}, got {value!r}")
        if not self.index_kinds:
            raise ValueError('index_kinds is empty; name at least one index type, e.g. ["BFlat"]')
        if not isinstance(self.index_kinds, list) or not all(isinstance(kind, str) for kind in self.index_kinds):
            raise ValueError(f'index_kinds must be a list of index type names, e.g. ["BFlat", "Milvus"], got {self.index_kinds!r}')
        for kind in self.index_kinds:
            parse_index_type(kind)  # an unknown or misspelt type fails here, before any training
        if self.milvus_uri is not None and (not isinstance(self.milvus_uri, str) or not self.milvus_uri.strip()):
            raise ValueError(f"milvus_uri must be a Milvus server address such as http://milvus:19530 or a Milvus Lite "
                             f"file such as runs/milvus.db (or absent: the run's own Lite file), got {self.milvus_uri!r}")  # fmt: skip
        if self.uses_milvus and (self.layout.remote or for_cluster) and (self.milvus_uri is None or is_local(self.milvus_uri)):
            raise ValueError(f"index kind Milvus would keep its collections in a Milvus Lite file ({self.milvus!r}), which only "
                             "one machine opens; a run on remote storage or a cluster needs a Milvus server both the pipeline "
                             "and the search service reach: set milvus_uri (e.g. http://milvus:19530), or drop Milvus from "
                             "index_kinds")  # fmt: skip
        if self.bad_records not in ("fail", "drop"):
            raise ValueError(f"bad_records must be 'fail' or 'drop', got {self.bad_records!r}")
        method = get_method(self.training.method)
        cross_modal = method.cross_modal
        if cross_modal != bool(self.modalities) or (cross_modal and len(set(self.modalities)) != 2):
            raise ValueError(f"method {self.training.method!r}: " + ("set modalities to two modality names (e.g. "
                             '["image", "text"]); the first is the default query modality' if cross_modal else
                             "modalities is only for the cross-modal methods; use modality"))  # fmt: skip
        if self.training.label_coefficients and not self.jcch_anchors:
            raise ValueError("training.label_coefficients needs jcch_anchors (the Transform computes q and u)")
        if self.training.label_coefficients and not method.label_coefficients:
            raise ValueError(f"JCCH label coefficients apply to {method_names(label_coefficients=True)}, not {method.name!r}")
        self._check_input_maps()
        hidden = self.training.hidden
        if isinstance(hidden, dict) and set(hidden) != set(self.inputs):
            raise ValueError(f"training.hidden names the towers {sorted(hidden)}; this run's inputs are {self.inputs}: "
                             "give one list of widths, or name each input")  # fmt: skip
        input_dropout = self.training.optimisation().input_dropout
        rates = input_dropout if isinstance(input_dropout, dict) else {name: input_dropout for name in self.inputs}
        if set(rates) - set(self.inputs):
            raise ValueError(f"training.fine_tuning.input_dropout names {sorted(set(rates) - set(self.inputs))}; "
                             f"this run's inputs are {self.inputs}")  # fmt: skip
        if any(rates.values()) and self.training.backbone != "mlp":
            raise ValueError(f"training.fine_tuning.input_dropout is for the mlp backbone, not {self.training.backbone!r}")

    def _check_input_maps(self) -> None:
        from tfhash.towers import INPUT_MAPS

        chosen = self.training.input_map
        if not isinstance(chosen, (str, dict)):
            raise ValueError(f"training.input_map must be a map name or {{modality: map}}, got {chosen!r}")
        if isinstance(chosen, dict) and set(chosen) - set(self.inputs):
            raise ValueError(f"training.input_map names {sorted(set(chosen) - set(self.inputs))}; this run's inputs are {self.inputs}")
        maps = self.input_maps()
        for name, kind in maps.items():
            if kind not in INPUT_MAPS:
                raise ValueError(f"training.input_map of {name!r} is {kind!r}; choose one of {list(INPUT_MAPS)}"
                                 f"{suggestion(kind, INPUT_MAPS)}")  # fmt: skip
        mapped = sorted(name for name, kind in maps.items() if kind != "none")
        if mapped and self.training.backbone != "mlp":
            raise ValueError(f"training.input_map maps feature vectors (the mlp backbone); {mapped} feed backbone "
                             f"{self.training.backbone!r}: drop the input map")  # fmt: skip

    def _check_data(self, for_cluster: bool) -> None:
        """The data the run reads: an exported folder (``data_dir``) or a shipped dataset under
        ``data_root``, and an image network's weights file, all found now rather than minutes in;
        for a cluster (``for_cluster``) only what can be told without reading them."""
        from tfhash.data import LOADERS
        from tfhash.networks import IMAGE_NETWORKS, resolve_weights

        if not for_cluster:  # the file systems of the URIs this machine reads and writes
            for location in (self.run_dir, self.data_dir):
                storage.check_scheme(location)
        if self.data_root is not None and storage.is_uri(self.data_root):
            raise ValueError(f"data_root {self.data_root!r} is a URI; it is a folder of the machine (or the image) that reads "
                             "the shipped datasets and weights: export data to remote storage with `tfhash data export "
                             "--output gs://...` and set data_dir")  # fmt: skip
        if not for_cluster and self.data_root is not None and not os.path.isdir(self.data_root):
            raise ValueError(f"data_root {self.data_root!r} is not a folder (the folder holding mnist/, cifar10/, ...)")
        if self.data_dir is not None:
            if not for_cluster:
                read_data_description(self.data_dir)  # a ValueError naming the folder and the commands that write it
        elif self.dataset not in LOADERS:
            raise ValueError(f"unknown dataset {self.dataset!r}; the shipped ones are {sorted(LOADERS)}"
                             f"{suggestion(self.dataset, LOADERS)}; for your own data set data_dir to the folder "
                             "`tfhash data export-user` wrote")  # fmt: skip
        if self.training.backbone in IMAGE_NETWORKS and not for_cluster:
            resolve_weights(self.training.backbone, self.training.backbone_weights, self.data_root)

    @property
    def layout(self) -> RunLayout:
        """Every location this run uses (:class:`tfhash.artifacts.RunLayout`)."""
        return RunLayout(self.run_dir, self.name, self.data_dir)

    @property
    def milvus(self) -> str:
        """The Milvus that ``Milvus`` indexes go to: ``milvus_uri``, else the run's Milvus Lite file."""
        return self.milvus_uri or self.layout.milvus_lite

    @property
    def uses_milvus(self) -> bool:
        """Whether an index of ``index_kinds`` goes to :attr:`milvus`."""
        return any(parse_index_type(kind)[0].cls is MilvusIndex for kind in self.index_kinds)

    @property
    def inputs(self) -> list[str]:
        """The modalities the model reads: ``modalities`` (cross-modal) or ``[modality]``."""
        return list(self.modalities) or [self.modality]

    def input_maps(self) -> dict[str, str]:
        """``training.input_map`` of every input: ``{modality: map}`` (images: ``none``)."""
        from tfhash.towers import input_map_of

        return {name: input_map_of(self.training.input_map, name) for name in self.inputs}

    @classmethod
    def load(cls, path: str | os.PathLike, for_cluster: bool = False, overrides: dict | None = None) -> PipelineConfig:
        """Read a JSON config; relative paths resolve against its folder. Locations may be URIs of
        remote storage (``gs://bucket/run``), which are kept as they are.

        With ``for_cluster`` (``tfhash pipeline compile``), the config is for a cluster's pods: every
        location must be a URI or an absolute path of a volume the pods mount (a relative one is
        refused, :func:`cluster_location`; ``run_dir`` must be set), and nothing is read: the data,
        the data root and the weights are looked for when the pipeline runs. ``overrides``: top-level
        keys set over the file's (e.g. ``{"run_dir": "gs://my-bucket/runs/mnist"}``).

        Raises:
            ValueError: unreadable file, unknown keys or invalid values (the message says which).
        """
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: cannot read the pipeline config ({err})") from err
        try:
            if not isinstance(raw, dict):
                raise ValueError("a pipeline config is a JSON object of settings")
            raw.update(overrides or {})
            check_keys(raw, [f.name for f in fields(cls)], "")
            missing = [f for f in fields(cls) if f.default is REQUIRED and f.default_factory is REQUIRED and f.name not in raw]
            if missing:
                raise ValueError("missing " + "; ".join(f"setting {f.name!r} ({f.metadata['doc']})" for f in missing))
            if raw.get("data_dir") and raw.get("dataset") is not None:
                raise ValueError(f"dataset {raw['dataset']!r} and data_dir are both set; a run reads data_dir (its "
                                 "metadata.json names the data), so drop dataset")  # fmt: skip
            base = path.resolve().parent

            def locate(key: str, value: str) -> str:
                return cluster_location(key, value, base) if for_cluster else storage.resolve(base, value)

            if for_cluster and "run_dir" not in raw:
                raise ValueError("run_dir is not set: on a cluster, set it to a URI of storage the pods write (e.g. "
                                 "gs://my-bucket/runs/mnist)")  # fmt: skip
            raw.setdefault("run_dir", DEFAULT_RUN_DIR)  # relative to the config file too
            for key in ("run_dir", "data_root", "data_dir"):
                if isinstance(raw.get(key), str):
                    raw[key] = locate(key, raw[key])
            if isinstance(raw.get("milvus_uri"), str) and raw["milvus_uri"].strip() and is_local(raw["milvus_uri"]):
                raw["milvus_uri"] = locate("milvus_uri", raw["milvus_uri"])  # a Milvus Lite file, relative to the config
            if isinstance(raw.get("training"), dict):
                raw["training"] = resolve_training_paths(raw["training"], locate)
            return cls(**raw, for_cluster=for_cluster)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err

    def to_dict(self) -> dict:
        return asdict(self)


def key_table() -> str:
    """Every key of a config file with its default and what it does, as a Markdown table (the
    pipeline page shows it; a test checks they agree)."""
    rows = ["| key | default | what it does |", "|---|---|---|"]
    for prefix, cls in (("", PipelineConfig), ("training.", TrainingConfig), ("tuner.", TunerConfig)):
        for item in fields(cls):
            if item.name == "training" and not prefix:
                continue
            if item.default is not dataclasses.MISSING:
                default = json.dumps(item.default)
            elif item.default_factory is not dataclasses.MISSING:
                default = json.dumps(item.default_factory())
            else:
                default = "(required)"
            rows.append(f"| `{prefix}{item.name}` | `{default}` | {item.metadata['doc']} |".replace("`(required)`", "(required)"))
    return "\n".join(rows)
