"""One typed config file describes a pipeline run (JSON)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from tfhash.artifacts import DEFAULT_RUN_DIR, RunLayout, resolve_path
from tfhash.codes import check_bits
from tfhash.index.factory import parse_index_type
from tfhash.index.milvus import MilvusIndex, is_local
from tfhash.registry import get_method, method_names


@dataclass
class TrainingConfig:
    """What the Trainer builds: a method of the library with its hyper-parameters."""

    method: str = "scdh"
    bits: int = 48
    # small_cnn | mlp | an ImageNet network of tfhash.models.IMAGE_NETWORKS | the path of an encoder
    backbone: str = "small_cnn"
    backbone_weights: str | None = "imagenet"  # image networks: "imagenet" (a local file), a weights file, or null
    image_size: int | None = None  # the side an image network runs at (default: its own)
    hidden: list[int] = field(default_factory=lambda: [1024])
    preset: str | None = "cifar10"
    overrides: dict = field(default_factory=dict)  # e.g. {"lam": 0.01}
    epochs: int = 20
    batch_size: int = 64
    # tfhash.fine_tuning.FineTuning settings over the backbone's defaults (optimizer, rates, schedule, ...)
    fine_tuning: dict = field(default_factory=dict)
    mixed_precision: str = "auto"  # "auto": mixed_float16 when a GPU is present; "on" | "off"
    gpu_batch_size: int | None = None  # batch size when a GPU is present (default: batch_size)
    seed: int = 0
    label_coefficients: bool = False  # train with the JCCH q / u computed in Transform
    # a kind of data of tfhash.recipes.RECOMMENDED: its method, settings, MLP and optimizer, under
    # whatever this section sets itself (see with_recipe)
    recipe: str | None = None

    def __post_init__(self) -> None:
        from tfhash.models.backbones import check_backbone_name

        if self.method not in method_names(in_pipeline=True):
            raise ValueError(f"unknown method {self.method!r}; the pipeline trains {method_names(in_pipeline=True)}")
        check_bits(self.bits)
        check_backbone_name(self.backbone)
        if self.image_size is not None and not (isinstance(self.image_size, int) and 16 <= self.image_size <= 1024):
            raise ValueError(f"image_size must be an integer side from 16 to 1024 pixels, got {self.image_size!r}")
        if self.mixed_precision not in ("auto", "on", "off"):
            raise ValueError(f"mixed_precision must be 'auto', 'on' or 'off', got {self.mixed_precision!r}")
        self.optimisation()  # raises ValueError on unknown or invalid fine-tuning settings
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
    return {"method": recipe.method, "backbone": "mlp", "hidden": list(recipe.hidden), "epochs": recipe.epochs,
            "batch_size": recipe.batch_size, **training, "overrides": {**recipe.options, **training.get("overrides", {})},
            "fine_tuning": {**tuned.fine_tuning_settings(), **tuning}}  # fmt: skip


#: The recipes' kinds of data the pipeline trains: the single-label recipes are for fixed feature
#: vectors (benchmarks.peers), while the pipeline's single-label datasets are images.
PIPELINE_RECIPES = ("multi-label", "cross-modal")
#: Recipe fields a section's ``fine_tuning`` may set over the recipe's.
RECIPE_TRAINING_KEYS = ("learning_rate", "weight_decay", "schedule", "dropout", "input_dropout")


def pipeline_recipe(kind: str):
    """The recommended recipe of ``kind`` for a pipeline run.

    Raises:
        ValueError: an unknown kind, or one the pipeline does not train.
    """
    from tfhash.recipes import recommended

    recipe = recommended(kind)
    if kind not in PIPELINE_RECIPES:
        raise ValueError(f"training.recipe {kind!r} is for fixed feature vectors (python -m benchmarks.peers); the "
                         f"pipeline takes {PIPELINE_RECIPES}: for single-label images set method and backbone instead")  # fmt: skip
    return recipe


def resolve_training_paths(training: dict, base: Path) -> dict:
    """``training`` with a relative encoder path (``backbone``) and weights file resolved against
    ``base`` (the config file's folder)."""
    from tfhash.models.backbones import IMAGENET, is_encoder_path

    training = dict(training)
    backbone, weights = training.get("backbone"), training.get("backbone_weights")
    if isinstance(backbone, str) and is_encoder_path(backbone):
        training["backbone"] = resolve_path(base, backbone)
    if isinstance(weights, str) and weights not in (IMAGENET, "none"):
        training["backbone_weights"] = resolve_path(base, weights)
    return training


@dataclass
class PipelineConfig:
    """A pipeline run: data, training, blessing, serving and index settings.

    Paths are relative to the config file's folder unless absolute; ``run_dir`` holds the data
    export, the pipeline root, the ML Metadata SQLite file, the serving base directory and the
    indexes.
    """

    name: str
    dataset: str = "mnist"
    data_root: str | None = None
    data_dir: str | None = None  # already exported TFRecords (tfhash data export / export-user) instead of `dataset`
    split_seed: int = 0
    limit: int | None = None  # examples per split, for small runs
    modality: str = "image"
    modalities: list[str] = field(default_factory=list)  # two names for a cross-modal method (jcch)
    run_dir: str = DEFAULT_RUN_DIR
    training: TrainingConfig = field(default_factory=TrainingConfig)
    map_threshold: float = 0.5
    max_regression: float = 0.01
    index_kinds: list[str] = field(default_factory=lambda: ["BFlat"])
    milvus_uri: str | None = None  # the Milvus of the "Milvus" index kind: a server URI, or a Milvus Lite file (default: in run_dir)
    jcch_anchors: int | None = None  # anchors of the JCCH coefficients computed in Transform (None: off)
    bad_records: str = "fail"  # RecordFilter policy: "fail" stops the run on any bad record, "drop" leaves them out
    beam_args: list[str] = field(default_factory=lambda: ["--direct_running_mode=in_memory", "--direct_num_workers=1"])
    image: str = "tfhash-pipeline:latest"  # container image named in the Kubeflow JSON

    def __post_init__(self) -> None:
        if isinstance(self.training, dict):
            known = {f.name for f in fields(TrainingConfig)}
            unknown = set(self.training) - known
            if unknown:
                raise ValueError(f"unknown training settings {sorted(unknown)}")
            self.training = TrainingConfig(**with_recipe(self.training))
        if not self.index_kinds:
            raise ValueError('index_kinds is empty; name at least one index type, e.g. ["BFlat"]')
        if not isinstance(self.index_kinds, list) or not all(isinstance(kind, str) for kind in self.index_kinds):
            raise ValueError(f'index_kinds must be a list of index type names, e.g. ["BFlat", "Milvus"], got {self.index_kinds!r}')
        for kind in self.index_kinds:
            parse_index_type(kind)  # an unknown or misspelt type fails here, before any training
        if self.milvus_uri is not None and (not isinstance(self.milvus_uri, str) or not self.milvus_uri.strip()):
            raise ValueError(f"milvus_uri must be a Milvus server address such as http://milvus:19530 or a Milvus Lite "
                             f"file such as runs/milvus.db (or absent: the run's own Lite file), got {self.milvus_uri!r}")  # fmt: skip
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
        input_dropout = self.training.optimisation().input_dropout
        rates = input_dropout if isinstance(input_dropout, dict) else {name: input_dropout for name in self.inputs}
        if set(rates) - set(self.inputs):
            raise ValueError(f"training.fine_tuning.input_dropout names {sorted(set(rates) - set(self.inputs))}; "
                             f"this run's inputs are {self.inputs}")  # fmt: skip
        if any(rates.values()) and self.training.backbone != "mlp":
            raise ValueError(f"training.fine_tuning.input_dropout is for the mlp backbone, not {self.training.backbone!r}")

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

    @classmethod
    def load(cls, path: str | os.PathLike) -> PipelineConfig:
        """Read a JSON config; relative paths resolve against its folder.

        Raises:
            ValueError: unreadable file, unknown keys or invalid values (the message says which).
        """
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: cannot read the pipeline config ({err})") from err
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"{path}: unknown settings {sorted(unknown)}")
        base = path.resolve().parent
        if isinstance(raw.get("training"), dict):
            raw["training"] = resolve_training_paths(raw["training"], base)
        config = cls(**raw)
        for key in ("run_dir", "data_root", "data_dir"):
            setattr(config, key, resolve_path(base, getattr(config, key)))
        if config.milvus_uri and is_local(config.milvus_uri):  # a Milvus Lite file, relative to the config
            config.milvus_uri = resolve_path(base, config.milvus_uri)
        return config

    def to_dict(self) -> dict:
        return asdict(self)
