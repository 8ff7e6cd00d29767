"""The shared engine of the retrieval metrics: validated inputs, chunked Hamming distances,
relevance and histograms over distances (DESIGN.md s.2-3). The ranking statistics themselves are
computed by :mod:`tfhash.metrics.kernels` without sorting.

Memory is bounded by processing queries in chunks: a chunk holds a few ``(m, n)`` arrays and the
chunk size ``m`` is chosen so that they stay under ``max_chunk_bytes``; nothing of size
``queries x database`` is ever materialised.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tfhash.codes import as_packed, hamming_distances, unpack_codes

#: Default memory budget of one query chunk (bytes).
DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024
#: Largest float32 copy of the database (bytes) for which distances come from a matrix product.
MAX_FLOAT_DATABASE_BYTES = 1024 * 1024 * 1024
# Bytes held per (query, database item) pair in a chunk: float32 products, bool relevance, and
# when histograms are asked for, uint16 distances and their int64 bin indices.
_BYTES_PER_PAIR = 16


@dataclass(frozen=True)
class RetrievalProblem:
    """Validated, packed codes and normalised labels of one query set against one database.

    Labels are kept either as integer class ids (1-D, single-label) or as ``float32`` multi-hot
    matrices (2-D); relevance of (q, x) is "share at least one label" in both cases.
    """

    query_packed: np.ndarray
    db_packed: np.ndarray
    query_labels: np.ndarray
    db_labels: np.ndarray
    bits: int

    @property
    def num_queries(self) -> int:
        return self.query_packed.shape[0]

    @property
    def num_database(self) -> int:
        return self.db_packed.shape[0]


def _normalise_labels(labels: np.ndarray, name: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim not in (1, 2):
        raise ValueError(f"{name} must be class ids (n,) or multi-hot (n, C), got shape {labels.shape}")
    if not (np.issubdtype(labels.dtype, np.number) or labels.dtype == np.bool_):
        raise TypeError(f"{name} must be numeric, got {labels.dtype}")
    if labels.ndim == 2 and np.issubdtype(labels.dtype, np.floating) and not np.all(np.isfinite(labels)):
        raise ValueError(f"{name} contain NaN or infinity")
    if labels.ndim == 1 and not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f"{name}: 1-D labels must be integer class ids, got {labels.dtype}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"{name} must not be negative")
    return labels


def _label_forms(query_labels: np.ndarray, db_labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bring both label arrays to one form: integer ids when both are single-label, otherwise
    ``float32`` multi-hot with the same number of classes."""
    if query_labels.ndim == 2 and db_labels.ndim == 2 and query_labels.shape[1] != db_labels.shape[1]:
        raise ValueError(
            f"query labels have {query_labels.shape[1]} classes, database labels {db_labels.shape[1]}"
        )

    def is_one_hot(labels: np.ndarray) -> bool:
        return labels.ndim == 2 and bool(np.all((labels > 0).sum(axis=1) == 1))

    if (query_labels.ndim == 1 or is_one_hot(query_labels)) and (db_labels.ndim == 1 or is_one_hot(db_labels)):
        as_ids = [lab if lab.ndim == 1 else (lab > 0).argmax(axis=1) for lab in (query_labels, db_labels)]
        return as_ids[0].astype(np.int64), as_ids[1].astype(np.int64)
    num_classes = max(lab.shape[1] for lab in (query_labels, db_labels) if lab.ndim == 2)

    def as_multi_hot(labels: np.ndarray) -> np.ndarray:
        if labels.ndim == 2:
            return (labels > 0).astype(np.float32)
        if labels.size and labels.max() >= num_classes:
            raise ValueError(f"class id {labels.max()} is outside the {num_classes} classes")
        out = np.zeros((labels.size, num_classes), dtype=np.float32)
        out[np.arange(labels.size), labels] = 1.0
        return out

    return as_multi_hot(query_labels), as_multi_hot(db_labels)


