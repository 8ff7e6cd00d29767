"""Training a tfhash model on several workers (``tf.distribute.MultiWorkerMirroredStrategy``).

Keras 3's ``Model.fit`` does not run under MultiWorkerMirroredStrategy (TF 2.16, Keras 3.12):
before the first step it reduces a batch of input data across the workers, and at every step it
reduces the scalar logs with ``axis=0``; both fail (keras-team/keras#20585). :func:`fit_distributed`
is the same training without those two reductions: the model's own ``train_step`` runs on every
replica through ``strategy.run`` (the optimizer sums the gradients across workers, as in ``fit``,
and tfhash's losses divide by the number of replicas), and the logs are reduced as scalars. It
takes Keras callbacks and returns a ``History``, like ``fit``.
"""

from __future__ import annotations

import keras
import tensorflow as tf

__all__ = ["fit_distributed"]


def _local(value):
    """This worker's first local value of a distributed value (a batch to build the model with)."""
    if isinstance(value, tf.distribute.DistributedValues):
        return tf.distribute.get_strategy().experimental_local_results(value)[0]
    return value


def fit_distributed(model: keras.Model, dataset: tf.data.Dataset, epochs: int, callbacks=None,
                    verbose: int = 0) -> keras.callbacks.History:  # fmt: skip
    """Train a compiled ``model``, built and compiled under ``strategy.scope()``, for ``epochs``
    passes over ``dataset`` (batches of the *global* batch size; the strategy shards them over
    the workers).

    Every worker must call this with the same dataset and epochs (collective ops). Returns the
    ``History`` of the per-epoch means of the logs, reduced over the workers.

    Raises:
        ValueError: a model that is not compiled, or non-positive ``epochs``.
    """
    if not model.compiled:
        raise ValueError("fit_distributed needs a compiled model; call model.compile(...) under strategy.scope() first")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive int, got {epochs!r}")
    from tfhash.models.training import TrainingMixin

    if isinstance(model, TrainingMixin):  # the checks fit applies: finite features, labels normalised
        dataset = model.checked_dataset(dataset)
    strategy = model.distribute_strategy
    first = next(iter(dataset))
    x = first[0] if isinstance(first, tuple) else first
    with strategy.scope():
        if not model.built:
            model(x, training=False)  # variables are created under the strategy, on every worker
        model.optimizer.build(model.trainable_variables)
    distributed = strategy.experimental_distribute_dataset(dataset)

    @tf.function
    def step(batch):
        logs = strategy.run(model.train_step, args=(batch,))
        return {name: strategy.reduce("MEAN", value, axis=None) for name, value in logs.items()}

    callback_list = keras.callbacks.CallbackList(callbacks, add_history=True, add_progbar=verbose != 0, model=model,
                                                 epochs=epochs, steps=None, verbose=verbose)  # fmt: skip
    model.stop_training = False
    callback_list.on_train_begin()
    logs = {}
    for epoch in range(epochs):
        model.reset_metrics()
        callback_list.on_epoch_begin(epoch)
        for number, batch in enumerate(distributed):
            callback_list.on_train_batch_begin(number)
            logs = step(batch)
            callback_list.on_train_batch_end(number, logs)
        logs = {name: float(value) for name, value in logs.items()}
        callback_list.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    callback_list.on_train_end(logs)
    return model.history
