"""TFX ``Tuner`` entry point: :mod:`tfhash.tuning`'s search on the transformed training rows.

The stock ``Tuner`` component calls :func:`tuner_fn`, runs the returned KerasTuner search, and
writes the best trial's hyperparameters (``best_hyperparameters``) and the completed trials
(``tuner_results``); the Trainer reads the hyperparameters and trains their recipe on every
training row (:func:`tfhash.components.trainer.tuned_training`). Only the training split is read:
the validation split is carved from it, never from the queries.
"""

from __future__ import annotations

import tensorflow_transform as tft
from tfhash.components.trainer import training_arrays
from tfx import v1 as tfx

from tfhash import storage
from tfhash.artifacts import read_data_description
from tfhash.labels import multi_hot
from tfhash.training_spec import TrainingSpec

__all__ = ["tuner_fn"]


#: Rows per read of the transformed records.
READ_BATCH = 1024


def tuner_fn(fn_args) -> tfx.components.TunerFnResult:
    """``fn_args.custom_config``: ``training`` (the run's bits and seed; for an image network the
    whole section, which photo trials start from),
    ``tuner`` (the config's ``tuner`` section), ``inputs`` (the model inputs' names) and
    ``data_dir`` (the exported data, whose description gives the number of classes),
    ``data_root`` (local ImageNet weights) and ``trunk_cache_dir`` (the run's trunk caches).

    Raises:
        tfhash.tuning.TuningError: as :func:`tfhash.tuning.prepare` (data of a kind the pipeline
            does not tune, too few labelled rows, ...).
    """
    from tfhash.tuning import Budget, prepare
    from tfhash.tuning.photos import prepare_photos
    from tfhash.tuning.tuner import RecipeTuner

    config = fn_args.custom_config
    training, settings = config["training"], config["tuner"]
    names = list(config["inputs"])
    num_classes = int(read_data_description(config["data_dir"])["num_classes"])
    schema = tft.TFTransformOutput(fn_args.transform_graph_path).transformed_metadata.schema
    arrays, labels = training_arrays(fn_args.data_accessor, fn_args.train_files, schema, names, READ_BATCH)
    if training.get("backbone", "mlp") != "mlp":  # photos: the image network above its trunk cache (the config checked it)
        task, default = prepare_photos(arrays[names[0]], multi_hot(labels, num_classes), TrainingSpec.from_dict(training),
                                       Budget.of(settings), cache_dir=config["trunk_cache_dir"] or storage.cache_dir("trunk_cache"),
                                       train_in_database=float(settings["train_in_database"]), data_root=config["data_root"])  # fmt: skip
    else:
        x = arrays if len(names) == 2 else arrays[names[0]].reshape(len(labels), -1)
        task, default = prepare(x, labels, int(training["bits"]), int(training["seed"]), Budget.of(settings), kind=settings["kind"],
                                in_pipeline=True, num_classes=num_classes,
                                train_in_database=float(settings["train_in_database"]))  # fmt: skip
    return tfx.components.TunerFnResult(tuner=RecipeTuner(task, default, fn_args.working_dir), fit_kwargs={})
