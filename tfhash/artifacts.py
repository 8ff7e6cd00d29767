"""The contract between tfhash's stages: what one stage writes and the next one reads.

The stages (the pipeline's components, the pipeline runner, the serving side, the benchmarks) never
import each other; each imports this module for the names and layouts they share: the records'
schema, ``items.csv``, the signatures, the codes in the graph, the fingerprint that pairs a
SavedModel with its index, and the index and run layouts (``docs/architecture.md``).

The code convention itself (sign, bit order) is stated once, in :mod:`tfhash.codes`. TensorFlow is
imported only by the functions that build graph pieces, so the names cost nothing to import.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

from tfhash import storage

__all__ = [
    "ITEMS_FILE",
    "Item",
    "read_items",
    "write_items",
    "join_labels",
    "split_labels",
    "signature_fingerprint",
    "verify_saved_model",
    "model_version_dir",
    "list_versions",
    "index_dir",
    "RunLayout",
    "DATA_DESCRIPTION_FILE",
    "read_data_description",
    "model_inputs",
    "EXAMPLES_SIGNATURE",
    "FEATURES_SIGNATURE",
    "PIXELS_SIGNATURE",
]

# --- records -------------------------------------------------------------------------------------

#: Feature of every record: the row's int64 id.
ID = "id"
#: Feature of every record: the int64 list of the row's label indices (empty when unlabelled).
LABELS = "labels"
#: The record features that are not model inputs (never needed to encode).
NOT_MODEL_INPUTS = (ID, LABELS)
#: The pipeline's splits, each a folder of gzipped TFRecord files.
SPLITS = ("train", "query", "database")
#: A modality is an image (one encoded PNG / JPEG) or a vector (fixed-length float list).
IMAGE, VECTOR = "image", "vector"


def label_spec() -> dict:
    """Parse spec of the id and the labels of a record."""
    import tensorflow as tf

    return {LABELS: tf.io.VarLenFeature(tf.int64), ID: tf.io.FixedLenFeature([1], tf.int64)}


def modality_spec(kind: str, shape):
    """Parse spec of one modality's feature: an image's encoded bytes, or a vector's floats."""
    import tensorflow as tf

    if kind == IMAGE:
        return tf.io.FixedLenFeature([], tf.string)
    if kind == VECTOR:
        return tf.io.FixedLenFeature([int(s) for s in shape], tf.float32)
    raise ValueError(f"modality kind {kind!r} is neither {IMAGE!r} nor {VECTOR!r}")


# --- the data's description ------------------------------------------------------------------

#: The file beside the exported splits that describes them (``tfhash data export``, ``export-user``):
#: ``num_classes``, ``class_names``, ``modalities`` (each one's ``kind`` and ``shape``), the split.
#: The pipeline's components read it when they run, so compiling a pipeline reads no data.
DATA_DESCRIPTION_FILE = "metadata.json"


def read_data_description(data_dir: str) -> dict:
    """The description of the data exported to ``data_dir`` (a folder or a URI).

    Raises:
        ValueError: no description there (the message names the folder and the commands that
            write one), or one that is not a JSON object with ``num_classes`` and ``modalities``.
    """
    path = storage.join(data_dir, DATA_DESCRIPTION_FILE)
    try:
        description = storage.read_json(path)
    except FileNotFoundError as err:
        raise ValueError(f"data_dir {data_dir!r} holds no {DATA_DESCRIPTION_FILE}: write the folder with `tfhash data "
                         "export-user` (your own data) or `tfhash data export` first") from err  # fmt: skip
    except ValueError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(description, dict) or not {"num_classes", "modalities"} <= set(description):
        raise ValueError(f"{path}: not a description of exported data (no num_classes and modalities); export the data again")
    return description


def model_inputs(description: dict, names: list[str]) -> dict[str, list[int]]:
    """``{modality: shape}`` of the model inputs ``names`` in the exported data's ``description``.

    Raises:
        ValueError: a name the data has no modality of.
    """
    missing = [name for name in names if name not in description["modalities"]]
    if missing:
        raise ValueError(f"the exported data has no modality {missing}; it has {sorted(description['modalities'])}: set the "
                         "config's modality (or modalities) to those names, or export the data with them")  # fmt: skip
    return {name: list(description["modalities"][name]["shape"]) for name in names}


