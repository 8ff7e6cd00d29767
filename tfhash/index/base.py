"""The small abstract index every tfhash index implements (add / search / save / load)."""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np

from tfhash.codes import as_packed


class IndexError_(ValueError):
    """Invalid use of an index (bad k, unknown ids, wrong code width)."""


@dataclass
class SearchResult:
    """``distances`` and ``ids`` of shape ``(queries, k)``, nearest first."""

    distances: np.ndarray
    ids: np.ndarray


def validate_k(k: int, ntotal: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise IndexError_(f"k must be an integer, got {k!r}")
    if k <= 0:
        raise IndexError_(f"k must be >= 1, got {k}")
    if k > ntotal:
        raise IndexError_(f"k = {k} is larger than the {ntotal} items in the index")
    return int(k)


def validate_ids(ids, count: int, existing: np.ndarray | None = None) -> np.ndarray:
    """Return ``int64`` ids of length ``count``; refuse duplicates within the batch and ids
    already in ``existing``."""
    ids = np.asarray(ids)
    if ids.shape != (count,):
        raise IndexError_(f"expected {count} ids, got shape {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise IndexError_(f"ids must be integers, got {ids.dtype}")
    ids = ids.astype(np.int64)
    if np.unique(ids).size != ids.size:
        raise IndexError_("ids must be unique")
    if existing is not None and existing.size and np.isin(ids, existing).any():
        raise IndexError_("some ids are already in the index; use upsert() to replace them")
    return ids


class HashIndex(abc.ABC):
    """Codes with int64 external ids. Subclasses set ``kind`` and ``exact``.

    Ties in distance are returned in insertion order (the database index of DESIGN.md s.3) by the
    exact kinds; approximate kinds make no promise about ties.
    """

    kind: str = ""
    exact: bool = False

    def __init__(self, bits: int):
        if bits <= 0 or bits % 8:
            raise IndexError_(f"bits must be a positive multiple of 8, got {bits}")
        self.bits = int(bits)

    @property
    @abc.abstractmethod
    def ntotal(self) -> int: ...

    @abc.abstractmethod
    def add(self, codes, ids=None) -> None: ...

    @abc.abstractmethod
    def remove(self, ids) -> int: ...

    @abc.abstractmethod
    def search(self, queries, k: int) -> SearchResult: ...

    @abc.abstractmethod
    def params(self) -> dict:
        """Constructor parameters (JSON-ready), recorded in the manifest."""

    @abc.abstractmethod
    def write_files(self, directory) -> None:
        """Write the index's data files into ``directory`` (no pickle)."""

    @classmethod
    @abc.abstractmethod
    def read_files(cls, directory, bits: int, params: dict) -> HashIndex: ...

    def upsert(self, codes, ids) -> None:
        """Replace the items with these ids (or add them when new)."""
        ids = np.asarray(ids, dtype=np.int64)
        self.remove(ids[np.isin(ids, self.ids())])
        self.add(codes, ids)

    @abc.abstractmethod
    def ids(self) -> np.ndarray:
        """External ids in insertion order."""

    def packed_queries(self, queries) -> np.ndarray:
        packed = as_packed(queries, "queries")
        if packed.shape[1] * 8 != self.bits:
            raise IndexError_(f"queries have {packed.shape[1] * 8} bits, the index has {self.bits}")
        return packed

    def describe(self) -> dict:
        return {"kind": self.kind, "bits": self.bits, "count": self.ntotal, "exact": self.exact, "params": self.params()}

    def save(self, path, model_version: str | None = None, signature_fingerprint: str | None = None) -> None:
        """Persist atomically to the directory ``path`` with a manifest (see :mod:`.persistence`)."""
        from tfhash.index.persistence import save_index

        save_index(self, path, model_version, signature_fingerprint)
