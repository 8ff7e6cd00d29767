"""Transform module file: ``preprocessing_fn`` for image, feature-vector and multi-hot label
inputs of the tf.Examples written by ``tfhash data export``.
"""

from __future__ import annotations

import tensorflow as tf
from tfhash.components.compat import disable_tft_deep_copy
from tfhash.components.input_maps import input_map_transform

from tfhash.artifacts import ID, IMAGE, LABELS, model_inputs, read_data_description
from tfhash.export import decode_images

__all__ = ["multi_hot", "preprocessing_fn"]


# The Transform executor imports this module before it builds its Beam pipeline.
disable_tft_deep_copy()


def multi_hot(labels, num_classes: int) -> tf.Tensor:
    """Label indices per example -> ``(batch, C)`` float32 multi-hot. ``labels`` is sparse
    (variable count per example) or dense ``(batch, L)`` when the schema found a fixed count
    (single-label data)."""
    dense = tf.sparse.to_dense(labels, default_value=-1) if isinstance(labels, tf.SparseTensor) else labels
    dense = tf.reshape(dense, [tf.shape(dense)[0], -1])
    one_hot = tf.one_hot(dense, depth=num_classes, dtype=tf.float32)  # index -1 gives a zero row
    return tf.reduce_max(one_hot, axis=1)


def preprocessing_fn(inputs, custom_config):
    """Transform's preprocessing function over the raw tf.Examples.

    ``custom_config``: ``{"data_dir": <the exported data>, "inputs": [modality, ...]}``: the number of
    classes and each input's kind and shape are read from the data's description
    (:func:`tfhash.artifacts.read_data_description`) when the Transform runs. Images are decoded (PNG or JPEG) to float pixels in
    0..255 (the Keras models rescale themselves, as in the library); vectors go through their
    ``input_maps`` entry (:func:`tfhash.components.input_maps.input_map_transform`, seeded by
    ``seed``; default ``none``: z-scored with one mean and variance of the analysed split); labels become
    a dense multi-hot ``labels`` vector. The ``id`` is passed through. With ``jcch_anchors`` in the
    config, the JCCH label coefficients ``jcch_q`` and ``jcch_u`` are added
    (:mod:`tfhash.components.label_statistics`); they derive from the labels, so the serving
    signature, which receives no labels, never needs them. With ``tag_statistics`` the tag counts
    and tag co-occurrence counts of the analysed split are written as two vocabulary files of the
    Transform output (:func:`tfhash.components.label_statistics.tag_statistic_vocabularies`), for the
    proxy methods' assignment (sHCLM) and balanced BCE weights.
    """
    description = read_data_description(custom_config["data_dir"])
    outputs = {ID: inputs[ID]}
    outputs[LABELS] = multi_hot(inputs[LABELS], int(description["num_classes"]))
    if custom_config.get("jcch_anchors"):
        from tfhash.components.label_statistics import jcch_coefficient_features

        outputs["jcch_q"], outputs["jcch_u"] = jcch_coefficient_features(
            outputs[LABELS], inputs[ID], int(custom_config["jcch_anchors"])
        )
    if custom_config.get("tag_statistics"):
        from tfhash.components.label_statistics import tag_statistic_vocabularies

        tag_statistic_vocabularies(outputs[LABELS])
    model_inputs(description, custom_config["inputs"])  # every input is in the data
    for name in custom_config["inputs"]:
        spec = description["modalities"][name]
        if spec["kind"] == IMAGE:
            outputs[name] = decode_images(inputs[name], list(spec["shape"]))
        else:
            kind = custom_config.get("input_maps", {}).get(name, "none")
            outputs[name] = input_map_transform(inputs[name], inputs[ID], kind, int(custom_config.get("seed", 0)), name)
    return outputs
