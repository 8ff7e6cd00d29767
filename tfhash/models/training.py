"""How every tfhash model meets Keras's training conventions (:class:`TrainingMixin`).

Models take labels as users give them (class ids or one-hot / multi-hot), check their inputs
before and during training, stop when a step makes a weight non-finite, and compile the Keras way
while training with the method's own objective (:meth:`TrainingMixin.fit`,
:meth:`TrainingMixin.compile`).
"""

from __future__ import annotations

from typing import ClassVar

import keras
import numpy as np
import tensorflow as tf
from keras.src.utils.tracking import no_automatic_dependency_tracking

from tfhash.labels import multi_hot, rows_text
from tfhash.metrics.keras_metrics import METRIC_NAMES, PrecisionAtRadius
from tfhash.models.inputs import (
    WEIGHTS_MESSAGE,
    InputError,
    assert_finite_features,
    checked_features,
    is_dataset,
    readable_checks,
)

__all__ = ["assert_finite_weights", "TrainingMixin"]


#: The output every tfhash model returns its continuous codes under.
CODES = "codes"


def assert_finite_weights(variables) -> None:
    """Stop the step (InvalidArgumentError) when a variable holds NaN or infinity, naming the
    first such variable. Graph-safe: an assertion op, run after the optimizer step."""
    variables = list(variables)
    if not variables:
        return
    finite = tf.stack([tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(v))) for v in variables])
    first = tf.gather(tf.constant([v.path for v in variables]), tf.argmin(tf.cast(finite, tf.int32)))
    tf.debugging.Assert(tf.reduce_all(finite), [
        WEIGHTS_MESSAGE, first, "non-finite (NaN or infinity): lower the learning rate, check the "
        "inputs, or clip the gradients (e.g. keras.optimizers.Adam(1e-4, clipnorm=1.0))"])  # fmt: skip


def checked_sample_weight(sample_weight, rows: int):
    """``sample_weight`` as an ``(n,)`` float array of finite, non-negative weights, or None."""
    if sample_weight is None:
        return None
    weights = np.asarray(sample_weight, dtype=np.float64)
    if weights.shape not in ((rows,), (rows, 1)):
        raise InputError(f"sample_weight must have shape ({rows},), one weight per example; got {weights.shape}")
    weights = weights.reshape(-1)
    bad = np.flatnonzero(~np.isfinite(weights) | (weights < 0))
    if bad.size:
        raise InputError(f"sample_weight must be finite and >= 0; {rows_text(bad, rows)} are not")
    return weights.astype(np.float32)


def _rows(x) -> int:
    return len(next(iter(x.values()))) if isinstance(x, dict) else len(x)


