"""MIRFlickr-25K, the 20,015-pair DCMH subset: tag bag-of-words (text modality) and 24 labels.

The image modality is not available offline; this loader returns the text modality only.
"""

from __future__ import annotations

import os

import numpy as np
import scipy.io

from tfhash.data.dataset import DataFormatError, HashingDataset
from tfhash.data.paths import find_data_file
from tfhash.data.splits import random_split

__all__ = ["load_mirflickr25k_arrays", "load_mirflickr25k"]


TAGS_FILE = "mirflickr25k/mirflickr25k-yall.mat"
LABELS_FILE = "mirflickr25k/mirflickr25k-lall.mat"
LABEL_NAMES = [
    "animals", "baby", "bird", "car", "clouds", "dog", "female", "flower", "food", "indoor",
    "lake", "male", "night", "people", "plant_life", "portrait", "river", "sea", "sky",
    "structures", "sunset", "transport", "tree", "water",
]  # fmt: skip


def _load_mat_variable(path: os.PathLike, variable: str) -> np.ndarray:
    try:
        content = scipy.io.loadmat(path, variable_names=[variable])
    except Exception as err:  # scipy raises ValueError / MatReadError / OSError for bad files
        raise DataFormatError(f"{path}: cannot read MATLAB file ({err})") from err
    if variable not in content:
        raise DataFormatError(f"{path}: variable {variable!r} is missing")
    return np.asarray(content[variable])


def load_mirflickr25k_arrays(
    data_root: str | os.PathLike | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Tags ``float32`` (20015, 1386) binary bag-of-words and labels ``uint8`` (20015, 24)."""
    tags = _load_mat_variable(find_data_file(TAGS_FILE, data_root), "YAll")
    labels = _load_mat_variable(find_data_file(LABELS_FILE, data_root), "LAll")
    if tags.shape[0] != labels.shape[0] or labels.shape[1] != len(LABEL_NAMES):
        raise DataFormatError(f"MIRFlickr: tags {tags.shape} and labels {labels.shape} disagree")
    return tags.astype(np.float32), (labels > 0).astype(np.uint8)


def load_mirflickr25k(
    data_root: str | os.PathLike | None = None, seed: int = 0
) -> HashingDataset:
    """MIRFlickr-25K (tags) with the standard protocol: 2,000 queries, the rest is the database,
    10,000 of the database train. Relevant = shares at least one label."""
    tags, labels = load_mirflickr25k_arrays(data_root)
    return HashingDataset(
        name="mirflickr25k",
        inputs={"text": tags},
        labels=labels,
        class_names=list(LABEL_NAMES),
        split=random_split(labels.shape[0], 2000, 10000, seed=seed),
    )
