"""Binary Hamming indexes over packed codes, backed by FAISS binary indexes.

``flat``: exact k-NN (``IndexBinaryFlat`` with its counting search, ``use_heap = False``, which
returns ties in insertion order). ``ivf``: inverted lists over a binary k-means quantizer
(``IndexBinaryIVF``), approximate, ``nprobe`` lists visited. ``multihash``: multi-index hashing
(``IndexBinaryMultiHash``), approximate for k-NN (an item is found only if one of its sub-codes
lies within ``nflip`` bits of the query's).

The index keeps the packed codes and external ids itself (insertion order); FAISS holds positions.
Removal compacts the arrays and rebuilds the FAISS structure (O(n); an IVF keeps its trained
quantizer).
"""

from __future__ import annotations

import os

import faiss
import numpy as np

from tfhash.codes import as_packed, hamming_distances
from tfhash.index.base import HashIndex, IndexError_, SearchResult, validate_ids, validate_k

KINDS = ("flat", "ivf", "multihash")


class BinaryIndex(HashIndex):
    """Hamming k-NN and range search over packed binary codes with int64 external ids.

    Args:
        bits: code length K (multiple of 8).
        kind: ``"flat"`` (exact), ``"ivf"`` or ``"multihash"`` (approximate).
        nlist, nprobe: IVF lists and lists visited per query.
        nhash, nflip: multi-index hashing tables and bits flipped per sub-code.
        seed: seed of the IVF k-means.
    """

    def __init__(self, bits: int, kind: str = "flat", nlist: int = 1024, nprobe: int = 16, nhash: int = 4,
                 nflip: int = 1, seed: int = 0):  # fmt: skip
        super().__init__(bits)
        if kind not in KINDS:
            raise IndexError_(f"unknown binary index kind {kind!r}; choose one of {KINDS}")
        if kind == "multihash" and bits % nhash:
            raise IndexError_(f"multihash needs bits ({bits}) divisible by nhash ({nhash})")
        self.kind, self.exact = f"binary-{kind}", kind == "flat"
        self._kind = kind
        self.nlist, self.nprobe, self.nhash, self.nflip, self.seed = int(nlist), int(nprobe), int(nhash), int(nflip), int(seed)
        self._codes = np.zeros((0, bits // 8), dtype=np.uint8)
        self._ids = np.zeros(0, dtype=np.int64)
        self._faiss = self._new_faiss()

    def _new_faiss(self):
        if self._kind == "flat":
            index = faiss.IndexBinaryFlat(self.bits)
            index.use_heap = False
        elif self._kind == "ivf":
            index = faiss.IndexBinaryIVF(faiss.IndexBinaryFlat(self.bits), self.bits, self.nlist)
            index.nprobe = self.nprobe
            index.cp.seed = self.seed
        else:
            index = faiss.IndexBinaryMultiHash(self.bits, self.nhash, self.bits // self.nhash)
            index.nflip = self.nflip
        return index

    @property
    def ntotal(self) -> int:
        return int(self._ids.size)

    def ids(self) -> np.ndarray:
        return self._ids.copy()

    def codes(self) -> np.ndarray:
        return self._codes.copy()

    def params(self) -> dict:
        out: dict = {"kind": self._kind}
        if self._kind == "ivf":
            out.update(nlist=self.nlist, nprobe=self.nprobe, seed=self.seed)
        if self._kind == "multihash":
            out.update(nhash=self.nhash, nflip=self.nflip)
        return out

    def train(self, codes) -> None:
        """Train the IVF quantizer (other kinds need no training). Needs at least ``nlist`` codes."""
        if self._kind != "ivf":
            return
        packed = as_packed(codes)
        if packed.shape[0] < self.nlist:
            raise IndexError_(f"IVF training needs at least nlist = {self.nlist} codes, got {packed.shape[0]}")
        self._faiss.train(packed)

    def add(self, codes, ids=None) -> None:
        packed = as_packed(codes)
        if packed.shape[1] * 8 != self.bits:
            raise IndexError_(f"codes have {packed.shape[1] * 8} bits, the index has {self.bits}")
        if ids is None:
            start = int(self._ids.max()) + 1 if self._ids.size else 0
            ids = np.arange(start, start + packed.shape[0])
        ids = validate_ids(ids, packed.shape[0], self._ids)
        if self._kind == "ivf" and not self._faiss.is_trained:
            self.train(packed)
        self._faiss.add(packed)
        self._codes = np.concatenate([self._codes, packed])
        self._ids = np.concatenate([self._ids, ids])

    def remove(self, ids) -> int:
        ids = np.asarray(ids, dtype=np.int64)
        keep = ~np.isin(self._ids, ids)
        removed = int((~keep).sum())
        if removed:
            self._codes, self._ids = self._codes[keep], self._ids[keep]
            self._faiss.reset()
            if self._codes.shape[0]:
                self._faiss.add(self._codes)
        return removed

    def search(self, queries, k: int) -> SearchResult:
        """The k nearest codes of each query: ``int32`` Hamming distances and ``int64`` ids, nearest
        first, ties in insertion order (exact for ``flat``)."""
        packed = self.packed_queries(queries)
        k = validate_k(k, self.ntotal)
        distances, positions = self._faiss.search(packed, k)
        found = positions >= 0
        ids = np.where(found, self._ids[np.where(found, positions, 0)], -1)
        return SearchResult(distances.astype(np.int32), ids.astype(np.int64))

    def range_search(self, queries, radius: int) -> list[SearchResult]:
        """All items within Hamming distance ``radius`` (inclusive) of each query, sorted by
        distance then insertion order: the "hash lookup" mode of the papers. Exact for ``flat``."""
        packed = self.packed_queries(queries)
        if radius < 0:
            raise IndexError_(f"radius must be >= 0, got {radius}")
        if self.ntotal == 0:
            return [SearchResult(np.zeros(0, np.int32), np.zeros(0, np.int64)) for _ in range(packed.shape[0])]
        limits, distances, positions = self._faiss.range_search(packed, int(radius) + 1)  # FAISS: d < radius
        results = []
        for i in range(packed.shape[0]):
            d, p = distances[limits[i] : limits[i + 1]], positions[limits[i] : limits[i + 1]]
            order = np.lexsort((p, d))
            results.append(SearchResult(d[order].astype(np.int32), self._ids[p[order]]))
        return results

    def write_files(self, directory) -> None:
        np.save(os.path.join(directory, "codes.npy"), self._codes, allow_pickle=False)
        np.save(os.path.join(directory, "ids.npy"), self._ids, allow_pickle=False)
        if self._kind == "ivf":
            faiss.write_index_binary(self._faiss, os.path.join(directory, "faiss_ivf.index"))

    @classmethod
    def read_files(cls, directory, bits: int, params: dict) -> BinaryIndex:
        index = cls(bits, **params)
        codes = np.load(os.path.join(directory, "codes.npy"), allow_pickle=False)
        ids = np.load(os.path.join(directory, "ids.npy"), allow_pickle=False)
        if index._kind == "ivf":
            index._faiss = faiss.read_index_binary(os.path.join(directory, "faiss_ivf.index"))
            index._faiss.nprobe = index.nprobe
            if index._faiss.ntotal != codes.shape[0]:
                raise IndexError_("IVF file and codes disagree on the number of items")
            index._codes, index._ids = codes, ids
        elif codes.shape[0]:
            index.add(codes, ids)
        return index


def brute_force_search(db_packed: np.ndarray, queries_packed: np.ndarray, k: int) -> SearchResult:
    """Reference exact search with the stable tie order (positions as ids)."""
    distances = hamming_distances(queries_packed, db_packed)
    order = np.argsort(distances, axis=1, kind="stable")[:, :k]
    return SearchResult(np.take_along_axis(distances, order, axis=1).astype(np.int32), order.astype(np.int64))
