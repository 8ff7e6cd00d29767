"""Trainer module file: ``run_fn`` builds a tfhash method from the run config, trains it under a
tf.distribute strategy and exports the serving SavedModel (on the chief only)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
from tfx_bsl.public import tfxio

from tfhash import storage
from tfhash.artifacts import IMAGE, LABELS, TRAINING_FILE, model_inputs, read_data_description
from tfhash.export import IMAGE_RANGE, export_serving_model
from tfhash.registry import TagStatistics, build_model, get_method, make_backbone
from tfhash.training_spec import PHOTOS, TrainingSpec

__all__ = ["is_multi_worker", "is_chief", "make_strategy", "train", "export_directory", "tuned_training", "batch_size", "read_transform_tag_statistics", "targets", "training_arrays", "run_fn"]


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


def train(model, data, epochs: int, callbacks: list):
    """Train ``model``: ``fit`` on one machine; on several workers :func:`tfhash.distribute.fit_distributed`
    (Keras 3's ``fit`` does not run under MultiWorkerMirroredStrategy). Returns the History."""
    if is_multi_worker():
        from tfhash.distribute import fit_distributed

        return fit_distributed(model, data, epochs, callbacks, verbose=2)
    return model.fit(data, epochs=epochs, verbose=2, callbacks=callbacks)


def export_directory(serving_model_dir: str) -> str:
    """Where this task exports: the real directory on the chief, a throw-away one elsewhere
    (every worker must run the save for collective ops, only the chief's copy is kept)."""
    if is_chief():
        return serving_model_dir
    return tempfile.mkdtemp(prefix="tfhash-worker-export-")


def tuned_training(training: TrainingSpec, hyperparameters: dict, input_names: list[str]) -> TrainingSpec:
    """The spec the Tuner chose. Photos: the run's ``training`` with the chosen settings
    (:meth:`tfhash.tuning.PhotoSpace.spec`), as the trials trained it. Feature vectors: the recipe
    of the ``best_hyperparameters`` config (:func:`tfhash.tuning.tuned_recipe`,
    :meth:`tfhash.recipes.Recipe.spec` with its kind's loss preset), as the trials trained it: float32 at the recipe's batch, without JCCH coefficients; bits, seed and input map (the
    Transform's, which the trials saw) stay the run's ``training``."""
    import keras_tuner

    from tfhash.recipes import preset_for
    from tfhash.tuning import tuned_recipe

    values = keras_tuner.HyperParameters.from_config(hyperparameters).values
    if values["kind"] == PHOTOS:  # the image network's settings above its trunk cache, over the section's
        from tfhash.tuning import PhotoSpace

        return PhotoSpace().spec(values, training)
    recipe = tuned_recipe(values, tuple(input_names) if len(input_names) == 2 else ())
    return dataclasses.replace(recipe.spec(training.bits, training.seed, preset_for(values["kind"] == "multi-label")),
                               input_map=training.input_map, mixed_precision="off")  # fmt: skip


def dtype_policy(training: TrainingSpec) -> str:
    """The Keras dtype policy of the run's ``mixed_precision`` (:func:`tfhash.precision.precision_policy`)."""
    from tfhash.precision import precision_policy

    return precision_policy(training.mixed_precision, bool(tf.config.list_physical_devices("GPU")))


def batch_size(training: TrainingSpec) -> int:
    """``gpu_batch_size`` when a GPU is present and it is set, else ``batch_size``."""
    if training.gpu_batch_size and tf.config.list_physical_devices("GPU"):
        return training.gpu_batch_size
    return training.batch_size


def read_transform_tag_statistics(transform_output, num_classes: int) -> TagStatistics:
    """The Transform's tag statistics vocabularies, read back (see :mod:`.label_statistics`)."""
    from tfhash.components.label_statistics import TAG_COUNTS, TAG_PAIRS, read_tag_statistics

    count, cooccurrence = read_tag_statistics(transform_output.vocabulary_file_by_name(TAG_COUNTS),
                                              transform_output.vocabulary_file_by_name(TAG_PAIRS), num_classes)  # fmt: skip
    return TagStatistics(int(count), np.asarray(cooccurrence))


def targets(features: dict, label_coefficients: bool):
    """The fit target: the multi-hot labels, or labels with the JCCH q / u from Transform."""
    if label_coefficients:
        return {LABELS: features[LABELS], "q": features["jcch_q"], "u": features["jcch_u"]}
    return features[LABELS]


def _records(data_accessor, file_pattern, schema, batch_size: int, shuffle: bool, seed: int) -> tf.data.Dataset:
    """One pass over the transformed records of ``file_pattern`` in batches of parsed features,
    through TFX's data accessor (whatever the artifact's payload format)."""
    options = tfxio.TensorFlowDatasetOptions(batch_size=batch_size, num_epochs=1, shuffle=shuffle, shuffle_seed=seed)
    return data_accessor.tf_dataset_factory(file_pattern, options, schema)


def training_dataset(data_accessor, file_pattern, schema, input_names: list[str], batch_size: int, seed: int,
                     label_coefficients: bool = False) -> tuple[tf.data.Dataset, int]:  # fmt: skip
    """``(dataset, steps per epoch)``: batches of (model inputs, :func:`targets`) of the transformed
    training records, read through ``data_accessor`` (``fn_args.data_accessor``) with the
    transformed ``schema``; one pass per epoch, reshuffled each epoch from ``seed``. (The dataset
    does not state its length: with a stated length Keras draws the epochs' shuffles in another
    order, which would change the trained model.)"""
    steps = int(_records(data_accessor, file_pattern, schema, batch_size, False, seed).reduce(0, lambda n, _: n + 1))

    def model_inputs(features):
        return features[input_names[0]] if len(input_names) == 1 else {name: features[name] for name in input_names}

    data = _records(data_accessor, file_pattern, schema, batch_size, True, seed)
    return data.map(lambda f: (model_inputs(f), targets(f, label_coefficients))), max(1, steps)


def training_arrays(data_accessor, file_pattern, schema, input_names: list[str], batch_size: int) -> tuple[dict, np.ndarray]:
    """The transformed training records of ``file_pattern`` as arrays, in record order:
    ``{input name: array}`` of the model inputs ``input_names`` and the labels (what the trunk
    cache and the Tuner's trials are built from)."""
    inputs, labels = {name: [] for name in input_names}, []
    for features in _records(data_accessor, file_pattern, schema, batch_size, False, 0).as_numpy_iterator():
        for name in input_names:
            inputs[name].append(features[name])
        labels.append(features[LABELS])
    return {name: np.concatenate(parts) for name, parts in inputs.items()}, np.concatenate(labels)


def fit_cached(fn_args, schema, training: TrainingSpec, inputs: dict, num_classes: int, statistics, tuning, batch: int, policy: str,
               callbacks: list):  # fmt: skip
    """Train on a trunk cache (:func:`tfhash.trunk_cache.fit_on_cache`) kept in the run's
    ``trunk_cache_dir`` (null for a run on remote storage: this machine's cache folder,
    :func:`tfhash.storage.cache_dir`), built from one pass over the transformed training records
    (``schema``); returns the float32 model on raw images.

    Raises:
        tfhash.trunk_cache.CacheError: several workers (each would build its own cache), or as
            ``fit_on_cache`` does.
    """
    from dataclasses import replace

    from tfhash.trunk_cache import CacheError, fit_on_cache

    config = fn_args.custom_config
    if is_multi_worker():
        raise CacheError("training.fine_tuning.trunk_cache trains on one machine (the cache is a local file); "
                         "turn it off for multi-worker training")  # fmt: skip
    (name,) = inputs
    if tuning.trunk_cache.directory is None:
        directory = config.get("trunk_cache_dir") or storage.cache_dir("trunk_cache")
        tuning = replace(tuning, trunk_cache=replace(tuning.trunk_cache, directory=directory))
    arrays, labels = training_arrays(fn_args.data_accessor, fn_args.train_files, schema, [name], batch)
    images = arrays[name]
    seed, epochs = training.seed, training.epochs
    model, _, _ = fit_on_cache(
        tuning,
        build=lambda backbone: build_model(training, inputs, num_classes, statistics=statistics, backbone_model=backbone),
        make_backbone=lambda: make_backbone(training, inputs[name], data_root=config.get("data_root")),
        images=images, labels=labels, epochs=epochs, batch_size=batch, seed=seed, backbone_name=training.backbone,
        policy=policy, callbacks=callbacks)  # fmt: skip
    return model


def warmup_records(data_dir: str, description: dict, count: int = 4) -> list[bytes]:
    """The first ``count`` usable raw training records of the data exported to ``data_dir`` (the
    RecordFilter's check against the data's ``description``), to replay as TF Serving warmup
    requests: a bad record there would make TF Serving refuse to load the model."""
    from tfhash.components.record_validation import record_problem

    found = []
    for path in storage.glob(storage.join(data_dir, "train", "*")):
        for record in tf.data.TFRecordDataset(path, compression_type="GZIP"):
            if record_problem(record.numpy(), int(description["num_classes"]), description["modalities"]) is None:
                found.append(record.numpy())
                if len(found) == count:
                    return found
    return found


def run_fn(fn_args) -> None:
    """TFX Trainer entry point. ``fn_args.custom_config``: ``training`` (the run config's
    :class:`TrainingSpec`, ``to_dict``; with the Tuner's ``fn_args.hyperparameters``, the spec it
    chose, :func:`tuned_training`), ``inputs`` (the
    model inputs' names), ``data_dir`` (the exported data: its description gives the classes and
    the inputs' kinds and shapes, and its first usable training records become the TF Serving
    warmup requests), ``data_root`` and ``trunk_cache_dir``."""
    from tfhash.optimizers import compile_fine_tuning

    config = fn_args.custom_config
    training = TrainingSpec.from_dict(config["training"])
    description = read_data_description(config["data_dir"])
    modalities, num_classes = description["modalities"], int(description["num_classes"])
    raw_shapes = model_inputs(description, list(config["inputs"]))
    if fn_args.hyperparameters:  # the Tuner's choice
        training = tuned_training(training, fn_args.hyperparameters, list(config["inputs"]))
        logging.info("training the spec the Tuner chose: %s", json.dumps(training.to_dict()))
    keras.utils.set_random_seed(training.seed)
    policy = dtype_policy(training)
    transform_output = tft.TFTransformOutput(fn_args.transform_output)
    transformed = transform_output.transformed_feature_spec()
    # a vector's width is the Transform's output (an input map may change it: RBF features)
    inputs = {name: shape if modalities[name]["kind"] == IMAGE else list(transformed[name].shape)
              for name, shape in raw_shapes.items()}  # fmt: skip
    batch = batch_size(training)
    schema = transform_output.transformed_metadata.schema
    epochs = training.epochs
    strategy = make_strategy()
    tuning = training.fine_tuning.scaled_to_batch(batch / training.batch_size)
    needs_statistics = get_method(training.method).needs_tag_statistics
    statistics = read_transform_tag_statistics(transform_output, num_classes) if needs_statistics else None
    callbacks = []
    if fn_args.model_run_dir:
        callbacks.append(keras.callbacks.TensorBoard(log_dir=fn_args.model_run_dir))
        tf.io.gfile.makedirs(fn_args.model_run_dir)
        storage.write_json(storage.join(fn_args.model_run_dir, TRAINING_FILE), training.to_dict())  # what this run trained (the summary reads it)
    try:
        if tuning.trunk_cache is not None:
            with strategy.scope():
                model = fit_cached(fn_args, schema, training, inputs, num_classes, statistics, tuning, batch, policy, callbacks)
        else:
            train_data, steps_per_epoch = training_dataset(fn_args.data_accessor, fn_args.train_files, schema, list(inputs), batch,
                                                           training.seed, training.label_coefficients)  # fmt: skip
            keras.mixed_precision.set_global_policy(policy)
            with strategy.scope():
                model = build_model(training, inputs, num_classes, statistics=statistics, data_root=config.get("data_root"))
                compile_fine_tuning(model, tuning, epochs, steps_per_epoch)
            train(model, train_data, epochs, callbacks)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    warmup = warmup_records(config["data_dir"], description) or None
    image_inputs = [name for name in inputs if modalities[name]["kind"] == IMAGE]
    export_serving_model(model, transform_output, inputs, training.bits, export_directory(fn_args.serving_model_dir),
                         warmup_examples=warmup, value_ranges={name: IMAGE_RANGE for name in image_inputs},
                         image_inputs=image_inputs, mirrored_inputs=image_inputs if training.encode_mirrored else [],
                         raw_vectors={name: shape for name, shape in raw_shapes.items() if name not in image_inputs})  # fmt: skip