# --- items ---------------------------------------------------------------------------------------

#: The file beside the exported records that names every item: columns ``id,path,labels``.
ITEMS_FILE = "items.csv"
ITEM_COLUMNS = ("id", "path", "labels")
#: Separator of an item's class names in one text cell (``items.csv``, a user's labels file or
#: image list, the search service's answers).
ITEM_LABEL_SEPARATOR = ";"


def join_labels(names) -> str:
    """An item's class names as one text cell."""
    return ITEM_LABEL_SEPARATOR.join(names)


def split_labels(text: str) -> tuple[str, ...]:
    """The class names of one text cell (:func:`join_labels`), blanks around them dropped."""
    return tuple(name.strip() for name in text.split(ITEM_LABEL_SEPARATOR) if name.strip())


@dataclass(frozen=True)
class Item:
    """Where an exported item came from: its file (relative to the exported folder or list;
    empty for feature rows) and its class names."""

    path: str
    labels: tuple[str, ...]


def write_items(path: str | os.PathLike, items: dict[int, Item]) -> None:
    """Write ``items.csv`` (sorted by id).

    The file lies beside the exported records and gives each id's source file and class names,
    which the search service reads to name its answers.
    """
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(ITEM_COLUMNS)
    for item_id in sorted(items):
        writer.writerow([item_id, items[item_id].path, join_labels(items[item_id].labels)])
    storage.write_text(path, text.getvalue())


def read_items(path: str | os.PathLike) -> dict[int, Item]:
    """``{id: Item}`` of an ``items.csv``.

    Raises:
        ValueError: a file without the header ``id,path,labels`` or with a row that is not
            ``<integer id>,<path>,<labels>`` (naming the line).
    """
    rows = list(csv.reader(io.StringIO(storage.read_text(path), newline="")))
    if not rows or tuple(rows[0]) != ITEM_COLUMNS:
        raise ValueError(f"{path}: an items file starts with the header {','.join(ITEM_COLUMNS)}")
    items = {}
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != 3 or not row[0].lstrip("-").isdigit():
            raise ValueError(f"{path}, line {line}: expected <id>,<path>,<labels>; got {row!r}")
        items[int(row[0])] = Item(row[1], split_labels(row[2]))
    return items


# --- signatures ----------------------------------------------------------------------------------

#: Serialized raw tf.Examples -> codes (TF Serving's default signature name,
#: ``tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY``).
EXAMPLES_SIGNATURE = "serving_default"
#: The model input as a float tensor -> codes.
FEATURES_SIGNATURE = "encode_features"
#: Raw ``uint8`` pixels -> codes (image models only).
PIXELS_SIGNATURE = "encode_pixels"
#: Input names of the examples and pixels signatures (the features signature's input is named
#: after the model input).
EXAMPLES_INPUT, PIXELS_INPUT = "examples", "pixels"
#: Outputs of every signature: continuous float32 codes, int8 +-1 codes, packed uint8 codes.
CODES, BINARY_CODES, PACKED_CODES = "codes", "binary_codes", "packed_codes"


def examples_signature(modality: str | None = None) -> str:
    """The examples signature of ``modality`` of a cross-modal model (None: the default one)."""
    return f"serving_{modality}" if modality else EXAMPLES_SIGNATURE


def features_signature(modality: str | None = None) -> str:
    """The features signature of ``modality`` of a cross-modal model (None: the default one)."""
    return f"encode_{modality}" if modality else FEATURES_SIGNATURE


def pixels_signature(modality: str | None = None) -> str:
    """The pixels signature of an image ``modality`` of a cross-modal model (None: the default)."""
    return f"{PIXELS_SIGNATURE}_{modality}" if modality else PIXELS_SIGNATURE


#: TF Serving warmup records inside a SavedModel version folder.
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


# --- codes in the graph --------------------------------------------------------------------------


