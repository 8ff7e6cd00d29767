"""Trainer module file: ``run_fn`` builds a tfhash method from the run config, trains it under a
tf.distribute strategy and exports the serving SavedModel (on the chief only)."""

from __future__ import annotations

import json
import logging
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
from tfhash.components.export import IMAGE_RANGE, export_serving_model
from tfhash.components.preprocessing import LABELS

logger = logging.getLogger(__name__)


def cluster_spec() -> dict:
    """The parsed TF_CONFIG (empty when unset)."""
    return json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")


def is_multi_worker(config: dict | None = None) -> bool:
    config = cluster_spec() if config is None else config
    cluster = config.get("cluster", {})
    return sum(len(v) for k, v in cluster.items() if k in ("chief", "worker")) > 1


def is_chief(config: dict | None = None) -> bool:
    """True without a cluster; in a cluster, for the ``chief`` task, or worker 0 when no chief."""
    config = cluster_spec() if config is None else config
    if not config.get("cluster"):
        return True
    task = config.get("task", {})
    if "chief" in config["cluster"]:
        return task.get("type") == "chief"
    return task.get("type") == "worker" and int(task.get("index", 0)) == 0


def make_strategy():
    """MultiWorkerMirroredStrategy when TF_CONFIG names a cluster of several workers, else
    MirroredStrategy (all local devices)."""
    if is_multi_worker():
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.MirroredStrategy()


def export_directory(serving_model_dir: str) -> str:
    """Where this task exports: the real directory on the chief, a throw-away one elsewhere
    (every worker must run the save for collective ops, only the chief's copy is kept)."""
    if is_chief():
        return serving_model_dir
    return tempfile.mkdtemp(prefix="tfhash-worker-export-")


def backbone_for(training: dict, shape, name: str = "backbone", data_root=None, modality: str | None = None):
    """The configured backbone for inputs of ``shape``: an image network or encoder
    (:func:`tfhash.models.image_backbone`, fed the decoded images at their stored size), the small
    CNN (images) or an MLP (vectors; the fine-tuning recipe's dropout and ``modality``'s input
    dropout).

    Raises:
        BackboneError: an image backbone for feature vectors, or as :func:`image_backbone` does.
    """
    from tfhash.models import BackboneError, image_backbone, mlp, small_cnn

    backbone = training["backbone"]
    if backbone == "small_cnn":
        return small_cnn(tuple(shape), name=name)
    recipe = training_recipe(training)
    if backbone == "mlp":
        return mlp(int(shape[0]), tuple(training["hidden"]), name=name, **recipe.mlp_options(modality))
    if len(shape) not in (2, 3):
        raise BackboneError(f"backbone {backbone!r} takes images, but this input holds vectors of shape {list(shape)}; use mlp")
    return image_backbone(backbone, shape, size=training.get("image_size"), weights=training.get("backbone_weights"),
                          data_root=data_root, name=name, **recipe.backbone_options())  # fmt: skip


def training_recipe(training: dict):
    """The run's :class:`tfhash.fine_tuning.FineTuning`: the backbone's defaults updated by the
    config's ``fine_tuning``."""
    from tfhash.fine_tuning import FineTuning

    return FineTuning.for_backbone(training["backbone"], **training.get("fine_tuning", {}))


def use_mixed_precision(training: dict) -> bool:
    """``mixed_precision`` "on", or "auto" with a GPU present."""
    setting = training.get("mixed_precision", "auto")
    return setting == "on" or (setting == "auto" and bool(tf.config.list_physical_devices("GPU")))


def batch_size(training: dict) -> int:
    """``gpu_batch_size`` when a GPU is present and it is set, else ``batch_size``."""
    if training.get("gpu_batch_size") and tf.config.list_physical_devices("GPU"):
        return int(training["gpu_batch_size"])
    return int(training["batch_size"])


def build_model(training: dict, inputs: dict, num_classes: int, tag_statistics: tuple | None = None, data_root=None):
    """A library model from the run config's ``training`` section; ``inputs``: ``{name: shape}``
    (two entries for the cross-modal jcch: one tower each, shared centres).

    ``tag_statistics``: ``(n, C x C co-occurrence)`` of the training labels (from Transform); the
    proxy methods need it: on multi-label data the balanced BCE takes its tag frequencies, and
    sHCLM assigns proxies by tag co-occurrence (HCLM Eq. 21).

    Raises:
        ValueError: sHCLM without tag statistics, or on single-label data (co-occurrence carries no
            class similarity there; use hclm, or sHCLM in code with class-mean backbone features).
    """
    from tfhash.models import build_hclm, build_hyp2, build_jcch, build_scdh
    from tfhash.proxies import cooccurrence_similarity, hclm_proxies

    if training["method"] == "jcch":
        backbones = {name: backbone_for(training, shape, f"backbone_{name}", data_root, name) for name, shape in inputs.items()}
        return build_jcch(backbones, num_classes, int(training["bits"]), preset=training.get("preset"),
                          seed=int(training.get("seed", 0)), **dict(training.get("overrides", {})))  # fmt: skip
    ((name, shape),) = inputs.items()
    backbone = backbone_for(training, shape, data_root=data_root, modality=name)
    method, bits, overrides = training["method"], int(training["bits"]), dict(training.get("overrides", {}))
    if method in ("scdh", "scdh-s"):
        return build_scdh(backbone, num_classes, bits, preset=training.get("preset"), ablation=method == "scdh-s", **overrides)
    if method in ("hclm", "shclm"):
        similarity, frequencies = None, None
        if tag_statistics is not None:
            n, cooccurrence = tag_statistics
            counts = np.diag(cooccurrence)
            multi_label = bool(np.any(cooccurrence - np.diag(counts) > 0))  # some example has two tags
            frequencies = counts / max(n, 1) if multi_label else None
            if method == "shclm":
                if not multi_label:
                    raise ValueError("shclm in the pipeline assigns proxies by tag co-occurrence, which needs multi-label "
                                     "data; this training split is single-label: use method hclm")  # fmt: skip
                similarity = cooccurrence_similarity(cooccurrence)
        elif method == "shclm":
            raise ValueError("shclm needs the tag statistics computed by Transform")
        proxies = hclm_proxies(num_classes, bits, similarity=similarity, seed=int(training["seed"]))
        return build_hclm(backbone, num_classes, bits, proxies=proxies, tag_frequencies=frequencies, **overrides)
    return build_hyp2(backbone, num_classes, bits, **overrides)


