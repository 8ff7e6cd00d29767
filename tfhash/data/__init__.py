"""Loaders for the real datasets and their standard retrieval splits (docs/design.md s.5).

``load_dataset(name, data_root=None, seed=0)`` returns a :class:`HashingDataset` of a dataset
under the data root; :func:`load_nuswide` and :func:`load_coco` read a user's copy of those sets
(image list, labels, image folder).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from tfhash.data.cifar10 import load_cifar10
from tfhash.data.dataset import DataFormatError, HashingDataset
from tfhash.data.image_lists import load_coco, load_nuswide, per_tag_split
from tfhash.data.mirflickr import load_mirflickr25k
from tfhash.data.mnist import load_mnist
from tfhash.data.paths import ENV_VAR, DataNotFoundError, find_data_file
from tfhash.data.splits import Split, fixed_split, per_class_split, random_split, validation_split
from tfhash.data.wiki import load_wiki

LOADERS: dict[str, Callable[..., HashingDataset]] = {
    "mnist": load_mnist,
    "cifar10": load_cifar10,
    "mirflickr25k": load_mirflickr25k,
    "wiki": load_wiki,
}


def load_dataset(name: str, data_root: str | os.PathLike | None = None, seed: int = 0) -> HashingDataset:
    """Load one of :data:`LOADERS` by name with its standard split drawn from ``seed``."""
    if name not in LOADERS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(LOADERS)}")
    return LOADERS[name](data_root=data_root, seed=seed)


__all__ = [
    "ENV_VAR",
    "LOADERS",
    "DataFormatError",
    "DataNotFoundError",
    "HashingDataset",
    "Split",
    "find_data_file",
    "fixed_split",
    "load_cifar10",
    "load_coco",
    "load_dataset",
    "load_mirflickr25k",
    "load_mnist",
    "load_nuswide",
    "load_wiki",
    "per_class_split",
    "per_tag_split",
    "random_split",
    "validation_split",
]
