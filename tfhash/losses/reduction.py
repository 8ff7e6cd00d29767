"""The one reduction of tfhash's losses: per-example values (and optional sample weights) to the
scalar a model trains on, under Keras's own contract.

Terms averaged per example use :func:`reduce_per_example`; terms normalised over the whole batch
(HyP2's proxy and pair terms, the Hamming triplet term, MT-SCDH's means over the labelled and the
unlabelled rows) give each example its share (:func:`batch_shares`), and rows of sample weight zero
take no part in such a batch (:func:`rows_taking_part`).
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["reduce_per_example", "rows_taking_part", "taking_part_mask", "batch_shares", "reduce_parts"]


def _as_row_weights(sample_weight) -> tf.Tensor:
    weight = tf.cast(sample_weight, tf.float32)
    if weight.shape.rank == 2:  # (n, 1), as Keras accepts
        weight = tf.squeeze(weight, axis=-1)
    return weight


def reduce_per_example(values, sample_weight=None) -> tf.Tensor:
    """sum_i w_i values_i / n (Keras's ``"sum_over_batch_size"``); the mean without weights.

    Keras 3's ``keras.losses.Loss`` with its default reduction ``"sum_over_batch_size"`` returns
    the weighted sum divided by the number of examples n, not by the sum of the weights. So a
    weight of zero drops an example's loss but the example still counts in n, weights of all ones
    equal no weights, and doubling every weight doubles the loss.

    Args:
        values: ``(n,)`` per-example loss values.
        sample_weight: ``None``, a scalar, or ``(n,)`` / ``(n, 1)`` weights.

    Returns:
        Scalar ``float32``; 0 for an empty batch.
    """
    values = tf.cast(values, tf.float32)
    if sample_weight is not None:
        values = values * _as_row_weights(sample_weight)
    return tf.math.divide_no_nan(tf.reduce_sum(values), tf.cast(tf.size(values), tf.float32))


def rows_taking_part(sample_weight) -> tf.Tensor | None:
    """``(n,)`` bool: the rows whose weight is not zero (``None`` without weights: every row).

    In a term normalised over the batch, a row of weight zero takes no part: it adds no positives,
    pairs or triplets to the normalisers. Training with weights zero on half the rows and two on
    the others is then the same as training on the other half alone.
    """
    if sample_weight is None:
        return None
    return tf.not_equal(_as_row_weights(sample_weight), 0.0)


def taking_part_mask(num_rows, taking_part=None) -> tf.Tensor:
    """``(n,)`` float 0/1 of :func:`rows_taking_part` (all ones for ``None``)."""
    if taking_part is None:
        return tf.ones((num_rows,), tf.float32)
    return tf.cast(taking_part, tf.float32)


def batch_shares(row_values, count, taking_part=None) -> tf.Tensor:
    """Per-example shares of a term normalised over the batch, sum_i row_values_i / count: row i
    gets m * row_values_i / count, m the number of rows taking part, so the mean of the shares
    over those rows is the term (the published batch term). Rows not taking part get 0, and so
    does every row when ``count`` is 0 (an empty term).

    Args:
        row_values: ``(n,)`` each row's part of the numerator.
        count: the normaliser, counted over the rows taking part.
        taking_part: ``(n,)`` bool from :func:`rows_taking_part`, or ``None`` (every row).
    """
    row_values = tf.cast(row_values, tf.float32)
    part = taking_part_mask(tf.shape(row_values)[0], taking_part)
    return tf.math.divide_no_nan(tf.reduce_sum(part) * part * row_values, tf.cast(count, tf.float32))


def reduce_parts(per_example: dict, sample_weight=None, total=None) -> dict:
    """:func:`reduce_per_example` of every entry of a dict of per-example values.

    ``total``: how the entry ``loss`` is made from the other entries (a linear combination, e.g.
    :func:`tfhash.losses.scdh_total`). Given, ``loss`` is that combination of the *reduced*
    entries, as the papers write their batch objectives: the same value as reducing the
    per-example ``loss`` (the reduction is linear), in the order of operations of the batch form,
    so that training follows the same floating-point path as the published batch losses."""
    if total is None:
        return {name: reduce_per_example(values, sample_weight) for name, values in per_example.items()}
    reduced = {name: reduce_per_example(values, sample_weight) for name, values in per_example.items() if name != "loss"}
    reduced["loss"] = total(reduced)
    return reduced
