"""Checks on the features that enter a tfhash model (``fit``, ``evaluate``, ``encode``): arrays
are checked in NumPy before anything runs, naming the offending rows; ``tf.data`` batches are
checked in the graph, batch by batch, before the model sees them.

A non-finite value is refused where it enters, never left to the network: ReLU and max can turn
NaN into a number on some CPUs, and a NaN input row can make every weight NaN while the logged
losses stay finite.
"""

from __future__ import annotations

import contextlib
import re

import numpy as np
import tensorflow as tf

from tfhash.labels import SHOWN_ROWS, LabelError, rows_text

__all__ = ["InputError", "NonFiniteWeightsError", "WEIGHTS_MESSAGE", "readable_checks", "checked_features", "assert_finite_features", "is_dataset"]


class InputError(ValueError):
    """Features a model cannot take: non-numeric, non-finite, or of inconsistent row counts."""


class NonFiniteWeightsError(FloatingPointError):
    """A training step left a weight NaN or infinite (the run diverged)."""


#: The start of the weights check's message (:func:`tfhash.models.training.assert_finite_weights`).
WEIGHTS_MESSAGE = "a training step made the weight"


@contextlib.contextmanager
def readable_checks():
    """Turn the failure of one of tfhash's in-graph checks (a ``tf.debugging.Assert`` on a batch
    or on the weights) into the error the same check raises on arrays, with the check's message
    alone: :class:`tfhash.labels.LabelError`, :class:`InputError` or
    :class:`NonFiniteWeightsError` (the original stays as ``__cause__``). Other errors pass."""
    try:
        yield
    except tf.errors.InvalidArgumentError as err:
        found = re.search(r"assertion failed: (\[.*?\])\s*(?:\[\[|$)", err.message, re.S)
        if not found:
            raise
        text = " ".join(part.strip() for part in re.findall(r"\[(.*?)\]", found.group(1), re.S))
        if text.startswith(WEIGHTS_MESSAGE):
            raise NonFiniteWeightsError(text) from err
        raise (LabelError if " labels" in text.split(":")[0] else InputError)(text) from err


def checked_features(x, name: str = "x"):
    """``x`` (an array-like, a tensor, or a dict of them) as NumPy arrays, every float value
    finite.

    Raises:
        InputError: a non-numeric array, or NaN / infinity (naming the rows and how to fix it).
    """
    if isinstance(x, dict):
        return {key: checked_features(value, f"{name}[{key!r}]") for key, value in x.items()}
    array = np.asarray(x)
    if array.dtype == object or not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise InputError(f"{name} must be a numeric array (or a dict of them for a cross-modal model); got dtype {array.dtype}")
    if array.ndim == 0:
        raise InputError(f"{name} must hold one row per example; got a scalar")
    if np.issubdtype(array.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(array.reshape(len(array), -1)).all(axis=1))
        if bad.size:
            raise InputError(f"{name} holds NaN or infinite values in {rows_text(bad, len(array))}; drop or impute those "
                             f"rows first (a non-finite input makes the model's weights and codes meaningless)")  # fmt: skip
    return array


def assert_finite_features(x, name: str = "x"):
    """The graph form of :func:`checked_features` for one batch: ``x`` (a tensor or a dict of
    them) passed on after an assertion that its float values are finite (InvalidArgumentError
    naming the batch's offending rows)."""
    if isinstance(x, dict):
        return {key: assert_finite_features(value, f"{name}[{key!r}]") for key, value in x.items()}
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        return x
    rows = tf.reshape(x, [tf.shape(x)[0], -1])
    bad = tf.reshape(tf.where(~tf.reduce_all(tf.math.is_finite(rows), axis=1)), [-1])
    check = tf.debugging.Assert(tf.size(bad) == 0, [f"{name} holds NaN or infinite values; rows of this batch:", bad],
                                summarize=SHOWN_ROWS)  # fmt: skip
    with tf.control_dependencies([check]):
        return tf.identity(x)


def is_dataset(x) -> bool:
    return isinstance(x, tf.data.Dataset)
