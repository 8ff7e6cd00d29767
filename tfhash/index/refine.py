"""The second stage of a search: Hamming candidates re-ordered by each item's continuous embedding.

A trained code collapses a class to one or a few codes, so Hamming distance cannot order a class's
items (an exact index returns them in insertion order). Keeping each item's continuous code (the
hash head's output before the sign, 8 bits a value) in the index version lets a search order the
Hamming candidates by cosine similarity, as FAISS's ``IndexRefine`` re-ranks vectors. Candidates:
the ``k_factor * k`` Hamming nearest and, from an exact index with range search, every item tied
with the last of them (:meth:`~tfhash.index.base.HashIndex.search_with_ties`). The answer keeps the Hamming distances. :func:`tfhash.index.save_index` stores the
embeddings checksummed beside the codes; :func:`load_embeddings` reads them back.
"""

from __future__ import annotations

import os

import numba
import numpy as np

from tfhash import storage
from tfhash.codes import sign_codes
from tfhash.index.base import (
    RANGE_SEARCH,
    HashIndex,
    HashIndexError,
    SearchResult,
    validate_ids,
    validate_k,
)
from tfhash.index.factory import read_manifest
from tfhash.index.persistence import IndexFormatError, on_local_copy, verify_files

__all__ = ["DEFAULT_K_FACTOR", "EMBEDDINGS_FILE", "EMBEDDING_IDS_FILE", "Embeddings", "quantised_rows", "rerank",
           "refined_search", "load_embeddings"]  # fmt: skip

#: How many Hamming candidates per neighbour asked for the second stage orders by default: 1, the
#: k nearest and every item tied with the k-th, so it re-orders what Hamming order returns and
#: admits nothing farther (chosen on validation rows: benchmarks/results/second_stage_mnist.md and second_stage_cifar10.md).
DEFAULT_K_FACTOR = 1
#: The index version's files of the embeddings: int8 rows, and their int64 ids (ascending).
EMBEDDINGS_FILE, EMBEDDING_IDS_FILE = "embeddings.npy", "embedding_ids.npy"
#: The manifest field that describes stored embeddings.
MANIFEST_FIELD = "embeddings"
#: The largest magnitude of a stored value (:func:`quantised_rows`).
SCALE = 127


def quantised_rows(values, name: str = "embeddings") -> np.ndarray:
    """Rows of continuous codes in 8 bits: each row scaled so that its largest magnitude is
    :data:`SCALE`, rounded to int8 (a zero row stays zero). Only a row's direction counts for the
    cosine, so the scale is not kept; the rounding moves a 48-value row by about 1e-3 in cosine.

    Raises:
        HashIndexError: ``values`` is not 2-D numbers, or holds NaN or infinity.
    """
    values = np.asarray(values)
    if values.ndim != 2 or not (np.issubdtype(values.dtype, np.floating) or np.issubdtype(values.dtype, np.integer)):
        raise HashIndexError(f"{name} must be a 2-D array of numbers (items x values), got {values.dtype} {values.shape}")
    values = values.astype(np.float64)
    if not np.all(np.isfinite(values)):
        raise HashIndexError(f"{name} contain NaN or infinity; pass the finite outputs of the hash head")
    largest = np.abs(values).max(axis=1, keepdims=True) if values.shape[1] else np.zeros((len(values), 1))
    return np.round(values * (SCALE / np.where(largest > 0, largest, 1.0))).astype(np.int8)


@numba.njit(cache=True, nogil=True)
def _similarities(rows, positions, query):  # pragma: no cover - compiled
    """Cosine of ``query`` and each of ``rows[positions]`` times the query's norm (a constant per
    query, so the order is the cosine's): integer dot products, exact, over each row's own norm. An
    item is thus exactly most similar to its own quantised row (Cauchy-Schwarz, with no rounding
    to tip it)."""
    out = np.empty(positions.shape[0], np.float64)
    for i in range(positions.shape[0]):
        dot, norm = 0, 0
        for d in range(query.shape[0]):
            value = np.int64(rows[positions[i], d])
            dot += value * np.int64(query[d])
            norm += value * value
        out[i] = dot / np.sqrt(norm) if norm > 0 else 0.0
    return out