class TrainingMixin:
    """Keras conventions shared by every tfhash model (see :meth:`fit` and :meth:`compile`). Put it
    first among the bases, before ``keras.Model``.

    Class attributes a model sets:
        accepts_unlabelled: rows without a label (all-zero, id -1) are unlabelled rows to train
            on (semi-supervised) instead of an error.
        class_scores: the output holding ``(n, C)`` class scores (``None``: the model has none).
        objective_name: the objective ``compute_loss`` implements, for messages.
    """

    accepts_unlabelled: ClassVar[bool] = False
    class_scores: ClassVar[str | None] = "logits"
    objective_name: ClassVar[str] = "the method's loss"

    # --- targets -------------------------------------------------------------------------------

    def normalised_targets(self, y, name: str = "y"):
        """``y`` with its labels as ``(n, C)`` float32 multi-hot (:func:`tfhash.labels.multi_hot`):
        arrays checked in NumPy, tensors in the graph. A dict of targets keeps its other entries
        (JCCH's ``q`` / ``u``, the pairwise model's ``index``), checked by :meth:`check_targets`."""
        if isinstance(y, dict):
            if "labels" not in y:
                raise ValueError(f"a target dict must hold 'labels' (and the model's other targets); got keys {sorted(y)}")
            y = {**y, "labels": multi_hot(y["labels"], self.num_classes, unlabelled=self.accepts_unlabelled,
                                          name=f"{name}['labels']")}  # fmt: skip
            self.check_targets(y, name)
            return y
        return multi_hot(y, self.num_classes, unlabelled=self.accepts_unlabelled, name=name)

    def check_targets(self, y: dict, name: str) -> None:
        """Check a target dict's entries besides the labels (NumPy arrays only): JCCH's label
        coefficients ``q`` / ``u`` must be finite and shaped like the labels."""
        for key in ("q", "u"):
            if key in y and not tf.is_tensor(y[key]):
                y[key] = checked_features(y[key], f"{name}[{key!r}]").astype(np.float32)
                if y[key].shape != y["labels"].shape:
                    raise InputError(f"{name}[{key!r}] must have the labels' shape {y['labels'].shape}; got {y[key].shape}")

    def unpack_targets(self, y):
        """``(labels, q, u)`` of a batch's targets inside ``compute_loss``, the labels normalised
        in the graph (class ids of a custom training loop become multi-hot here)."""
        y = self.normalised_targets(y)
        if isinstance(y, dict):
            return y["labels"], y.get("q"), y.get("u")
        return y, None, None

    # --- data entering fit / evaluate ----------------------------------------------------------

    def checked_dataset(self, dataset: tf.data.Dataset, name: str = "x") -> tf.data.Dataset:
        """``dataset`` of ``(inputs, targets[, sample_weight])`` batches with every batch checked
        (finite features, labels normalised); shapes are checked now, at the map's tracing."""
        spec = dataset.element_spec
        if not isinstance(spec, tuple) or len(spec) not in (2, 3):
            raise ValueError(f"{name}: a tf.data dataset for training or evaluating a {type(self).__name__} yields "
                             f"(inputs, labels) or (inputs, labels, sample_weight) batches; got elements {spec}")  # fmt: skip

        @tf.autograph.experimental.do_not_convert  # no control flow to convert; shape errors surface as raised
        def check(x, y, *weights):
            return (assert_finite_features(x, f"{name} inputs"), self.normalised_targets(y, f"{name} labels"), *weights)

        return dataset.map(check)

    def checked_data(self, x, y, sample_weight=None, name: str = "x"):
        """``(x, y, sample_weight)`` checked for ``fit`` / ``evaluate``: a dataset batch by batch,
        arrays now. Other inputs (generators, ``keras.utils.PyDataset``) pass unchanged; their
        labels are still normalised in the graph."""
        if is_dataset(x):
            return self.checked_dataset(x, name), y, sample_weight
        if x is None or not isinstance(x, (np.ndarray, list, tuple, dict)) and not tf.is_tensor(x):
            return x, y, sample_weight
        if y is None:
            raise ValueError(f"a {type(self).__name__} trains and evaluates on labels: pass y (class ids (n,) or "
                             f"one-hot / multi-hot (n, {self.num_classes}))")  # fmt: skip
        x = checked_features(x, name)
        y = self.normalised_targets(y, "y" if name == "x" else f"{name} labels")
        rows, label_rows = _rows(x), len(y["labels"] if isinstance(y, dict) else y)
        if rows != label_rows:
            raise InputError(f"{name} has {rows} rows but its labels have {label_rows}; pass one label row per example")
        return x, y, checked_sample_weight(sample_weight, rows)

    def _checked_validation(self, validation_data):
        if validation_data is None or is_dataset(validation_data):
            return None if validation_data is None else self.checked_dataset(validation_data, "validation_data")
        if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
            raise ValueError("validation_data is (x, labels) or (x, labels, sample_weight), or a tf.data dataset")
        return self.checked_data(*validation_data, name="validation_data")

    def fit(self, x=None, y=None, **kwargs):
        """``keras.Model.fit`` after checking the data.

        Labels are taken as users give them: ``fit`` and ``evaluate`` take class ids ``(n,)`` or
        one-hot / multi-hot ``(n, C)`` (or a dict of targets holding them under ``"labels"``),
        normalised by :func:`tfhash.labels.multi_hot` before the first step: integer ids train
        exactly as their one-hot. Features are checked finite (:mod:`tfhash.models.inputs`). ``tf.data`` inputs get
        the same checks batch by batch, their shapes when ``fit`` is called.

        A step that makes a weight non-finite stops training with an error naming the weight
        (:class:`~tfhash.models.inputs.NonFiniteWeightsError`; an assertion after every optimizer
        step, whose cost ``benchmarks/keras_checks.py`` measures). A failed check on a ``tf.data``
        batch raises the error the same check raises on arrays
        (:func:`~tfhash.models.inputs.readable_checks`). The in-graph checks are ``tf.debugging``
        assertions, which XLA drops: with ``compile(jit_compile=True)`` (Keras's ``"auto"`` on a
        machine with a GPU, outside ``tf.distribute``) only the checks on arrays before the first
        step remain, and the weights' check is left out of the step. Keras leaves XLA off on a
        CPU-only machine, where it is also many times slower (a step of EfficientNet-Lite1 above
        ``block10``: 13 s against 0.5 s on a 2-core AMD EPYC).
        """
        x, y, kwargs["sample_weight"] = self.checked_data(x, y, kwargs.get("sample_weight"))
        kwargs["validation_data"] = self._checked_validation(kwargs.get("validation_data"))
        with readable_checks():
            return super().fit(x, y, **kwargs)

    def evaluate(self, x=None, y=None, **kwargs):
        """``keras.Model.evaluate`` after the checks of :meth:`fit`: the loss and its parts, and the
        compiled metrics."""
        x, y, kwargs["sample_weight"] = self.checked_data(x, y, kwargs.get("sample_weight"))
        with readable_checks():
            return super().evaluate(x, y, **kwargs)

    def train_step(self, data):
        logs = super().train_step(data)
        if not self.jit_compile:  # XLA drops assertions and compiles no string ops (the weight's name)
            assert_finite_weights(self.trainable_variables)
        return logs

    # --- compile -------------------------------------------------------------------------------

    @no_automatic_dependency_tracking
    def compile(self, optimizer="rmsprop", loss=None, loss_weights=None, metrics=None, weighted_metrics=None, **kwargs):
        """``keras.Model.compile`` without ``loss`` (the model trains with its own objective) and
        with ``metrics`` / ``weighted_metrics`` routed to its outputs.

        The objective is the method's own (``compute_loss``), so ``compile(loss=...)`` is refused
        with a clear error rather than silently ignored. ``compile(metrics=...)`` works the Keras
        way on the model's outputs: ``"accuracy"`` on its class scores (the classifier, proxy
        logits or proxy cosines), ``"precision_h2"`` (P@H<=2 within the batch) on its codes, any
        other Keras metric on the class scores, or a dict ``{output name: metrics}``; ``evaluate``
        returns them. ``weighted_metrics`` take ``sample_weight``. A cross-modal model reports each
        per tower (``image_accuracy``, ``text_accuracy``).

        Raises:
            ValueError: ``loss`` or ``loss_weights`` given, or a metric the model cannot compute.
        """
        if loss is not None or loss_weights is not None:
            raise ValueError(
                f"{type(self).__name__} trains with its own objective ({self.objective_name}); compile(loss=...) and "
                "loss_weights would be ignored, so they are refused: drop them. The objective's weights are the model's "
                "settings (its builder's keyword arguments); for another objective, subclass the model and override "
                "compute_loss, or train a plain keras.Model with the loss wrappers of tfhash.losses"
            )
        super().compile(optimizer=optimizer, **kwargs)
        if metrics or weighted_metrics:
            self._compile_metrics = BatchMetrics(self, metrics or [], weighted_metrics or [])
            self._compile_config.config.update(metrics=metrics, weighted_metrics=weighted_metrics)

    def compile_from_config(self, config):
        """Recompile a loaded model as it was compiled (Keras skips this for a custom ``compile``)."""
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    # --- outputs -------------------------------------------------------------------------------

    @property
    def towers(self) -> tuple[str, ...]:
        """The names of the model's output towers (one unnamed tower, or one per modality)."""
        return ("",)

    def tower_outputs(self, y_pred) -> dict:
        """``{tower: that tower's outputs dict}`` of ``call``'s result."""
        return {"": y_pred}