def code_outputs(codes, bits: int) -> dict:
    """The three outputs of a signature from ``(n, K)`` continuous codes, with stock ops: ``codes``,
    ``binary_codes`` (int8, sign(0) = +1) and ``packed_codes`` (uint8, first bit in the most
    significant position), as :func:`tfhash.codes.sign_codes` and :func:`tfhash.codes.pack_codes`."""
    import tensorflow as tf

    binary = tf.where(codes >= 0.0, tf.ones_like(codes, tf.int8), -tf.ones_like(codes, tf.int8))
    bits_by_byte = tf.reshape(tf.cast(codes >= 0.0, tf.int32), [-1, bits // 8, 8])
    weights = tf.constant([128, 64, 32, 16, 8, 4, 2, 1], dtype=tf.int32)
    packed = tf.cast(tf.reduce_sum(bits_by_byte * weights, axis=-1), tf.uint8)
    return {CODES: codes, BINARY_CODES: binary, PACKED_CODES: packed}


# --- fingerprint ---------------------------------------------------------------------------------


def signature_fingerprint(saved_model_dir: str) -> str:
    """The SavedModel's fingerprint computed from its files as they are now: checksum of
    ``saved_model.pb`` and hash of the variables, so it changes with the graph or the weights, and
    a ``saved_model.pb`` that does not parse raises ValueError. Indexes record it; the search
    service and the TF Serving config compare it before they pair a model version with an index.
    (On a TensorFlow without the fingerprinting module, the fingerprint recorded at save time.)"""
    import tensorflow as tf

    try:
        from tensorflow.core.protobuf import fingerprint_pb2
        from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting
    except ImportError:
        fingerprint = tf.saved_model.experimental.read_fingerprint(saved_model_dir)
    else:
        try:
            fingerprint = fingerprint_pb2.FingerprintDef.FromString(fingerprinting.CreateFingerprintDef(saved_model_dir))
        except Exception as err:  # FingerprintException: unreadable or unparsable files
            raise ValueError(f"{saved_model_dir}: cannot fingerprint the SavedModel ({str(err).splitlines()[0]})") from err
    return f"{fingerprint.saved_model_checksum}-{fingerprint.checkpoint_hash}"


def verify_saved_model(saved_model_dir: str) -> str:
    """:func:`signature_fingerprint` after reading back every variable of the SavedModel: the
    fingerprint hashes ``saved_model.pb`` and the variables' index, not their data files, whose
    every tensor carries a CRC32C in that index that the read checks. Returns the fingerprint.

    Raises:
        ValueError: naming the folder and what does not read back (a truncated or altered data
            file, a missing one).
    """
    import tensorflow as tf

    fingerprint = signature_fingerprint(saved_model_dir)
    prefix = storage.join(saved_model_dir, "variables", "variables")
    if not storage.isfile(prefix + ".index"):
        return fingerprint  # a model without variables
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in sorted(reader.get_variable_to_shape_map()):
            reader.get_tensor(name)
    except Exception as err:  # OpError (a checksum), IndexError (a short read) ...
        raise ValueError(f"{saved_model_dir}: its variables do not read back whole ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
                         "the copy is damaged: push this version again") from err  # fmt: skip
    return fingerprint


# --- model versions and index layout -------------------------------------------------------------


def model_version_dir(model_base_dir: str, version: int | str) -> str:
    """A model version's SavedModel folder under a TF Serving model base directory."""
    return storage.join(model_base_dir, str(version))


def list_versions(base_path: str) -> list[int]:
    """The complete versions under ``base_path`` (a folder or a URI), ascending. A missing base path
    has none; an error reaching remote storage raises OSError (rather than look like no version).

    A version is a sub-directory whose name is a positive integer and that holds a ``saved_model.pb``
    (what ``tensorflow_model_server`` and the TFX Pusher agree on). A folder without that file (a push
    still being copied, a stray directory) is not a version yet.
    """
    found = set()
    for path in storage.glob(storage.join(base_path, "*", "saved_model.pb")):  # one listing, also of a bucket
        name = storage.basename(storage.parent(path))
        if name.isdigit() and int(name) > 0:
            found.add(int(name))
    return sorted(found)


def index_versions_dir(index_base_dir: str, version: int | str) -> str:
    """The folder of every index built for one model version."""
    return storage.join(index_base_dir, str(version))


def index_name(index_type: str, modality: str | None = None) -> str:
    """The folder name of an index: its type (e.g. ``BFlat``), plus ``-<modality>`` for the
    database of one modality of a cross-modal model."""
    return f"{index_type}-{modality}" if modality else index_type


def index_dir(index_base_dir: str, version: int | str, index_type: str, modality: str | None = None) -> str:
    """``<index base>/<model version>/<index type>[-<modality>]``: where the IndexBuilder writes an
    index and the search service looks for it."""
    return storage.join(index_versions_dir(index_base_dir, version), index_name(index_type, modality))


# --- run layout ----------------------------------------------------------------------------------

#: What each component writes into its output artifact's folder.
EVALUATION_FILE = "metrics.json"  # RetrievalEvaluator: metrics, blessing and its reason
RECORDS_REPORT_FILE = "report.json"  # RecordFilter: the bad records by split and reason
INDEXES_FILE = "indexes.json"  # IndexBuilder: model version, model folder, index paths
TRAINING_FILE = "training.json"  # Trainer (its model_run): the training section it trained, the Tuner's choice laid over
TUNER_CHOICE_FILE = "best_hyperparameters.txt"  # the stock Tuner: the best trial's KerasTuner hyperparameters (JSON)
TUNER_RESULTS_FILE = "tuner_results.json"  # the stock Tuner: the completed trials, best first


#: Where a pipeline config without ``run_dir`` puts its run (relative to the config file).
DEFAULT_RUN_DIR = "runs/pipeline"


@dataclass(frozen=True)
class RunLayout:
    """Every location a pipeline run uses under ``run_dir`` (``data_dir``: exported records
    elsewhere). ``name`` is the pipeline's name, which is also the served model's name.

    ``run_dir`` and ``data_dir`` may be URIs of remote storage (``gs://bucket/run``): every location
    under them is then a URI too, but for those that must be files of the machine that runs them
    (:attr:`metadata`, :attr:`trunk_cache`)."""

    run_dir: str
    name: str
    data_dir: str | None = None

    def _under(self, *parts: str) -> str:
        return storage.join(self.run_dir, *parts)

    @property
    def remote(self) -> bool:
        """Whether the run writes to remote storage (``run_dir`` is a URI)."""
        return storage.is_uri(self.run_dir)

    @property
    def data(self) -> str:
        return self.data_dir or self._under("data")

    @property
    def pipeline_root(self) -> str:
        return self._under("pipeline_root")

    @property
    def metadata(self) -> str:
        """The ML Metadata SQLite file of ``tfhash pipeline run``: in ``run_dir``, or for a remote
        one (SQLite needs a local file) in this machine's cache folder
        (:func:`tfhash.storage.cache_dir`) under a key of ``run_dir``."""
        if not self.remote:
            return self._under("metadata.sqlite")
        return os.path.join(storage.cache_dir("runs", f"{self.name}-{storage.key_of(self.run_dir.rstrip('/'))}"), "metadata.sqlite")

    @property
    def trunk_cache(self) -> str | None:
        """Where the Trainer keeps its trunk caches (:mod:`tfhash.trunk_cache`), one per key; None
        for a remote ``run_dir``: the caches are memory maps, which the Trainer then keeps in the
        cache folder of the machine it runs on."""
        return None if self.remote else self._under("trunk_cache")

    @property
    def serving(self) -> str:
        """The TF Serving model base directory (the Pusher's destination)."""
        return self._under("serving", self.name)

    @property
    def indexes(self) -> str:
        """The index base directory (the IndexBuilder's destination)."""
        return self._under("indexes", self.name)

    @property
    def milvus_lite(self) -> str:
        """The Milvus Lite file that holds the run's ``Milvus`` indexes when no server is configured
        (a local run directory only: a remote run's ``Milvus`` indexes need a Milvus server)."""
        return self._under("milvus", f"{self.name}.db")

    @property
    def tf_serving(self) -> str:
        """TF Serving's models.config and the deployment examples."""
        return self._under("tf_serving")

    @property
    def summary(self) -> str:
        return self._under("summary.json")

    @classmethod
    def from_config_file(cls, path: str | os.PathLike) -> RunLayout:
        """The layout of the run that a pipeline config file describes: its ``name``, ``run_dir``
        and ``data_dir`` (relative paths against the file's folder), the rest of the file unread.

        Raises:
            ValueError: the file cannot be read, or has no pipeline name.
        """
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: cannot read the pipeline config ({err})") from err
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
            raise ValueError(f"{path}: a pipeline config is a JSON object with a non-empty string 'name'")
        base = path.resolve().parent
        return cls(storage.resolve(base, raw.get("run_dir", DEFAULT_RUN_DIR)), raw["name"], storage.resolve(base, raw.get("data_dir")))
