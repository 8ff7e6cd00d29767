"""Export of a :class:`HashingDataset` as gzipped TFRecords, the input of TFX's ImportExampleGen.

Every split becomes a folder (``train/``, ``query/``, ``database/``) of ``tf.Example`` records
(:func:`to_example`), with ``metadata.json`` and ``items.csv`` beside them
(:func:`export_tfrecords`).
"""

from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image

from tfhash import storage
from tfhash.artifacts import (
    DATA_DESCRIPTION_FILE,
    ID,
    IMAGE,
    ITEMS_FILE,
    LABELS,
    SPLITS,
    VECTOR,
    Item,
    write_items,
)
from tfhash.data.dataset import HashingDataset

__all__ = ["image_type", "to_example", "export_tfrecords"]


#: The first bytes of each image file format tfhash reads back (exported records, the search page), and its type.
IMAGE_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
)


def image_type(head: bytes) -> str | None:
    """The media type of an image file from its first bytes (WebP: ``RIFF....WEBP``), or None."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return next((kind for signature, kind in IMAGE_SIGNATURES if head.startswith(signature)), None)


def _png_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def modality_kind(array: np.ndarray) -> str:
    """``"image"`` for uint8 arrays of 2-D (grey) or 3-D (colour) items, else ``"vector"``."""
    return IMAGE if array.dtype == np.uint8 and array.ndim in (3, 4) else VECTOR


def to_example(inputs: dict[str, np.ndarray], labels: np.ndarray, example_id: int):
    """One ``tf.train.Example`` from one row of every modality and its multi-hot labels.

    Features of the example:

    * ``id``: int64, the row index in the dataset;
    * ``labels``: int64 list of the example's label indices (empty for unlabelled examples);
    * per modality ``<name>``: images as PNG bytes (``tf.io.decode_png`` restores them), feature
      vectors as float lists.
    """
    import tensorflow as tf

    feature = {
        ID: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(example_id)])),
        LABELS: tf.train.Feature(int64_list=tf.train.Int64List(value=np.flatnonzero(labels).tolist())),
    }
    for name, value in inputs.items():
        if modality_kind(value[None]) == IMAGE:
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[_png_bytes(value)]))
        else:
            values = np.asarray(value, dtype=np.float32).ravel()
            if not np.all(np.isfinite(values)):
                raise ValueError(f"example {example_id}: modality {name!r} contains NaN or infinity")
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values.tolist()))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def export_tfrecords(dataset: HashingDataset, output_dir: str | os.PathLike, shards: int = 1, limit: int | None = None) -> dict:
    """Write every split of ``dataset`` under ``output_dir`` and return the metadata.

    ``output_dir`` is a folder or a URI of remote storage (``gs://bucket/data``); an earlier export
    there is replaced (its records and description removed first). ``metadata.json``
    (:data:`tfhash.artifacts.DATA_DESCRIPTION_FILE`), written last, beside the splits records the dataset, the class names, the modality kinds and
    shapes, the split sizes and the seed that drew the split, and what reading the user's files did
    (``notes``: images converted, resized, skipped). ``items.csv``
    (:data:`tfhash.artifacts.ITEMS_FILE`) names every exported item: its id, its source file and its
    class names.

    Args:
        shards: files per split.
        limit: keep only the first ``limit`` examples of each split (small pipelines, tests).
    """
    import tensorflow as tf

    out = os.fspath(output_dir)
    storage.remove(storage.join(out, DATA_DESCRIPTION_FILE))  # an export over an earlier one is whole only when it ends
    counts, exported = {}, []
    for split in SPLITS:
        index = getattr(dataset.split, split)[:limit]
        storage.makedirs(storage.join(out, split))
        for earlier in storage.glob(storage.join(out, split, "data-*-of-*.tfrecord.gz")):  # an earlier export's records
            storage.remove(earlier)
        options = tf.io.TFRecordOptions(compression_type="GZIP")
        writers = [
            tf.io.TFRecordWriter(storage.join(out, split, f"data-{s:05d}-of-{shards:05d}.tfrecord.gz"), options)
            for s in range(shards)
        ]
        try:
            for position, row in enumerate(index):
                example = to_example({k: v[row] for k, v in dataset.inputs.items()}, dataset.labels[row], int(row))
                writers[position % shards].write(example.SerializeToString())
        finally:
            for writer in writers:
                writer.close()
        counts[split] = int(index.size)
        exported += index.tolist()
    metadata = {
        "dataset": dataset.name,
        "num_classes": dataset.num_classes,
        "class_names": dataset.class_names,
        "modalities": {
            k: {"kind": modality_kind(v), "shape": list(v.shape[1:])} for k, v in dataset.inputs.items()
        },
        "split": {**dataset.split.describe(), **counts},
        "compression": "GZIP",
        **({"notes": dataset.extra["notes"]} if dataset.extra.get("notes") else {}),
        **({"image_root": dataset.extra["image_root"]} if dataset.extra.get("image_root") else {}),
        "items": ITEMS_FILE,
    }
    paths = dataset.extra.get("paths") or [""] * len(dataset.labels)
    write_items(storage.join(out, ITEMS_FILE),
                {int(row): Item(paths[row], tuple(dataset.class_names[c] for c in np.flatnonzero(dataset.labels[row])))
                 for row in set(exported)})  # fmt: skip
    storage.write_json(storage.join(out, DATA_DESCRIPTION_FILE), metadata)  # last: its presence says the export is whole
    return metadata