class Embeddings:
    """The 8-bit embeddings of indexed items, by int64 id (kept in ascending id order).

    Args:
        rows: int8 rows (:func:`quantised_rows`), one per id.
        ids: their int64 ids, unique.
    """

    def __init__(self, rows: np.ndarray, ids: np.ndarray):
        ids = validate_ids(ids, rows.shape[0])
        if rows.dtype != np.int8 or rows.ndim != 2:
            raise HashIndexError(f"embedding rows must be int8 (n, dim) from quantised_rows(), got {rows.dtype} {rows.shape}")
        order = np.argsort(ids, kind="stable")
        sorted_already = bool(np.all(order == np.arange(order.size)))
        self.ids, self.rows = (ids, rows) if sorted_already else (ids[order], rows[order])

    @classmethod
    def of(cls, continuous, ids) -> Embeddings:
        """The embeddings of continuous codes (the hash head's outputs) with their ids."""
        return cls(quantised_rows(continuous), np.asarray(ids))

    @property
    def ntotal(self) -> int:
        return int(self.ids.size)

    @property
    def dim(self) -> int:
        return int(self.rows.shape[1])

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Row positions of ``ids``; an id without an embedding is refused."""
        at = np.searchsorted(self.ids, ids)
        found = at < self.ids.size
        found[found] = self.ids[at[found]] == ids[found]
        if not np.all(found):
            missing = np.asarray(ids)[~found][:5].tolist()
            raise HashIndexError(f"ids {missing} have codes in the index but no embedding; store the embeddings "
                                 "of every item the index holds (Embeddings.of(continuous_codes, ids))")  # fmt: skip
        return at

    def check_covers(self, index: HashIndex) -> None:
        """Refuse embeddings that are not exactly one per item of ``index``."""
        if self.ntotal != index.ntotal or (self.ntotal and not np.array_equal(self.ids, np.sort(index.ids()))):
            raise HashIndexError(f"{self.ntotal} embeddings for an index of {index.ntotal} items, not one per item "
                                 "id; store the embeddings of exactly the items the index holds")  # fmt: skip

    def write(self, directory) -> None:
        np.save(os.path.join(directory, EMBEDDINGS_FILE), self.rows, allow_pickle=False)
        np.save(os.path.join(directory, EMBEDDING_IDS_FILE), self.ids, allow_pickle=False)

    def manifest_fields(self) -> dict:
        """What an index version's manifest records of these embeddings: its :data:`MANIFEST_FIELD`
        (their files are named and checksummed with the others)."""
        return {MANIFEST_FIELD: {"count": self.ntotal, "dim": self.dim, "dtype": "int8", "scaled": f"largest magnitude {SCALE}"}}

    @classmethod
    def read(cls, directory, mapped: bool = False) -> Embeddings:
        mode = "c" if mapped else None
        try:
            rows = np.load(os.path.join(directory, EMBEDDINGS_FILE), mmap_mode=mode, allow_pickle=False)
            ids = np.load(os.path.join(directory, EMBEDDING_IDS_FILE), mmap_mode=mode, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise IndexFormatError(f"{directory}: its embeddings cannot be read ({err})") from err
        if rows.dtype != np.int8 or rows.ndim != 2 or ids.dtype != np.int64 or ids.shape != rows.shape[:1]:
            raise IndexFormatError(f"{directory}: {EMBEDDINGS_FILE} holds {rows.dtype} {rows.shape} and ids {ids.dtype} "
                                   f"{ids.shape}; expected int8 (n, dim) and int64 (n,)")  # fmt: skip
        if ids.size > 1 and not np.all(ids[1:] > ids[:-1]):
            raise IndexFormatError(f"{directory}: {EMBEDDING_IDS_FILE} is not in ascending id order")
        embeddings = cls.__new__(cls)
        embeddings.ids, embeddings.rows = ids, rows
        return embeddings


def rerank(candidates: SearchResult, queries: np.ndarray, embeddings: Embeddings, k: int) -> SearchResult:
    """The ``k`` candidates of each query most similar to it by cosine (of the stored 8-bit rows),
    most similar first; equal similarities keep the candidates' order (Hamming distance, then
    insertion).

    Args:
        candidates: a k-NN result (``(queries, c)`` arrays, ``-1`` ids for none) or a list of
            per-query results (a range search).
        queries: ``(queries, dim)`` int8 rows (:func:`quantised_rows`).
        embeddings: the items' embeddings.
        k: neighbours per query; where a query has fewer candidates, the answer is padded with
            id ``-1`` and distance ``-1``.

    Returns:
        ``SearchResult`` of ``(queries, k)`` Hamming distances and ids.
    """
    results = list(zip(*candidates, strict=True)) if isinstance(candidates, SearchResult) else candidates
    if queries.shape != (len(results), embeddings.dim):
        raise HashIndexError(f"query embeddings have shape {queries.shape}; expected ({len(results)}, {embeddings.dim})")
    distances = np.full((len(results), k), -1, dtype=np.int32)
    ids = np.full((len(results), k), -1, dtype=np.int64)
    for i, (found_distances, found_ids) in enumerate(results):
        valid = found_ids >= 0
        found_distances, found_ids = np.asarray(found_distances)[valid], np.asarray(found_ids)[valid]
        similarity = _similarities(embeddings.rows, embeddings.positions(found_ids), queries[i])
        order = _most_similar(similarity, k)
        distances[i, : order.size], ids[i, : order.size] = found_distances[order], found_ids[order]
    return SearchResult(distances, ids)


def _most_similar(similarity: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` largest values, largest first, equal values in position order
    (a partition first: the candidates may be many more than ``k``)."""
    if similarity.size > k:
        threshold = np.partition(similarity, similarity.size - k)[similarity.size - k]
        chosen = np.flatnonzero(similarity >= threshold)
    else:
        chosen = np.arange(similarity.size)
    return chosen[np.lexsort((chosen, -similarity[chosen]))][:k]