class BatchMetrics(keras.metrics.Metric):
    """The metrics of ``compile(metrics=..., weighted_metrics=...)``, each fed the normalised
    labels and the model output it is computed on (one copy per tower of a cross-modal model)."""

    def __init__(self, model: TrainingMixin, metrics, weighted_metrics):
        super().__init__(name="compile_metrics")
        self._targets, self._outputs = model.unpack_targets, model.tower_outputs
        self.members, self.routes = [], []
        for weighted, specs in ((False, metrics), (True, weighted_metrics)):
            for tower in model.towers:
                for output, spec in _by_output(specs):
                    metric, output = _resolve(spec, output, model, tower, weighted)
                    self.routes.append((tower, output, weighted))
                    self.members.append(metric)
        names = [m.name for m in self.members]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"compile metrics need distinct names; repeated: {repeated} (pass name=... to the metric)")
        self.built = True

    def update_state(self, y_true, y_pred, sample_weight=None):
        from tfhash.models.base import unpack_sample_weight

        labels = self._targets(y_true)[0]
        outputs = self._outputs(y_pred)
        weights = unpack_sample_weight(sample_weight)
        for metric, (tower, output, weighted) in zip(self.members, self.routes, strict=True):
            metric.update_state(labels, outputs[tower][output], sample_weight=weights if weighted else None)

    def result(self):
        return {metric.name: metric.result() for metric in self.members}

    def reset_state(self):
        for metric in self.members:
            metric.reset_state()

    def get_config(self):
        raise NotImplementedError("compile metrics are rebuilt by compile(), not deserialized")


