"""Labels as users give them, turned into the one form tfhash computes with (docs/design.md s.4).

That form is ``(n, C)`` multi-hot, one-hot for single-label data. Every place labels enter goes
through :func:`multi_hot`: a model's ``fit`` and ``evaluate``, the loss wrappers, the pipeline's
Trainer, the retrieval metrics, the data loaders and the benchmarks. This module imports
TensorFlow only for tensors.
"""

from __future__ import annotations

import sys

import numpy as np

__all__ = ["LabelError", "multi_hot", "UNLABELLED_ID"]

#: The class id of an unlabelled row (where unlabelled rows are allowed).
UNLABELLED_ID = -1
#: How many offending rows an error message lists.
SHOWN_ROWS = 8


class LabelError(ValueError):
    """Labels that tfhash cannot read as class ids or multi-hot rows."""


def rows_text(rows: np.ndarray, total: int) -> str:
    """``"rows [3, 17] (2 of 1000)"``: the first offending rows and how many there are."""
    rows = np.asarray(rows).reshape(-1)
    shown = ", ".join(str(int(r)) for r in rows[:SHOWN_ROWS]) + (", ..." if rows.size > SHOWN_ROWS else "")
    return f"rows [{shown}] ({rows.size} of {total})"


def _multi_hot_shape(num_classes: int | None) -> str:
    return f"one-hot / multi-hot of shape (n, {'C' if num_classes is None else num_classes})"


def _expected(num_classes: int | None) -> str:
    return f"class ids of shape (n,) or {_multi_hot_shape(num_classes)}"


def _check_width(width: int, shape, num_classes: int | None, name: str) -> None:
    """Refuse a 2-D label array or tensor of ``shape`` whose ``width`` is not the model's C (an
    ``(n, 1)`` column is ambiguous whatever C is)."""
    if width == 1 and num_classes != 1:
        rows = "n" if shape[0] is None else shape[0]
        raise LabelError(f"{name} of shape {tuple(shape)} are ambiguous (class ids in a column, or one class): pass class "
                         f"ids as a 1-D array of shape ({rows},) (labels.ravel()) or {_multi_hot_shape(num_classes)}")  # fmt: skip
    if num_classes is not None and width != num_classes:
        raise LabelError(f"{name} have {width} columns but the model has {num_classes} classes: pass {_expected(num_classes)}")


def _is_tensor(labels) -> bool:
    tf = sys.modules.get("tensorflow")
    return tf is not None and tf.is_tensor(labels)


def multi_hot(labels, num_classes: int | None = None, *, unlabelled: bool = False, name: str = "labels",
              dtype="float32"):  # fmt: skip
    """``labels`` (class ids or multi-hot) as ``(n, C)`` multi-hot.

    Accepted:

    * class ids ``(n,)``: integers (or floats holding whole numbers) in ``0..C-1``, the Keras and
      scikit-learn habit;
    * one-hot or multi-hot ``(n, C)``: 0 / 1 values of any numeric or boolean type.

    Refused, with a message naming the expected shape: an ``(n, 1)`` column (class ids in a column
    and a single class look alike: pass ``labels.ravel()``), a width other than the model's C, ids
    outside ``0..C-1``, fractional ids, values other than 0 and 1, NaN or infinity, and rows without
    any label. With ``unlabelled=True`` (semi-supervised training, MT-SCDH; the metrics, where an
    item without classes is relevant to nothing) an all-zero row, or the id :data:`UNLABELLED_ID`,
    marks an item without a label.

    Arrays are checked in NumPy, naming the offending rows. Tensors (a ``tf.data`` batch, a loss's
    ``y_true``) are checked in the graph: shapes when the function is traced, values by assertions
    that stop the step with ``InvalidArgumentError``.

    Args:
        labels: an array-like, or a tensor (checked in the graph).
        num_classes: C; ``None`` takes it from the labels (the width, or the largest id + 1).
        unlabelled: allow rows without a label (all-zero rows, id -1); they stay all-zero.
        name: what the message calls the labels.
        dtype: of the result (``"float32"`` for training, ``"uint8"`` for storage).

    Raises:
        LabelError: labels in none of the accepted forms, naming the expected shape and the rows.
    """
    if _is_tensor(labels):
        return _multi_hot_tensor(labels, num_classes, unlabelled, name, dtype)
    try:
        array = np.asarray(labels)
    except ValueError as err:  # NumPy refuses rows of different lengths
        raise LabelError(f"{name} must be {_expected(num_classes)}; its rows have different lengths (a ragged list, "
                         "such as a list of id lists): give one multi-hot row of one width per example") from err
    if array.dtype == object or not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise LabelError(f"{name} must be numeric {_expected(num_classes)}; got dtype {array.dtype}")
    if array.ndim == 1:
        return _from_ids(array, num_classes, unlabelled, name).astype(dtype)
    if array.ndim != 2:
        raise LabelError(f"{name} must be {_expected(num_classes)}; got shape {array.shape}")
    n, width = array.shape
    _check_width(width, array.shape, num_classes, name)
    not_binary = ~((array == 0) | (array == 1))
    if not_binary.any():
        bad = np.flatnonzero(not_binary.any(axis=1))
        raise LabelError(f"{name}: one-hot / multi-hot rows hold only 0 and 1 (NaN, infinity and other values are "
                         f"refused); {rows_text(bad, n)} hold other values, e.g. {array[bad[0]][not_binary[bad[0]]][0]!r}")  # fmt: skip
    result = array.astype(dtype)
    if not unlabelled:
        _refuse_empty_rows(np.flatnonzero(~array.astype(bool).any(axis=1)), n, name)
    return result


