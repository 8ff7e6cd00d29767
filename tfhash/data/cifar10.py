"""CIFAR-10 from the tarball of 60,000 32x32 JPEGs (``train|test/<class>/NNNN.jpg``)."""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
from PIL import Image

from tfhash.data.dataset import DataFormatError, HashingDataset
from tfhash.data.paths import find_data_file
from tfhash.data.splits import per_class_split
from tfhash.labels import multi_hot

__all__ = ["load_cifar10_arrays", "load_cifar10"]


ARCHIVE = "cifar10/cifar10-jpg.tar.gz"
CLASS_NAMES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]
PER_CLASS = {"train": 5000, "test": 1000}


def load_cifar10_arrays(
    data_root: str | os.PathLike | None = None, archive: str | os.PathLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """All 60,000 images, ``uint8`` (60000, 32, 32, 3) RGB, train then test, each part ordered by
    class then by file number (the original batch order); and ``int64`` labels.

    Raises:
        DataFormatError: an undecodable JPEG, an unknown class folder, or missing / extra files.
    """
    path = archive if archive is not None else find_data_file(ARCHIVE, data_root)
    offsets = {"train": 0, "test": 10 * PER_CLASS["train"]}
    total = offsets["test"] + 10 * PER_CLASS["test"]
    images = np.zeros((total, 32, 32, 3), dtype=np.uint8)
    seen = np.zeros(total, dtype=bool)
    try:
        archive_file = tarfile.open(path, "r:gz")
    except (tarfile.TarError, OSError) as err:
        raise DataFormatError(f"{path}: cannot open CIFAR-10 archive ({err})") from err
    with archive_file:
        for member in archive_file:
            if not member.isfile() or not member.name.endswith(".jpg"):
                continue
            parts = member.name.split("/")
            if len(parts) != 3 or parts[0] not in offsets or parts[1] not in CLASS_NAMES:
                raise DataFormatError(f"{path}: unexpected member {member.name!r}")
            split, cls, fname = parts
            number = int(fname[:-4])
            if number >= PER_CLASS[split]:
                raise DataFormatError(f"{path}: file number too large in {member.name!r}")
            row = offsets[split] + CLASS_NAMES.index(cls) * PER_CLASS[split] + number
            data = archive_file.extractfile(member).read()
            try:
                with Image.open(io.BytesIO(data)) as img:
                    pixels = np.asarray(img.convert("RGB"))
            except Exception as err:  # PIL raises many types for bad data
                raise DataFormatError(f"{path}: cannot decode {member.name!r} ({err})") from err
            if pixels.shape != (32, 32, 3):
                raise DataFormatError(f"{path}: {member.name!r} has shape {pixels.shape}")
            images[row] = pixels
            seen[row] = True
    if not seen.all():
        raise DataFormatError(f"{path}: {int((~seen).sum())} of {total} images are missing")
    labels = np.concatenate(
        [np.repeat(np.arange(10), PER_CLASS["train"]), np.repeat(np.arange(10), PER_CLASS["test"])]
    ).astype(np.int64)
    return images, labels


def load_cifar10(data_root: str | os.PathLike | None = None, seed: int = 0) -> HashingDataset:
    """CIFAR-10 with the standard protocol: 1,000 queries (100 per class), database = the other
    59,000, 5,000 training images (500 per class) drawn from the database."""
    images, labels = load_cifar10_arrays(data_root)
    return HashingDataset(
        name="cifar10",
        inputs={"image": images},
        labels=multi_hot(labels, 10, dtype=np.uint8),
        class_names=list(CLASS_NAMES),
        split=per_class_split(labels, 100, 500, seed=seed),
    )
