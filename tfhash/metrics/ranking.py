"""Validated inputs of the retrieval metrics (docs/design.md s.2-3): packed code words and label
bitmasks, the form :mod:`tfhash.metrics.kernels` consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tfhash.codes import as_packed
from tfhash.hamming import code_words
from tfhash.labels import multi_hot

__all__ = ["prepare"]


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


def label_bitmasks(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """``(n, c)`` multi-hot, ``c <= num_classes`` -> ``uint64`` ``(n, ceil(num_classes / 64))``
    bitmasks."""
    words = max(1, -(-num_classes // 64))
    padded = np.zeros((labels.shape[0], words * 64), dtype=bool)
    padded[:, : labels.shape[1]] = labels > 0
    return np.ascontiguousarray(np.packbits(padded, axis=1, bitorder="little").view(np.uint64))


def prepare(query_codes, db_codes, query_labels, db_labels) -> RetrievalProblem:
    """Validate and normalise one retrieval problem.

    Args:
        query_codes, db_codes: +-1 codes ``(n, K)`` (any numeric dtype) or packed ``uint8``
            ``(n, K/8)``.
        query_labels, db_labels: class ids ``(n,)`` or one-hot / multi-hot ``(n, C)``
            (:func:`tfhash.labels.multi_hot`; an item without labels is relevant to nothing).

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
    query_labels, db_labels = np.asarray(query_labels), np.asarray(db_labels)
    for codes, labels, name in ((query_packed, query_labels, "query"), (db_packed, db_labels, "database")):
        if labels.ndim and codes.shape[0] != labels.shape[0]:
            raise ValueError(f"{name}: {codes.shape[0]} codes but {labels.shape[0]} label rows")
    widths = {lab.shape[1] for lab in (query_labels, db_labels) if lab.ndim == 2}
    if len(widths) > 1:
        raise ValueError(f"query labels have {query_labels.shape[1]} classes, database labels {db_labels.shape[1]}")
    # class ids on both sides: each side as wide as its largest id needs, the bitmasks as the wider
    width = widths.pop() if widths else None
    query_hot, db_hot = (multi_hot(labels, width, unlabelled=True, name=name, dtype=np.uint8)
                         for labels, name in ((query_labels, "query_labels"), (db_labels, "db_labels")))  # fmt: skip
    num_classes = max(query_hot.shape[1], db_hot.shape[1])
    return RetrievalProblem(
        code_words(query_packed),
        code_words(db_packed),
        label_bitmasks(query_hot, num_classes),
        label_bitmasks(db_hot, num_classes),
        query_packed.shape[1] * 8,
    )