def _from_ids(ids: np.ndarray, num_classes: int | None, unlabelled: bool, name: str) -> np.ndarray:
    n = ids.size
    if np.issubdtype(ids.dtype, np.floating):
        fractional = ~np.isfinite(ids) | (ids != np.round(ids))
        if fractional.any():
            bad = np.flatnonzero(fractional)
            raise LabelError(f"{name}: 1-D labels are class ids and must be whole numbers; {rows_text(bad, n)} hold "
                             f"{ids[bad[0]]!r}")  # fmt: skip
    ids = ids.astype(np.int64)
    low = UNLABELLED_ID if unlabelled else 0
    if num_classes is None:
        num_classes = int(ids.max(initial=-1)) + 1
        if num_classes < 1:
            raise LabelError(f"{name}: no class ids to infer the number of classes from; pass num_classes")
    outside = (ids < low) | (ids >= num_classes)
    if outside.any():
        bad = np.flatnonzero(outside)
        allowed = f"0..{num_classes - 1}" + (f" (or {UNLABELLED_ID} for an unlabelled row)" if unlabelled else "")
        hint = "" if unlabelled or not (ids[bad] == UNLABELLED_ID).all() else (
            f"; {UNLABELLED_ID} marks an unlabelled row only in semi-supervised training (MT-SCDH)")
        raise LabelError(f"{name}: class ids must lie in {allowed}; {rows_text(bad, n)} hold ids such as {int(ids[bad[0]])}"
                         f"{hint}")  # fmt: skip
    result = np.zeros((n, num_classes), dtype=np.uint8)
    known = ids >= 0
    result[np.flatnonzero(known), ids[known]] = 1
    return result


def _refuse_empty_rows(rows: np.ndarray, n: int, name: str) -> None:
    if rows.size:
        raise LabelError(f"{name}: every training row needs at least one label; {rows_text(rows, n)} have none (drop them, "
                         f"or train semi-supervised with MT-SCDH, where such rows count as unlabelled)")  # fmt: skip


def _multi_hot_tensor(labels, num_classes: int | None, unlabelled: bool, name: str, dtype):
    """The graph form of :func:`multi_hot`: shapes checked at trace time (ValueError), values by
    assertions at run time (InvalidArgumentError naming the rule)."""
    import tensorflow as tf

    rank = labels.shape.rank
    if rank == 1:
        if num_classes is None:
            raise LabelError(f"{name}: class ids of shape (n,) need the number of classes here (e.g. the loss wrapper's num_classes=C); or pass one-hot / multi-hot labels")
        values = tf.cast(labels, tf.float32)
        low = float(UNLABELLED_ID if unlabelled else 0)
        bad = tf.reshape(tf.where(~((values == tf.round(values)) & (values >= low) & (values < float(num_classes)))), [-1])
        allowed = f"whole numbers in 0..{num_classes - 1}" + (f" or {UNLABELLED_ID}" if unlabelled else "")
        check = tf.debugging.Assert(tf.size(bad) == 0, [f"{name}: class ids must be {allowed}; rows of this batch:", bad,
                                                        "hold", tf.gather(values, bad)], summarize=SHOWN_ROWS)  # fmt: skip
        with tf.control_dependencies([check]):
            return tf.one_hot(tf.cast(values, tf.int32), num_classes, dtype=dtype)
    if rank != 2 or labels.shape[-1] is None:
        raise LabelError(f"{name} must be {_expected(num_classes)}; got a tensor of shape {labels.shape}")
    _check_width(int(labels.shape[-1]), labels.shape, num_classes, name)
    values = tf.cast(labels, tf.float32)
    checks = [tf.debugging.Assert(tf.reduce_all((values == 0.0) | (values == 1.0)),
                                  [f"{name}: one-hot / multi-hot rows hold only 0 and 1 (no NaN or infinity)"])]  # fmt: skip
    if not unlabelled:
        empty = tf.reshape(tf.where(tf.reduce_sum(values, axis=-1) <= 0.0), [-1])
        checks.append(tf.debugging.Assert(tf.size(empty) == 0, [f"{name}: every training row needs at least one label; "
                                                                "rows of this batch without one:", empty], summarize=SHOWN_ROWS))  # fmt: skip
    with tf.control_dependencies(checks):
        return tf.cast(tf.identity(values), dtype)
