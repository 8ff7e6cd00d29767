"""Wikipedia cross-modal dataset (Rasiwasia et al.): 128-d SIFT BoW images, 10-d LDA texts."""

from __future__ import annotations

import os

import h5py
import numpy as np

from tfhash.data.dataset import DataFormatError, HashingDataset
from tfhash.data.paths import find_data_file
from tfhash.data.splits import fixed_split
from tfhash.labels import multi_hot

__all__ = ["load_wiki"]


FILE = "wiki/wiki_data.mat"
CLASS_NAMES = [
    "art", "biology", "geography", "history", "literature", "media", "music", "royalty",
    "sport", "warfare",
]  # fmt: skip


def load_wiki_arrays(
    data_root: str | os.PathLike | None = None,
) -> dict[str, np.ndarray]:
    """The six arrays of the MATLAB v7.3 file, transposed to samples x features:
    ``I_tr``, ``T_tr``, ``L_tr`` (2,173 pairs) and ``I_te``, ``T_te``, ``L_te`` (693 pairs)."""
    path = find_data_file(FILE, data_root)
    try:
        with h5py.File(path, "r") as handle:
            arrays = {key: np.asarray(handle[key]).T for key in ("I_tr", "T_tr", "L_tr", "I_te", "T_te", "L_te")}
    except KeyError as err:
        raise DataFormatError(f"{path}: missing variable ({err})") from err
    except OSError as err:
        raise DataFormatError(f"{path}: not a readable MATLAB v7.3 / HDF5 file ({err})") from err
    for part in ("tr", "te"):
        rows = {arrays[f"{m}_{part}"].shape[0] for m in "ITL"}
        if len(rows) != 1:
            raise DataFormatError(f"{path}: the {part} arrays disagree on the number of pairs")
    return arrays


def load_wiki(data_root: str | os.PathLike | None = None, seed: int = 0) -> HashingDataset:
    """Wiki with its fixed protocol: the 693 test pairs are queries, the 2,173 train pairs are the
    database and the training set. Rows are train pairs then test pairs."""
    arrays = load_wiki_arrays(data_root)
    labels = np.concatenate([arrays["L_tr"], arrays["L_te"]]).astype(np.float64)
    if labels.ndim == 1 or labels.shape[1] == 1:  # stored as class ids rather than one-hot
        ids = labels.reshape(-1).astype(np.int64)
        ids = ids - ids.min()
        tags = multi_hot(ids, len(CLASS_NAMES), dtype=np.uint8)
    else:
        tags = multi_hot(labels, len(CLASS_NAMES), dtype=np.uint8)
    n_train = arrays["L_tr"].shape[0]
    n_total = tags.shape[0]
    return HashingDataset(
        name="wiki",
        inputs={
            "image": np.concatenate([arrays["I_tr"], arrays["I_te"]]).astype(np.float32),
            "text": np.concatenate([arrays["T_tr"], arrays["T_te"]]).astype(np.float32),
        },
        labels=tags,
        class_names=list(CLASS_NAMES),
        split=fixed_split(np.arange(n_train, n_total), np.arange(n_train), seed=seed),
    )
