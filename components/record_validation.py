"""Which serialized tf.Examples the pipeline cannot use, and why (pure Python; no TFX).

A record is bad when it does not parse as a ``tf.train.Example``, has no ``id``, has no label or a
label outside ``0 .. C-1`` (an example without labels cannot train, and cannot be judged relevant
to any query), or when a modality is missing, has the wrong number of values, holds NaN or
infinity, or (images) does not decode to the exported shape. The RecordFilter component applies
:func:`record_problem` to every record of every split.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

__all__ = ["record_problem"]


REASONS = ("unparsable record", "missing id", "missing label", "label out of range", "missing feature",
           "wrong feature length", "non-finite feature", "undecodable image", "wrong image shape")  # fmt: skip


def _image_shape(data: bytes) -> tuple[int, ...] | None:
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            array = np.asarray(image)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return None
    return tuple(array.shape)


def record_problem(serialized: bytes, num_classes: int, modalities: dict) -> str | None:
    """The first reason (one of :data:`REASONS`) why a record is unusable, or None when it is fine.

    Args:
        serialized: one serialized ``tf.train.Example``.
        num_classes: C.
        modalities: ``{name: {"kind": "image"|"vector", "shape": [...]}}`` as in the export metadata.
    """
    from google.protobuf.message import DecodeError
    from tensorflow.core.example import example_pb2

    from tfhash.artifacts import ID, IMAGE, LABELS

    example = example_pb2.Example()
    try:
        example.ParseFromString(serialized)
    except DecodeError:
        return "unparsable record"
    features = example.features.feature
    if ID not in features or len(features[ID].int64_list.value) != 1:
        return "missing id"
    labels = features[LABELS].int64_list.value if LABELS in features else []
    if not labels:
        return "missing label"
    if min(labels) < 0 or max(labels) >= num_classes:
        return "label out of range"
    for name, spec in modalities.items():
        if name not in features:
            return "missing feature"
        shape = tuple(int(d) for d in spec["shape"])
        if spec["kind"] == IMAGE:
            values = features[name].bytes_list.value
            if len(values) != 1:
                return "wrong feature length"
            decoded = _image_shape(values[0])
            if decoded is None:
                return "undecodable image"
            if decoded != shape and not (len(shape) == 3 and shape[2] == 1 and decoded == shape[:2]):
                return "wrong image shape"
        else:
            values = features[name].float_list.value
            if len(values) != int(np.prod(shape)):
                return "wrong feature length"
            if not np.all(np.isfinite(np.asarray(values, dtype=np.float32))):
                return "non-finite feature"
    return None
