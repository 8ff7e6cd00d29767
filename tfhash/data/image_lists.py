"""Loaders of the multi-label image sets users bring: NUS-WIDE and MS-COCO.

Each is read from an image list, a label matrix and a folder of images, and split as the hashing
papers do (docs/design.md s.5). Neither set can be had offline, so nothing here is downloaded:
point the loaders at your copy.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from tfhash.data.dataset import DataFormatError, HashingDataset
from tfhash.data.splits import Split, random_split

__all__ = ["per_tag_split", "load_nuswide", "load_coco"]


NUSWIDE_CONCEPTS = 21
COCO_CATEGORIES = 80


def _image_path(entry: str) -> str:
    if "\\" in entry:  # the NUS-WIDE distribution's Windows paths: <class folder>\<file>
        return "/".join(entry.replace("\\", "/").split("/")[-2:])
    return entry


def read_image_list(path: str | os.PathLike) -> tuple[list[str], np.ndarray | None]:
    """Image paths of a list file, and the label matrix when every line carries 0/1 labels after
    its path (None when no line does).

    One image path per line, relative to the image folder. Windows paths of the NUS-WIDE
    distribution (``C:\\ImageData\\Flickr\\actor\\0001_2124494179.jpg``) keep their last two parts
    (``actor/0001_2124494179.jpg``). A line may carry its labels after the path, as the lists of
    the deep-hashing code bases do (``path 0 1 0 ...``): then no label file is needed.

    Raises:
        DataFormatError: a missing or empty file, lines with different numbers of labels, or labels
            other than 0/1.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: no such image list")
    paths, rows = [], []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        paths.append(_image_path(parts[0]))
        try:
            rows.append([int(v) for v in parts[1:]])
        except ValueError as err:
            raise DataFormatError(f"{path}:{number}: labels after the path must be 0 or 1 ({err})") from err
    if not paths:
        raise DataFormatError(f"{path}: the image list is empty")
    widths = {len(r) for r in rows}
    if widths == {0}:
        return paths, None
    if len(widths) > 1:
        raise DataFormatError(f"{path}: lines carry different numbers of labels {sorted(widths)[:4]}")
    labels = np.asarray(rows, dtype=np.int64)
    if not np.all((labels == 0) | (labels == 1)):
        raise DataFormatError(f"{path}: labels after the path must be 0 or 1")
    return paths, labels.astype(np.uint8)


