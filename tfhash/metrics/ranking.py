"""Validated inputs of the retrieval metrics (docs/design.md s.2-3): packed code words and label
bitmasks, the form :mod:`tfhash.metrics.kernels` consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tfhash.codes import as_packed
from tfhash.hamming import code_words


@dataclass(frozen=True)
class RetrievalProblem:
    """Codes as packed words (:func:`tfhash.hamming.code_words`: ``uint64`` when K is a multiple of
    64) and labels as ``uint64`` bitmasks (bit c of a row set when the item carries class c); an
    item is relevant to a query when their masks share a bit."""

    query_words: np.ndarray
    db_words: np.ndarray
    query_labels: np.ndarray
    db_labels: np.ndarray
    bits: int

    @property
    def num_queries(self) -> int:
        return self.query_words.shape[0]

    @property
    def num_database(self) -> int:
        return self.db_words.shape[0]


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


def label_bitmasks(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Class ids ``(n,)`` or multi-hot ``(n, C)`` -> ``uint64`` ``(n, ceil(C / 64))`` bitmasks."""
    if labels.ndim == 1:
        if labels.size and labels.max() >= num_classes:
            raise ValueError(f"class id {labels.max()} is outside the {num_classes} classes")
        multi_hot = np.zeros((labels.size, num_classes), dtype=bool)
        multi_hot[np.arange(labels.size), labels] = True
    else:
        multi_hot = labels > 0
    words = max(1, -(-num_classes // 64))
    padded = np.zeros((multi_hot.shape[0], words * 64), dtype=bool)
    padded[:, : multi_hot.shape[1]] = multi_hot
    return np.ascontiguousarray(np.packbits(padded, axis=1, bitorder="little").view(np.uint64))


def prepare(query_codes, db_codes, query_labels, db_labels) -> RetrievalProblem:
    """Validate and normalise one retrieval problem.

    Args:
        query_codes, db_codes: +-1 codes ``(n, K)`` (any numeric dtype) or packed ``uint8``
            ``(n, K/8)``.
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
    widths = {lab.shape[1] for lab in (query_labels, db_labels) if lab.ndim == 2}
    if len(widths) > 1:
        raise ValueError(f"query labels have {query_labels.shape[1]} classes, database labels {db_labels.shape[1]}")
    if widths:
        num_classes = widths.pop()
    else:
        num_classes = int(max(query_labels.max(initial=0), db_labels.max(initial=0))) + 1
    return RetrievalProblem(
        code_words(query_packed),
        code_words(db_packed),
        label_bitmasks(query_labels, num_classes),
        label_bitmasks(db_labels, num_classes),
        query_packed.shape[1] * 8,
    )