def read_transform_tag_statistics(transform_output, num_classes: int) -> tuple[int, np.ndarray]:
    """The Transform's tag statistics vocabularies, read back (see :mod:`.label_statistics`)."""
    from tfhash.components.label_statistics import TAG_COUNTS, TAG_PAIRS, read_tag_statistics

    return read_tag_statistics(transform_output.vocabulary_file_by_name(TAG_COUNTS),
                               transform_output.vocabulary_file_by_name(TAG_PAIRS), num_classes)  # fmt: skip


def _glob(patterns) -> list[str]:
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    return sorted(f for p in patterns for f in tf.io.gfile.glob(p))


def targets(features: dict, label_coefficients: bool):
    """The fit target: the multi-hot labels, or labels with the JCCH q / u from Transform."""
    if label_coefficients:
        return {"labels": features[LABELS], "q": features["jcch_q"], "u": features["jcch_u"]}
    return features[LABELS]


def count_records(file_pattern) -> int:
    """The number of records in the (GZIP) files of ``file_pattern``."""
    return int(sum(1 for _ in tf.data.TFRecordDataset(_glob(file_pattern), compression_type="GZIP")))


def _dataset(file_pattern, feature_spec, input_names: list[str], batch_size: int, shuffle: bool, seed: int,
             label_coefficients: bool = False):  # fmt: skip
    files = _glob(file_pattern)
    data = tf.data.TFRecordDataset(files, compression_type="GZIP")
    if shuffle:
        data = data.shuffle(10_000, seed=seed, reshuffle_each_iteration=True)
    data = data.batch(batch_size).map(lambda records: tf.io.parse_example(records, feature_spec))

    def model_inputs(features):
        return features[input_names[0]] if len(input_names) == 1 else {name: features[name] for name in input_names}

    return data.map(lambda f: (model_inputs(f), targets(f, label_coefficients))).prefetch(tf.data.AUTOTUNE)


def warmup_records(config: dict, count: int = 4) -> list[bytes]:
    """The first ``count`` usable raw training records (the RecordFilter's check), to replay as TF
    Serving warmup requests: a bad record there would make TF Serving refuse to load the model."""
    from tfhash.components.record_validation import record_problem

    if not config.get("raw_examples_dir"):
        return []
    found = []
    for path in _glob(os.path.join(config["raw_examples_dir"], "train", "*")):
        for record in tf.data.TFRecordDataset(path, compression_type="GZIP"):
            if record_problem(record.numpy(), int(config["num_classes"]), config["modalities"]) is None:
                found.append(record.numpy())
                if len(found) == count:
                    return found
    return found


def run_fn(fn_args) -> None:
    """TFX Trainer entry point. ``fn_args.custom_config``: ``training`` (the run config's
    section), ``inputs`` (model input name -> shape), ``num_classes``, ``modalities`` and
    ``raw_examples_dir`` (the exported data, whose first usable training records become the TF
    Serving warmup requests)."""
    from tfhash.fine_tuning import compile_fine_tuning

    config = fn_args.custom_config
    training = config["training"]
    keras.utils.set_random_seed(int(training["seed"]))
    if use_mixed_precision(training):
        keras.mixed_precision.set_global_policy("mixed_float16")
    transform_output = tft.TFTransformOutput(fn_args.transform_output)
    spec = transform_output.transformed_feature_spec()
    inputs = {name: list(shape) for name, shape in config["inputs"].items()}
    batch = batch_size(training)
    train = _dataset(fn_args.train_files, spec, list(inputs), batch, True, int(training["seed"]),
                     bool(training.get("label_coefficients")))  # fmt: skip
    epochs = int(training["epochs"])
    steps_per_epoch = max(1, -(-count_records(fn_args.train_files) // batch))
    strategy = make_strategy()
    try:
        with strategy.scope():
            statistics = read_transform_tag_statistics(transform_output, int(config["num_classes"])) if training["method"] in ("hclm", "shclm") else None
            model = build_model(training, inputs, int(config["num_classes"]), statistics, config.get("data_root"))
            recipe = training_recipe(training).scaled_to_batch(batch / int(training["batch_size"]))
            compile_fine_tuning(model, recipe, epochs, steps_per_epoch)
        callbacks = [keras.callbacks.TensorBoard(log_dir=fn_args.model_run_dir)] if fn_args.model_run_dir else []
        model.fit(train, epochs=epochs, verbose=2, callbacks=callbacks)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    warmup = warmup_records(config) or None
    image_inputs = [name for name in inputs if config["modalities"][name]["kind"] == "image"]
    export_serving_model(model, transform_output, inputs, int(training["bits"]), export_directory(fn_args.serving_model_dir),
                         warmup_examples=warmup, value_ranges={name: IMAGE_RANGE for name in image_inputs},
                         image_inputs=image_inputs)  # fmt: skip