def refined_search(index: HashIndex, embeddings: Embeddings, continuous, k: int,
                   k_factor: int = DEFAULT_K_FACTOR) -> SearchResult:  # fmt: skip
    """Search ``index`` with the sign codes of ``continuous`` (the hash head's outputs of the
    queries, :func:`tfhash.codes.sign_codes`) and return its ``k`` nearest re-ordered by cosine
    similarity of the continuous codes among the candidates (the module docstring).

    Raises:
        HashIndexError: bad ``k`` or ``k_factor``, queries of another width than the index's codes
            or the embeddings', an indexed item without an embedding.
    """
    if isinstance(k_factor, bool) or not isinstance(k_factor, (int, np.integer)) or k_factor < 1:
        raise HashIndexError(f"k_factor must be an integer >= 1, got {k_factor!r}")
    k = validate_k(k, index.ntotal)
    queries = quantised_rows(continuous, "queries")
    if queries.shape[1] != index.bits:
        raise HashIndexError(f"queries have {queries.shape[1]} values per row; the index holds {index.bits}-bit codes")
    codes = sign_codes(np.asarray(continuous))  # of the values, not of their 8 bits: a small value may round to 0
    pool = min(index.ntotal, k * int(k_factor))
    if index.exact and index.supports(RANGE_SEARCH):  # the pool and every item tied with its last
        return rerank(index.search_with_ties(codes, pool), queries, embeddings, k)
    return rerank(index.search(codes, pool), queries, embeddings, k)


def load_embeddings(path, mapped: bool = False, *, manifest: dict | None = None) -> Embeddings | None:
    """The embeddings stored in the index version directory ``path`` (None when it has none), after
    their checksums; their count must match the manifest's.

    Args:
        mapped: map the files instead of reading them into memory (as :func:`tfhash.index.load_index`).
        manifest: the manifest of ``path`` that :func:`tfhash.index.load_index` has just read and
            verified every named file of: given, the files are not hashed a second time.

    Raises:
        IndexFormatError: a manifest that names embeddings whose files are missing, corrupt or of
            another count than recorded.
    """
    if storage.is_uri(path):
        return on_local_copy(path, lambda local: load_embeddings(local, mapped, manifest=manifest))
    verified = manifest is not None
    manifest = manifest if verified else read_manifest(path)
    described = manifest.get(MANIFEST_FIELD)
    if described is None:
        return None
    files = {name: manifest["files"].get(name) for name in (EMBEDDINGS_FILE, EMBEDDING_IDS_FILE)}
    if None in files.values():
        raise IndexFormatError(f"{path}: the manifest describes embeddings but does not name their files")
    if not verified:
        verify_files(path, {"files": files})
    embeddings = Embeddings.read(path, mapped)
    if embeddings.ntotal != described.get("count") or embeddings.ntotal != manifest["count"]:
        raise IndexFormatError(f"{path}: {embeddings.ntotal} embeddings; the manifest records {described.get('count')} "
                               f"and {manifest['count']} items")  # fmt: skip
    return embeddings