def _by_output(specs) -> list:
    """``[(output or None, spec)]`` of a list of metrics or a dict ``{output: metric(s)}``."""
    if isinstance(specs, dict):
        return [(output, spec) for output, value in specs.items()
                for spec in (value if isinstance(value, (list, tuple)) else [value])]  # fmt: skip
    if not isinstance(specs, (list, tuple)):
        raise ValueError(f"metrics is a list of metrics or a dict {{output name: metrics}}; got {specs!r}")
    return [(None, spec) for spec in specs]


def _resolve(spec, output, model: TrainingMixin, tower: str, weighted: bool):
    """A fresh metric for ``spec`` (a name, a metric, a function) and the output it reads."""
    prefix = f"{tower}_" if tower else ""
    if isinstance(spec, str):
        if spec not in METRIC_NAMES:
            raise ValueError(f"unknown metric {spec!r} for a {type(model).__name__}; by name it takes {sorted(METRIC_NAMES)}, "
                             "or pass a keras.metrics.Metric (fed the labels and the class scores) or "
                             "tfhash.metrics.PrecisionAtRadius(r) (fed the codes)")  # fmt: skip
        metric = METRIC_NAMES[spec](name=f"{prefix}{'weighted_' if weighted else ''}{spec}")
    elif isinstance(spec, keras.metrics.Metric):
        config = spec.get_config()
        metric = type(spec).from_config({**config, "name": f"{prefix}{config.get('name', spec.name)}"}) if tower else spec
    elif callable(spec):
        metric = keras.metrics.MeanMetricWrapper(spec, name=f"{prefix}{getattr(spec, '__name__', 'metric')}")
    else:
        raise ValueError(f"a metric is a name, a keras.metrics.Metric or a function; got {spec!r}")
    if output is None:
        output = CODES if isinstance(metric, PrecisionAtRadius) else model.class_scores
    if output is None:
        raise ValueError(f"a {type(model).__name__} has no class scores for {metric.name!r}; its output is its codes: "
                         "use 'precision_h2' or tfhash.metrics.PrecisionAtRadius(r)")  # fmt: skip
    return metric, output
