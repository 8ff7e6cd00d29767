"""The inputs and splits of the peer protocol (docs/design.md s.11), bit for bit.

The peers were measured on fixed inputs: MNIST pixels / 255, CIFAR-10 ImageNet SqueezeNet v1.1
features (224x224, global average pool of fire9) in a seeded permutation of the JPEG order, and
MIRFlickr-25K tags; with the protocol's own splits (not tfhash's :mod:`tfhash.data.splits`, whose
draw order differs). :func:`load_peer_data` rebuilds them and checks every array against the
digests the protocol publishes, so a comparison with the bar is on identical inputs or fails.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfhash.data.cifar10 import load_cifar10_arrays
from tfhash.data.mirflickr import load_mirflickr25k_arrays
from tfhash.data.mnist import load_mnist_arrays
from tfhash.data.splits import Split
from tfhash.labels import multi_hot

DATASETS = ("mnist", "cifar10", "mirflickr")
#: sha256 of the C-contiguous bytes, first 16 hex digits, as the protocol publishes them.
DIGESTS = {
    "mnist": {"x": "d27fb91380ff036e", "labels": "818800b46032126b", "split": "9e2db8b1d3a3778a"},
    "cifar10": {"x": "9ed5ef42c9c814bd", "labels": "9e88cffdaebbe5d2", "split": "9ab07d8795edbcf0"},
    "mirflickr": {"x": "c7343cfaa37e67a1", "labels": "45a6312e4266dc6e", "split": "85d5dbde1746a6c3"},
}
CIFAR10_PERMUTATION_SEED = 2024
SPLIT_SEED = 0


class PeerDataError(ValueError):
    """Inputs that are not the protocol's."""


def digest(*arrays: np.ndarray) -> str:
    """sha256 over the arrays' C-contiguous bytes, in order; first 16 hex digits."""
    h = hashlib.sha256()
    for array in arrays:
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:16]


def single_label_split(labels: np.ndarray, num_query: int = 100, num_train: int = 500, seed: int = SPLIT_SEED) -> Split:
    """Per class in ascending order, a permutation of its members: the first ``num_query`` are
    queries, the next ``num_train`` train; the database is every non-query item; all sorted."""
    rng = np.random.default_rng(seed)
    query, train = [], []
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        query.append(members[:num_query])
        train.append(members[num_query : num_query + num_train])
    query = np.sort(np.concatenate(query))
    database = np.setdiff1d(np.arange(labels.size), query)
    return Split(query, database, np.sort(np.concatenate(train)), seed, "peer single-label")


def multi_label_split(n: int, num_query: int = 2000, num_train: int = 10000, seed: int = SPLIT_SEED) -> Split:
    """A permutation: its first ``num_query`` are queries, the rest the database, ``num_train``
    of the database drawn without replacement train; all sorted."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    query, database = np.sort(perm[:num_query]), np.sort(perm[num_query:])
    train = np.sort(rng.choice(database, num_train, replace=False))
    return Split(query, database, train, seed, "peer multi-label")


@dataclass
class PeerData:
    """One dataset of the protocol: inputs ``x`` (float32), multi-hot ``labels`` (uint8), split."""

    name: str
    x: np.ndarray
    labels: np.ndarray
    split: Split
    checks: dict  # what was verified: array -> "digest" or the fallback's value

    @property
    def single_label(self) -> bool:
        return bool((self.labels.sum(axis=1) == 1).all())


def cifar10_features(images: np.ndarray, batch_size: int = 250) -> np.ndarray:
    """The protocol's CIFAR-10 inputs: tfhash's SqueezeNet v1.1 with the shared ImageNet weights at
    224x224 (bilinear upsampling, Caffe preprocessing, fire9 average-pooled), float32 (n, 512)."""
    from tfhash.models import squeezenet

    network = squeezenet(input_shape=(224, 224, 3), resize_from=images.shape[1:])
    return network.predict(images, batch_size=batch_size, verbose=0).astype(np.float32)


def _check(name: str, part: str, value: str, checks: dict) -> None:
    if value != DIGESTS[name][part]:
        hint = " (features: float rounding of another TF build or CPU? see check_features)" if part == "x" else ""
        raise PeerDataError(f"{name} {part}: digest {value} is not the protocol's {DIGESTS[name][part]}; the inputs "
                            f"differ from the peers' and the comparison would not be fair{hint}")  # fmt: skip
    checks[part] = "digest"


def load_peer_data(name: str, cache_dir: str | os.PathLike | None = None, data_root=None,
                   check_features: bool = True) -> PeerData:  # fmt: skip
    """The protocol's ``name`` (one of :data:`DATASETS`), digests checked.

    CIFAR-10 features take minutes to compute on a CPU; with ``cache_dir`` they are kept there
    (keyed by the image digest) and reused. Their digest holds for TF 2.16.2 on the project's
    machines; where float rounding differs (another TF build or CPU) ``check_features=False``
    skips that one check, and the result records it.

    Raises:
        PeerDataError: an input, label set or split that does not match the protocol.
    """
    checks: dict = {}
    if name == "mnist":
        images, ids = load_mnist_arrays(data_root)
        x = (images.reshape(len(images), -1) / 255.0).astype(np.float32)
    elif name == "cifar10":
        images, ids = load_cifar10_arrays(data_root)
        order = np.random.default_rng(CIFAR10_PERMUTATION_SEED).permutation(len(ids))
        images, ids = images[order], ids[order]
        x = _cached_features(images, cache_dir)
    elif name == "mirflickr":
        x, labels = load_mirflickr25k_arrays(data_root)
        ids = None
    else:
        raise ValueError(f"unknown protocol dataset {name!r}; choose one of {DATASETS}")
    if ids is not None:
        ids = ids.astype(np.int64)
        _check(name, "labels", digest(ids), checks)
        split, labels = single_label_split(ids), multi_hot(ids, 10, dtype=np.uint8)
    else:
        _check(name, "labels", digest(labels), checks)
        split = multi_label_split(len(labels))
    _check(name, "split", digest(split.query.astype(np.int64), split.database.astype(np.int64),
                                 split.train.astype(np.int64)), checks)  # fmt: skip
    if name == "cifar10" and not check_features:
        checks["x"] = f"not checked (digest {digest(x)})"
    else:
        _check(name, "x", digest(x), checks)
    return PeerData(name, x, labels.astype(np.uint8), split, checks)


def _cached_features(images: np.ndarray, cache_dir) -> np.ndarray:
    if cache_dir is None:
        return cifar10_features(images)
    path = Path(cache_dir) / f"cifar10-squeezenet224-{digest(images)}.npy"
    if path.is_file():
        return np.load(path)
    x = cifar10_features(images)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, x)
    os.replace(tmp, path)
    return x