def prepare(query_codes, db_codes, query_labels, db_labels) -> RetrievalProblem:
    """Validate and normalise one retrieval problem.

    Args:
        query_codes, db_codes: +-1 codes ``(n, K)`` (any numeric dtype) or packed ``uint8``
            ``(n, K/8)``; both in the same form and width.
        query_labels, db_labels: integer class ids ``(n,)`` or one-hot / multi-hot ``(n, C)``.

    Raises:
        ValueError / TypeError: on mismatched counts, widths, class counts, an empty database,
        non-binary codes or invalid labels; the message names the argument.
    """
    query_packed = as_packed(query_codes, "query_codes")
    db_packed = as_packed(db_codes, "db_codes")
    if query_packed.shape[1] != db_packed.shape[1]:
        raise ValueError(
            f"query codes have {query_packed.shape[1] * 8} bits, database codes {db_packed.shape[1] * 8}"
        )
    if db_packed.shape[0] == 0:
        raise ValueError("the database is empty")
    query_labels = _normalise_labels(query_labels, "query_labels")
    db_labels = _normalise_labels(db_labels, "db_labels")
    for codes, labels, name in ((query_packed, query_labels, "query"), (db_packed, db_labels, "database")):
        if codes.shape[0] != labels.shape[0]:
            raise ValueError(f"{name}: {codes.shape[0]} codes but {labels.shape[0]} label rows")
    query_labels, db_labels = _label_forms(query_labels, db_labels)
    return RetrievalProblem(query_packed, db_packed, query_labels, db_labels, query_packed.shape[1] * 8)


def relevance(query_labels: np.ndarray, db_labels: np.ndarray) -> np.ndarray:
    """``(m, n)`` bool: database item shares at least one label with the query (DESIGN.md s.3)."""
    if query_labels.ndim == 1:
        return query_labels[:, None] == db_labels[None, :]
    return (query_labels @ db_labels.T) > 0.5


def chunk_size_for(num_database: int, bits: int, max_chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Number of queries per chunk that keeps one chunk under ``max_chunk_bytes``."""
    per_query = num_database * (_BYTES_PER_PAIR + bits // 8)
    return max(1, int(max_chunk_bytes // max(per_query, 1)))


@dataclass
class Chunk:
    """One block of queries: their rows, relevance ``(m, n)`` and either the +-1 dot products
    ``(m, n)`` float32 (matrix-product path) or the distances (popcount path). ``distances`` is
    derived on first use: d = (K - q.x) / 2."""

    rows: slice
    relevant: np.ndarray
    bits: int
    products: np.ndarray | None = None
    _distances: np.ndarray | None = None

    @property
    def distances(self) -> np.ndarray:
        if self._distances is None:
            self._distances = np.rint((self.bits - self.products) * 0.5).astype(np.uint16)
        return self._distances


def iter_chunks(problem: RetrievalProblem, max_chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[Chunk]:
    """Yield :class:`Chunk` objects covering every query in order.

    Distances come from a float32 matrix product of the +-1 codes, d = (K - q.x) / 2, which is
    exact (the products are small integers) and runs on BLAS; when a float32 copy of the database
    would exceed :data:`MAX_FLOAT_DATABASE_BYTES`, from XOR + popcount of the packed codes.
    """
    step = chunk_size_for(problem.num_database, problem.bits, max_chunk_bytes)
    use_product = problem.num_database * problem.bits * 4 <= MAX_FLOAT_DATABASE_BYTES
    db_float_t = np.ascontiguousarray(unpack_codes(problem.db_packed).astype(np.float32).T) if use_product else None
    for start in range(0, problem.num_queries, step):
        rows = slice(start, min(start + step, problem.num_queries))
        relevant = relevance(problem.query_labels[rows], problem.db_labels)
        if use_product:
            query_float = unpack_codes(problem.query_packed[rows]).astype(np.float32)
            yield Chunk(rows, relevant, problem.bits, products=query_float @ db_float_t)
        else:
            distances = hamming_distances(problem.query_packed[rows], problem.db_packed)
            yield Chunk(rows, relevant, problem.bits, _distances=distances)


def distance_histograms(chunk: Chunk, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query, how many database items (and how many relevant ones) lie at each distance
    0..K: two ``(m, K + 1)`` ``int64`` arrays."""
    m = chunk.distances.shape[0]
    width = bits + 1
    flat = (np.arange(m)[:, None] * width + chunk.distances).ravel()
    counts = np.bincount(flat, minlength=m * width).reshape(m, width)
    relevant = np.bincount(flat, weights=chunk.relevant.ravel(), minlength=m * width)
    return counts, np.rint(relevant).astype(np.int64).reshape(m, width)
