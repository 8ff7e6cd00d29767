"""MNIST from the original gzipped IDX files (LeCun), 70,000 images of 28x28 grey."""

from __future__ import annotations

import gzip
import os

import numpy as np

from tfhash.data.dataset import DataFormatError, HashingDataset
from tfhash.data.paths import find_data_file
from tfhash.data.splits import per_class_split
from tfhash.labels import multi_hot

__all__ = ["load_mnist_arrays", "load_mnist"]


FILES = {
    "train_images": "mnist/train-images-idx3-ubyte.gz",
    "train_labels": "mnist/train-labels-idx1-ubyte.gz",
    "test_images": "mnist/t10k-images-idx3-ubyte.gz",
    "test_labels": "mnist/t10k-labels-idx1-ubyte.gz",
}
_IDX_UBYTE = 0x08


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Parse a (gzipped) IDX file of unsigned bytes into an array of the shape its header names.

    Raises:
        DataFormatError: bad magic number, unsupported type, or a body of the wrong size.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            raw = handle.read()
    except (OSError, EOFError) as err:
        raise DataFormatError(f"{path}: cannot read IDX file ({err})") from err
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataFormatError(f"{path}: not an IDX file (bad magic number)")
    if raw[2] != _IDX_UBYTE:
        raise DataFormatError(f"{path}: IDX element type 0x{raw[2]:02x} is not unsigned byte")
    ndim = raw[3]
    header_end = 4 + 4 * ndim
    if len(raw) < header_end:
        raise DataFormatError(f"{path}: truncated IDX header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    body = np.frombuffer(raw, dtype=np.uint8, offset=header_end)
    if body.size != int(np.prod(shape)):
        raise DataFormatError(
            f"{path}: header promises shape {shape} ({int(np.prod(shape))} bytes), body has {body.size}"
        )
    return body.reshape(shape)


def load_mnist_arrays(data_root: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """All 70,000 images (train then test), ``uint8`` (70000, 28, 28), and ``int64`` labels."""
    parts = {key: read_idx(find_data_file(rel, data_root)) for key, rel in FILES.items()}
    images = np.concatenate([parts["train_images"], parts["test_images"]])
    labels = np.concatenate([parts["train_labels"], parts["test_labels"]]).astype(np.int64)
    if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
        raise DataFormatError(f"MNIST: {images.shape} images do not match {labels.shape} labels")
    if labels.max() > 9:
        raise DataFormatError("MNIST: a label is above 9")
    return images, labels


def load_mnist(data_root: str | os.PathLike | None = None, seed: int = 0) -> HashingDataset:
    """MNIST with the standard protocol: 1,000 queries (100 per class), the other 69,000 are the
    database, 5,000 of the database (500 per class) train."""
    images, labels = load_mnist_arrays(data_root)
    return HashingDataset(
        name="mnist",
        inputs={"image": images},
        labels=multi_hot(labels, 10, dtype=np.uint8),
        class_names=[str(i) for i in range(10)],
        split=per_class_split(labels, 100, 500, seed=seed),
    )
