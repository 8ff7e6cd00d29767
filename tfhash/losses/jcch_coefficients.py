"""JCCH label coefficients q_is, u_is (JCCH Algorithm 1 and appendix; docs/design.md s.4): the NumPy
reference that the pipeline's Beam job is tested against."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np

__all__ = ["jcch_coefficients"]


logger = logging.getLogger(__name__)

#: Rows of the (examples x anchors) intersection matrix processed at once.
_ROW_CHUNK = 4096


def _row_chunks(n: int) -> Iterator[slice]:
    for start in range(0, n, _ROW_CHUNK):
        yield slice(start, min(start + _ROW_CHUNK, n))


def jcch_coefficients(labels, anchors=None, rescale: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per-example, per-label coefficients (q, u) of the JCCH loss.

    With A the anchors (all labelled examples, or the labelled ones among ``anchors``), n the
    number of labelled examples and l = |A|; P(i) = {j : Y_i.Y_j > 0} (an example is its own
    positive), N(i) its complement; P_A, N_A counted within A and P(a), N(a) over all examples:

        q_is = (n/l)^2 |N_A(i)| sum_{j in P_A(i)} [s in Y_i and Y_j] / |Y_i & Y_j|
        u_is = (n/l) ( sum_{a in A, i in P(a)} |N(a)| [s in Y_a and Y_i] / |Y_a & Y_i|
                       + sum_{a in A, i in N(a)} |P(a)| [s in Y_i] / |Y_i| )

    then (Eq. 14) M = sum q / sum_i |Y_i|, q /= M, u /= M. Cost O(n l C) time; memory O(chunk x l)
    (no n x n matrix when anchors are given).

    Args:
        labels: ``(n, C)`` multi-hot labels of the training set.
        anchors: indices of the anchor subset; ``None`` = every example.
        rescale: apply the Eq. 14 rescaling.

    Returns:
        ``(q, u)``, both ``float64`` ``(n, C)``; rows without labels are all zero (their number is
        logged as a warning).

    Raises:
        ValueError: labels not 2-D, negative, or no labelled anchor.
    """
    labels = np.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(f"labels must be (n, C) multi-hot, got shape {labels.shape}")
    if labels.size and (not np.all(np.isfinite(labels)) or labels.min() < 0):
        raise ValueError("labels must be finite and non-negative")
    y = (labels > 0).astype(np.float64)
    label_count = y.sum(axis=1)
    labelled = label_count > 0
    unlabelled = int((~labelled).sum())
    if unlabelled:
        logger.warning("jcch_coefficients: %d examples have no label and get zero coefficients", unlabelled)
    anchor_index = np.arange(y.shape[0]) if anchors is None else np.asarray(anchors, dtype=np.int64)
    if anchor_index.size and (anchor_index.min() < 0 or anchor_index.max() >= y.shape[0]):
        raise ValueError("anchor indices are out of range")
    anchor_index = anchor_index[labelled[anchor_index]]
    if anchor_index.size == 0:
        raise ValueError("no labelled anchor: cannot compute JCCH coefficients")
    y_anchor = y[anchor_index]
    n, l = float(labelled.sum()), float(anchor_index.size)

    # Pass 1, O(n l): |P(a)| over all labelled examples for every anchor a.
    anchor_positives = np.zeros(anchor_index.size)
    for rows in _row_chunks(y.shape[0]):
        anchor_positives += ((y[rows] @ y_anchor.T) > 0).sum(axis=0)
    anchor_negatives = n - anchor_positives

    # Pass 2, O(n l C): the coefficients, a chunk of rows at a time.
    q = np.zeros_like(y)
    u = np.zeros_like(y)
    share = np.divide(y, label_count[:, None], out=np.zeros_like(y), where=labelled[:, None])
    for rows in _row_chunks(y.shape[0]):
        intersection = y[rows] @ y_anchor.T  # |Y_i & Y_a|
        positive = intersection > 0
        inverse = np.divide(1.0, intersection, out=np.zeros_like(intersection), where=positive)
        negatives_in_anchors = l - positive.sum(axis=1)
        q[rows] = (n / l) ** 2 * negatives_in_anchors[:, None] * y[rows] * (inverse @ y_anchor)
        from_positive_anchors = y[rows] * ((inverse * anchor_negatives[None, :]) @ y_anchor)
        from_negative_anchors = share[rows] * ((~positive) @ anchor_positives)[:, None]
        u[rows] = (n / l) * (from_positive_anchors + from_negative_anchors)
    q[~labelled] = 0.0
    u[~labelled] = 0.0
    if rescale:
        scale = q.sum() / label_count.sum()
        if scale > 0:
            q /= scale
            u /= scale
    return q, u
