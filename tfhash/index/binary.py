"""Binary Hamming indexes over packed codes."""

from __future__ import annotations

import os

import numpy as np

from tfhash.hamming import knn_search, knn_ties_search, range_search
from tfhash.index.base import (
    PACKED,
    RANGE_SEARCH,
    TRAIN,
    HashIndexError,
    InProcessIndex,
    SearchResult,
    import_backend,
)
from tfhash.index.persistence import IndexFormatError

__all__ = ["BinaryIndex"]


METHODS = ("flat", "ivf", "multihash")
IVF_FILE = "faiss_ivf.index"


def _faiss():
    return import_backend("faiss", "BinaryIndex")


def ids_at(ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """External ids at FAISS ``positions``; ``-1`` where FAISS found nothing (position < 0)."""
    found = positions >= 0
    return np.where(found, ids[np.where(found, positions, 0)], -1).astype(np.int64)


def nearest_first(distances: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The order that sorts hits by distance, then by position (insertion order)."""
    return np.lexsort((positions, distances))


class BinaryIndex(InProcessIndex):
    """Hamming k-NN and range search over packed binary codes with int64 external ids.

    Methods: ``flat``: exact k-NN and range search with tfhash's compiled kernel
    (:mod:`tfhash.hamming`: vectorised popcount, a histogram threshold instead of a heap), ties in
    insertion order, the same answers as FAISS's ``IndexBinaryFlat`` with ``use_heap = False``, which
    the tests and ``benchmarks/index.py`` keep as the reference; it holds nothing but the codes.
    ``ivf``: inverted lists over a binary k-means quantizer (FAISS ``IndexBinaryIVF``), approximate,
    ``nprobe`` lists visited. ``multihash``: multi-index hashing (FAISS ``IndexBinaryMultiHash``),
    approximate for k-NN (an item is found only if one of its sub-codes lies within ``nflip`` bits of
    the query's).

    :class:`~tfhash.index.base.InProcessIndex` keeps the packed codes and external ids (insertion order);
    FAISS holds positions. Removal compacts the arrays and rebuilds the FAISS structure (O(n); an IVF
    keeps its trained quantizer). FAISS is imported when an ``ivf`` or ``multihash`` index is created,
    so ``import tfhash.index`` and ``flat`` work without it.

    Args:
        bits: code length K (multiple of 8).
        method: ``"flat"`` (exact), ``"ivf"`` or ``"multihash"`` (approximate).
        nlist, nprobe: IVF lists and lists visited per query.
        nhash, nflip: multi-index hashing tables and bits flipped per sub-code.
        seed: seed of the IVF k-means.

    Capabilities: :data:`~tfhash.index.base.TRAIN` (trains the IVF quantizer; the other methods
    need no training and ignore it) and :data:`~tfhash.index.base.RANGE_SEARCH`.
    """

    format_family = "binary"
    methods = METHODS
    exact_methods = frozenset({"flat"})
    method_param = "kind"  # the params key of format version 1
    row_layout = PACKED
    rows_file = "codes.npy"
    capabilities = frozenset({TRAIN, RANGE_SEARCH})

    def __init__(self, bits: int, method: str = "flat", nlist: int = 1024, nprobe: int = 16, nhash: int = 4,
                 nflip: int = 1, seed: int = 0):  # fmt: skip
        super().__init__(bits, method)
        if method == "multihash" and self.bits % nhash:
            raise HashIndexError(f"multihash needs bits ({self.bits}) divisible by nhash ({nhash}); pick nhash among the divisors of {self.bits}")
        self.nlist, self.nprobe, self.nhash, self.nflip, self.seed = int(nlist), int(nprobe), int(nhash), int(nflip), int(seed)
        self._faiss = self._new_faiss()

    def _new_faiss(self):
        """The FAISS structure of an approximate method (``None`` for ``flat``: the kernel scans the codes)."""
        if self.method == "flat":
            return None
        faiss = _faiss()
        if self.method == "ivf":
            index = faiss.IndexBinaryIVF(faiss.IndexBinaryFlat(self.bits), self.bits, self.nlist)
            index.nprobe = self.nprobe
            index.cp.seed = self.seed
        else:
            index = faiss.IndexBinaryMultiHash(self.bits, self.nhash, self.bits // self.nhash)
            index.nflip = self.nflip
        return index

    def codes(self) -> np.ndarray:
        """The packed codes in insertion order."""
        return self._rows.copy()

    def settings(self) -> dict:
        if self.method == "ivf":
            return {"nlist": self.nlist, "nprobe": self.nprobe, "seed": self.seed}
        if self.method == "multihash":
            return {"nhash": self.nhash, "nflip": self.nflip}
        return {}

    def _train(self, rows: np.ndarray) -> None:
        """Train the IVF quantizer (other methods need no training). Needs at least ``nlist`` codes."""
        if self.method != "ivf":
            return
        if rows.shape[0] < self.nlist:
            raise HashIndexError(
                f"IVF training needs at least nlist = {self.nlist} codes, got {rows.shape[0]}; "
                f"pass more codes or build with a smaller nlist"
            )
        self._faiss.train(rows)

    def _add_rows(self, rows: np.ndarray) -> None:
        if self._faiss is None:
            return
        if self.method == "ivf" and not self._faiss.is_trained:
            self._train(rows)
        self._faiss.add(rows)

    def _items_removed(self) -> None:
        if self._faiss is None:
            return
        self._faiss.reset()
        if self._rows.shape[0]:
            self._faiss.add(self._rows)

    def _search(self, rows: np.ndarray, k: int) -> SearchResult:
        """``int32`` Hamming distances and ``int64`` ids, nearest first, ties in insertion order
        (exact for ``flat``)."""
        if self._faiss is None:
            distances, positions = knn_search(rows, self._rows, k)
            return SearchResult(distances, self._ids[positions])
        distances, positions = self._faiss.search(rows, k)
        return SearchResult(distances.astype(np.int32), ids_at(self._ids, positions))

    def _search_with_ties(self, rows: np.ndarray, k: int) -> list[SearchResult]:
        """One pass of the compiled kernel (``flat``, the one exact method)."""
        offsets, distances, positions = knn_ties_search(rows, self._rows, k)
        return [SearchResult(distances[offsets[i] : offsets[i + 1]], self._ids[positions[offsets[i] : offsets[i + 1]]])
                for i in range(rows.shape[0])]  # fmt: skip

    def _range_search(self, rows: np.ndarray, radius: int) -> list[SearchResult]:
        """Sorted by distance then insertion order: the "hash lookup" mode of the papers. Exact
        for ``flat``."""
        if self._faiss is None:
            offsets, distances, positions = range_search(rows, self._rows, radius)
            return [SearchResult(distances[offsets[i] : offsets[i + 1]], self._ids[positions[offsets[i] : offsets[i + 1]]])
                    for i in range(rows.shape[0])]  # fmt: skip
        limits, distances, positions = self._faiss.range_search(rows, radius + 1)  # FAISS: d < radius
        results = []
        for i in range(rows.shape[0]):
            d, p = distances[limits[i] : limits[i + 1]], positions[limits[i] : limits[i + 1]]
            order = nearest_first(d, p)
            results.append(SearchResult(d[order].astype(np.int32), self._ids[p[order]]))
        return results

    def _write_structure(self, directory) -> None:
        if self.method == "ivf":
            _faiss().write_index_binary(self._faiss, os.path.join(directory, IVF_FILE))

    def _restore(self, directory, rows: np.ndarray, ids: np.ndarray) -> None:
        """``flat`` searches the stored arrays as they are (mapped ones stay shared); an IVF reads
        its trained quantizer and lists back; ``multihash`` rebuilds from the codes."""
        if self.method == "flat":
            if rows.dtype != np.uint8 or rows.shape[1:] != (self.bits // 8,) or ids.dtype != np.int64 or ids.shape != rows.shape[:1]:
                raise IndexFormatError(f"{directory}: {self.rows_file} holds {rows.dtype} {rows.shape} and ids {ids.dtype} "
                                     f"{ids.shape}; a {self.bits}-bit flat index stores uint8 (n, {self.bits // 8}) and int64 (n,)")  # fmt: skip
            self._rows, self._ids = rows, ids
            return
        if self.method != "ivf":
            super()._restore(directory, rows, ids)
            return
        self._faiss = _faiss().read_index_binary(os.path.join(directory, IVF_FILE))
        self._faiss.nprobe = self.nprobe
        if self._faiss.ntotal != rows.shape[0]:
            raise HashIndexError(
                f"{directory}: the IVF file holds {self._faiss.ntotal} items, {self.rows_file} holds {rows.shape[0]}"
            )
        self._rows, self._ids = rows, ids
