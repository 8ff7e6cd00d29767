"""The input maps of a feature-vector tower inside Transform (:data:`tfhash.towers.INPUT_MAPS`):
the statistics come from tf.Transform analyzers over the analysed (training) split, so the
transform graph, and with it the exported serving signature, maps raw vectors the same way.
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_transform as tft
from tfhash.components.label_statistics import SelectAnchors

from tfhash.layers.input_maps import anchor_gamma, rbf_kernel
from tfhash.towers import INPUT_MAPS

__all__ = ["RBF_ANCHORS", "input_map_transform"]


#: How many anchors the pipeline's RBF map draws (as :func:`tfhash.layers.input_map_layers`).
RBF_ANCHORS = 500


def rbf_transform(x: tf.Tensor, ids: tf.Tensor, num_anchors: int, seed: int, name: str) -> tf.Tensor:
    """RBF kernel features of ``x`` ``(batch, d)`` on anchors (:func:`tfhash.layers.rbf_kernel`),
    as :class:`tfhash.layers.RBFFeatures` learns them but with analyzers: the anchors are the
    ``num_anchors`` analysed rows with the smallest
    :func:`~tfhash.components.label_statistics.anchor_key` of their id under ``seed``
    (all of them when there are fewer; the padding's features are 0), and the width follows from
    them alone (:func:`tfhash.layers.input_maps.anchor_gamma`)."""
    (anchors,) = tft.experimental.ptransform_analyzer(
        inputs=[x, tf.reshape(tf.cast(ids, tf.int64), [-1])],
        ptransform=SelectAnchors(num_anchors, int(x.shape[-1]), seed=seed, labelled_only=False),
        output_dtypes=[tf.float32],
        output_shapes=[[num_anchors, int(x.shape[-1])]],
        name=f"{name}_rbf_anchors",
    )
    count = tf.minimum(tft.size(tf.reshape(ids, [-1]), name=f"{name}_rbf_rows"), num_anchors)
    valid = tf.range(num_anchors, dtype=count.dtype) < count
    anchors = tf.boolean_mask(anchors, valid)
    gamma = anchor_gamma(anchors)
    # count 0: tf.Transform's trace with placeholder statistics, not data
    check = tf.debugging.Assert(tf.logical_or(count == 0, tf.math.is_finite(gamma)),
                                [f"the RBF map of {name} has no width: the training split needs at least two distinct rows "
                                 "(or use the standardise map)"])  # fmt: skip
    with tf.control_dependencies([check]):
        # the padding's kernel columns are 0, so the output keeps its static width
        features = rbf_kernel(x, anchors, gamma)
    return tf.pad(features, [[0, 0], [0, num_anchors - tf.shape(anchors)[0]]])


def input_map_transform(x: tf.Tensor, ids: tf.Tensor, kind: str, seed: int, name: str) -> tf.Tensor:
    """Transform's map of the vectors ``x`` of one modality: ``none`` (the pipeline's default)
    z-scores with one mean and variance over all the analysed values; ``standardise`` z-scores each
    feature; ``rbf`` takes RBF features of the raw vectors (:func:`rbf_transform`) and z-scores
    each. The last two equal the Keras API's maps (the anchors apart: there a seeded draw, here the
    smallest id hashes), and neither changes when ``none``'s scaling comes first.

    Raises:
        ValueError: an unknown kind.
    """
    if kind not in INPUT_MAPS:
        raise ValueError(f"unknown input map {kind!r}; choose one of {INPUT_MAPS}")
    x = tf.cast(x, tf.float32)
    if kind == "none":
        return tft.scale_to_z_score(x, name=f"{name}_scale")
    if kind == "rbf":
        # on the raw vectors: an analyzer fed by another analyzer's output stalls Beam's in-memory runner
        x = rbf_transform(x, ids, RBF_ANCHORS, seed, name)
    return tft.scale_to_z_score(x, elementwise=True, name=f"{name}_standardise")