def read_label_matrix(path: str | os.PathLike) -> np.ndarray:
    """A whitespace-separated 0/1 matrix, one row per image.

    Raises:
        DataFormatError: a missing file, ragged rows or values other than 0/1.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: no such label file")
    try:
        labels = np.loadtxt(path, dtype=np.int64, ndmin=2)
    except ValueError as err:
        raise DataFormatError(f"{path}: not a matrix of 0/1 labels ({err})") from err
    if not np.all((labels == 0) | (labels == 1)):
        raise DataFormatError(f"{path}: labels must be 0 or 1")
    return labels.astype(np.uint8)


def read_nuswide_groundtruth(folder: str | os.PathLike) -> tuple[np.ndarray, list[str]]:
    """The NUS-WIDE ``Groundtruth/AllLabels`` folder: ``Labels_<concept>.txt`` files of one 0/1
    per image -> ``(n, concepts)`` labels and the concept names (sorted).

    Raises:
        DataFormatError: no label files, files of different lengths, or values other than 0/1.
    """
    files = sorted(Path(folder).glob("Labels_*.txt"))
    if not files:
        raise DataFormatError(f"{folder}: no Labels_<concept>.txt files (NUS-WIDE's Groundtruth/AllLabels)")
    columns = [read_label_matrix(f)[:, 0] for f in files]
    lengths = {c.size for c in columns}
    if len(lengths) > 1:
        raise DataFormatError(f"{folder}: label files of different lengths {sorted(lengths)}")
    return np.stack(columns, axis=1), [f.stem[len("Labels_"):] for f in files]


def load_images(paths: list[str], image_root: str | os.PathLike, image_size: tuple[int, int]) -> np.ndarray:
    """RGB ``uint8`` images ``(n, H, W, 3)`` read from ``image_root / path``, resized (bilinear).

    All are held in memory: n x H x W x 3 bytes, about 2.4 GB for NUS-WIDE at 64x64 (the loaders'
    ``limit`` reads the first rows only).

    Raises:
        DataFormatError: a missing or undecodable image (named).
    """
    root = Path(image_root)
    height, width = (int(s) for s in image_size)
    images = np.zeros((len(paths), height, width, 3), dtype=np.uint8)
    for row, relative in enumerate(paths):
        file = root / relative
        try:
            with Image.open(file) as image:
                images[row] = np.asarray(image.convert("RGB").resize((width, height), Image.BILINEAR))
        except (FileNotFoundError, UnidentifiedImageError, OSError) as err:
            raise DataFormatError(f"{file}: cannot read the image ({err})") from err
    return images


def per_tag_split(labels: np.ndarray, queries_per_tag: int, train_per_tag: int, seed: int = 0) -> Split:
    """NUS-WIDE protocol on multi-label data: for each tag in turn, ``queries_per_tag`` images
    carrying it that are not yet drawn become queries; the rest is the database, from which
    ``train_per_tag`` images per tag are drawn the same way to train.

    Raises:
        ValueError: a tag with too few images left.
    """
    rng = np.random.default_rng(seed)
    order = rng.permutation(labels.shape[0])
    taken = np.zeros(labels.shape[0], dtype=bool)

    def draw(count: int, allowed: np.ndarray, what: str) -> np.ndarray:
        chosen = []
        for tag in range(labels.shape[1]):
            candidates = order[(labels[order, tag] > 0) & allowed[order] & ~taken[order]]
            if candidates.size < count:
                raise ValueError(f"tag {tag} has {candidates.size} images left, fewer than {count} {what}")
            taken[candidates[:count]] = True
            chosen.append(candidates[:count])
        return np.concatenate(chosen)

    query = draw(queries_per_tag, np.ones_like(taken), "queries")
    in_database = ~taken.copy()
    train = draw(train_per_tag, in_database, "training images")
    database = order[in_database[order]]
    return Split(query=query, database=database, train=train, seed=seed,
                 protocol=f"per-tag: {queries_per_tag} queries, {train_per_tag} train per tag")  # fmt: skip


def _labels_for(list_labels: np.ndarray | None, labels: str | os.PathLike | None, count: int, what: str) -> tuple[np.ndarray, list[str] | None]:
    if labels is None:
        if list_labels is None:
            raise DataFormatError(f"{what}: give a label file (or a list whose lines carry the labels)")
        return list_labels, None
    if list_labels is not None:
        raise DataFormatError(f"{what}: the image list already carries labels; drop the label file")
    if Path(labels).is_dir():
        matrix, names = read_nuswide_groundtruth(labels)
    else:
        matrix, names = read_label_matrix(labels), None
    if matrix.shape[0] != count:
        raise DataFormatError(f"{what}: {matrix.shape[0]} label rows for {count} listed images")
    return matrix, names


def load_nuswide(image_root, image_list, labels=None, image_size: tuple[int, int] = (64, 64), seed: int = 0,
                 concepts: int = NUSWIDE_CONCEPTS, queries_per_tag: int = 100, train_per_tag: int = 500,
                 limit: int | None = None) -> HashingDataset:  # fmt: skip
    """NUS-WIDE with the hashing papers' protocol: the ``concepts`` (21) most frequent concepts,
    images with none of them dropped, ``queries_per_tag`` queries and ``train_per_tag`` training
    images per concept (:func:`per_tag_split`), mAP@5000.

    Args:
        image_root: the folder the list's paths are relative to.
        image_list: the image list (see :func:`read_image_list`).
        labels: a 0/1 matrix file or the ``Groundtruth/AllLabels`` folder; None when the list
            carries the labels.
        limit: read only the first ``limit`` listed images.
    """
    paths, list_labels = read_image_list(image_list)
    matrix, names = _labels_for(list_labels, labels, len(paths), "NUS-WIDE")
    paths, matrix = paths[:limit], matrix[:limit]
    if matrix.shape[1] < concepts:
        raise DataFormatError(f"NUS-WIDE: {matrix.shape[1]} concepts in the labels, fewer than the {concepts} asked for")
    frequent = np.sort(np.argsort(-matrix.sum(axis=0), kind="stable")[:concepts])
    matrix = matrix[:, frequent]
    keep = np.flatnonzero(matrix.sum(axis=1) > 0)
    images = load_images([paths[i] for i in keep], image_root, image_size)
    matrix = matrix[keep]
    class_names = [names[i] for i in frequent] if names else [f"concept {i}" for i in frequent]
    return HashingDataset("nuswide", {"image": images}, matrix, class_names,
                          per_tag_split(matrix, queries_per_tag, train_per_tag, seed),
                          extra={"kept_rows": keep, "concept_columns": frequent})  # fmt: skip


def load_coco(image_root, image_list, labels=None, image_size: tuple[int, int] = (64, 64), seed: int = 0,
              num_query: int = 5000, num_train: int = 10000, limit: int | None = None) -> HashingDataset:  # fmt: skip
    """MS-COCO with the hashing papers' protocol: multi-hot labels over the 80 categories, images
    without a label dropped, ``num_query`` random queries, the rest the database, ``num_train`` of
    it train (:func:`tfhash.data.splits.random_split`)."""
    paths, list_labels = read_image_list(image_list)
    matrix, _ = _labels_for(list_labels, labels, len(paths), "MS-COCO")
    paths, matrix = paths[:limit], matrix[:limit]
    if matrix.shape[1] != COCO_CATEGORIES:
        raise DataFormatError(f"MS-COCO: the labels have {matrix.shape[1]} columns; expected the {COCO_CATEGORIES} categories")
    keep = np.flatnonzero(matrix.sum(axis=1) > 0)
    images = load_images([paths[i] for i in keep], image_root, image_size)
    return HashingDataset("coco", {"image": images}, matrix[keep], [f"category {i}" for i in range(COCO_CATEGORIES)],
                          random_split(keep.size, num_query, num_train, seed), extra={"kept_rows": keep})  # fmt: skip
