"""Your own data as a :class:`HashingDataset`: image folders, NumPy / CSV feature matrices (one or
two modalities, paired by row), class ids or multi-hot labels, and a seeded random split. The
result exports like the shipped datasets (``tfhash data export-user``, then the pipeline).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from tfhash.data.dataset import DataFormatError, HashingDataset
from tfhash.data.splits import random_split
from tfhash.labels import LabelError, multi_hot

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


def load_image_folder(path: str | os.PathLike, size: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Images of ``<path>/<class>/<file>``, one class per sub-folder (classes in sorted order).

    Args:
        size: ``(height, width)`` to resize every image to; without it all images must share one
            shape. Grey images stay 2-D per item, colour images become RGB.

    Returns:
        ``(uint8 images (n, H, W) or (n, H, W, 3), one-hot labels (n, C), class names)``.

    Raises:
        DataFormatError: no class folders, an empty class, an unreadable image, or mixed shapes.
    """
    root = Path(path)
    if not root.is_dir():
        raise DataFormatError(f"{root}: not a folder of class sub-folders")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise DataFormatError(f"{root}: no class sub-folders (expected <folder>/<class>/<image>)")
    images, ids = [], []
    for class_id, name in enumerate(classes):
        files = sorted(p for p in (root / name).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise DataFormatError(f"{root / name}: class folder without images ({', '.join(IMAGE_SUFFIXES)})")
        for file in files:
            try:
                with Image.open(file) as image:
                    image = image.convert("L" if image.mode in ("L", "1", "I;16") else "RGB")
                    if size is not None:
                        image = image.resize((size[1], size[0]))
                    images.append(np.asarray(image, dtype=np.uint8))
            except (UnidentifiedImageError, OSError) as err:
                raise DataFormatError(f"{file}: cannot read the image ({err})") from err
            ids.append(class_id)
    shapes = {a.shape for a in images}
    if len(shapes) > 1:
        raise DataFormatError(f"{root}: images of different shapes {sorted(shapes)[:4]}; pass a size to resize them")
    return np.stack(images), multi_hot(np.asarray(ids), len(classes), dtype=np.uint8), classes


def load_matrix(path: str | os.PathLike) -> np.ndarray:
    """A 2-D numeric matrix from ``.npy`` (no pickle) or ``.csv`` (comma separated, no header)."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: no such file")
    try:
        if path.suffix == ".npy":
            array = np.load(path, allow_pickle=False)
        elif path.suffix == ".csv":
            array = np.loadtxt(path, delimiter=",", ndmin=2, dtype=np.float64)
        else:
            raise DataFormatError(f"{path}: use a .npy or .csv file")
    except ValueError as err:
        raise DataFormatError(f"{path}: not a numeric matrix ({err})") from err
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.number):
        raise DataFormatError(f"{path}: expected a 2-D numeric matrix, got shape {array.shape} ({array.dtype})")
    return array


def load_labels(path: str | os.PathLike) -> np.ndarray:
    """The labels file of :func:`load_user_dataset`: one column of class ids, or C columns of 0/1
    (:func:`tfhash.labels.multi_hot`), as ``(n, C)`` ``uint8``.

    Raises:
        DataFormatError: the file's values are not labels (naming the file and the rows).
    """
    matrix = load_matrix(path)
    try:
        return multi_hot(matrix[:, 0] if matrix.shape[1] == 1 else matrix, name="labels", dtype=np.uint8)
    except LabelError as err:
        raise DataFormatError(f"{path}: {err}") from err


def load_user_dataset(features: dict[str, str] | None = None, labels: str | None = None, images: str | None = None,
                      image_size: tuple[int, int] | None = None, num_query: int = 100, num_train: int = 1000,
                      seed: int = 0, name: str = "custom") -> HashingDataset:  # fmt: skip
    """Build a dataset from files: either ``images`` (a class-folder tree, labels from the
    folders) or ``features`` (modality name -> .npy/.csv, rows paired across modalities) with a
    ``labels`` file. Split: ``num_query`` random queries, the rest the database, ``num_train`` of
    it trains (seeded)."""
    if bool(images) == bool(features):
        raise ValueError("give either an image folder or feature files (with a labels file)")
    if images:
        if labels:
            raise ValueError("an image folder takes its labels from its class folders; drop the labels file")
        array, label_matrix, class_names = load_image_folder(images, image_size)
        inputs = {"image": array}
    else:
        if not labels:
            raise ValueError("feature files need a labels file (class ids or multi-hot)")
        inputs = {modality: load_matrix(path).astype(np.float32) for modality, path in features.items()}
        label_matrix = load_labels(labels)
        class_names = [str(c) for c in range(label_matrix.shape[1])]
        for modality, array in inputs.items():
            if not np.all(np.isfinite(array)):
                raise DataFormatError(f"modality {modality!r} contains NaN or infinity")
    n = label_matrix.shape[0]
    return HashingDataset(name, inputs, label_matrix, class_names, random_split(n, num_query, num_train, seed))
