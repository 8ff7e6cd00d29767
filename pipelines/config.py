"""One typed config file describes a pipeline run (JSON).

A config is checked completely when it is read, before TensorFlow or TFX load: unknown keys (with
the nearest known key suggested), values of the wrong type or range, a backbone, its weights file
and the data folders that do not exist. :meth:`PipelineConfig.load` names the file in every
message. Each key documents itself beside its default (:func:`config_key`); :func:`key_table` makes the
pipeline page's table of them (docs/pipeline.md), which a test checks.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from tfhash import storage
from tfhash.artifacts import DEFAULT_RUN_DIR, RunLayout, read_data_description
from tfhash.config_keys import REQUIRED, check_count, check_keys, config_key, suggestion
from tfhash.index.factory import parse_index_type
from tfhash.index.milvus import MilvusIndex, is_local
from tfhash.recipes import with_recipe
from tfhash.registry import get_method, method_names
from tfhash.training_spec import PHOTOS, PIPELINE_KINDS, TrainingSpec

__all__ = ["PipelineConfig", "key_table"]


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

    kind: str | None = config_key(None, "the search space: `multi-label` or `cross-modal` for feature vectors "
                           "(`tfhash.tuning.SEARCH_SPACES`), `single-label photos` for an image network above its trunk "
                           "cache (`tfhash.tuning.PhotoSpace`); null: from the backbone, labels and modalities")
    max_units: int = config_key(9, "Hyperband's top fidelity: a trial of u units trains u / max_units of its recipe's epochs")
    factor: int = config_key(3, "Hyperband's reduction factor (1 / factor of the trials go on to the next rung)")
    trials: int | None = config_key(None, "start no trial after this many (null: Hyperband's whole schedule)")
    seconds: float | None = config_key(None, "start no trial after this wall time (null: no limit)")
    train_in_database: float = config_key(0.5, "the share of the validation database drawn from the rows trained on: your "
                                   "catalogue's (the items trained on themselves: up to 0.9; mostly unseen items: low)")

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in (*PIPELINE_KINDS, PHOTOS):
            raise ValueError(f"tuner.kind must be one of {[*PIPELINE_KINDS, PHOTOS]} or null, got {self.kind!r}"
                             f"{suggestion(self.kind, (*PIPELINE_KINDS, PHOTOS))}")  # fmt: skip
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
    training: TrainingSpec = config_key(TrainingSpec, "the training section (keys `training.*` below)")
    map_threshold: float = config_key(0.5, "bless a model when its mAP@all reaches this")
    max_regression: float = config_key(0.01, "and when it is at most this below the model serving now's (the newest pushed "
                                       "version's)")
    index_kinds: list[str] = config_key(lambda: ["BFlat"], "the indexes built for the pushed model (`BFlat`, `BMIH`, `BIVF<n>`, "
                                 "`BMultiHash<n>`, `ScaNN`, `ScaNNBrute`, `Milvus`)")
    index_embeddings: bool = config_key(True, "store each item's 8-bit embedding beside its codes, for the second stage of a "
                                        "search (8 bytes per code byte); false: the service answers in Hamming order only")
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
        if not isinstance(self.training, TrainingSpec):
            self.training = TrainingSpec.from_dict(with_recipe(self.training) if isinstance(self.training, dict) else self.training)
        if self.training.method not in method_names(in_pipeline=True):
            raise ValueError(f"training.method {self.training.method!r}: the pipeline trains {method_names(in_pipeline=True)} "
                             "(the others need unlabelled rows or the training set's row index; train them with "
                             f"tfhash.recipes.Recipe){suggestion(self.training.method, method_names(in_pipeline=True))}")  # fmt: skip
        if isinstance(self.tuner, dict):
            check_keys(self.tuner, [f.name for f in fields(TunerConfig)], "tuner.")
            self.tuner = TunerConfig(**self.tuner)
        elif self.tuner is not None and not isinstance(self.tuner, TunerConfig):
            raise ValueError(f"tuner must be an object of tuner settings or null, got {self.tuner!r}")
        if self.tuner is not None:
            self._check_tuner()
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
        if not isinstance(self.index_embeddings, bool):
            raise ValueError(f"index_embeddings must be true or false, got {self.index_embeddings!r}")
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
        self.training.towers(self.inputs)  # the per-tower settings name this run's inputs

    def _check_tuner(self) -> None:
        """The tuner's kind fits the training section: feature kinds for the mlp backbone, photos for
        an image network trained above a trunk cache (every trial reads the one cache)."""
        training, kind = self.training, self.tuner.kind
        if training.backbone == "mlp":
            if kind == PHOTOS:
                raise ValueError(f"tuner.kind {PHOTOS!r} searches image recipes; backbone mlp trains feature vectors: choose "
                                 f"one of {list(PIPELINE_KINDS)} or null")  # fmt: skip
        elif training.backbone == "small_cnn" or training.fine_tuning.trunk_cache is None or kind not in (None, PHOTOS):
            raise ValueError(f"tuner chooses among recipes for feature vectors (the mlp backbone), or for photos (kind "
                             f"{PHOTOS!r}: a pretrained image network with training.fine_tuning.trunk_cache set); got backbone "
                             f"{training.backbone!r}, trunk_cache {training.fine_tuning.trunk_cache}, kind {kind!r}: drop the "
                             "tuner, train on features, or set a trunk cache")  # fmt: skip

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
        return {name: tower.input_map for name, tower in self.training.towers(self.inputs).items()}

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
    for prefix, cls in (("", PipelineConfig), ("training.", TrainingSpec), ("tuner.", TunerConfig)):
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
