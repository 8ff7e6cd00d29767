"""Class geometry of continuous codes: d_intra and d_inter (HyP2 Table 6, docs/design.md s.3)."""

from __future__ import annotations

import numpy as np

__all__ = ["class_distances"]


def class_distances(codes: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Mean l2 distance of samples to their class centres (d_intra) and mean distance of each
    class centre to its closest irrelevant class centre (d_inter).

    A class centre is the mean code of the samples carrying that label (a multi-label sample counts
    for each of its labels; d_intra averages over (sample, label) pairs). Class j is irrelevant to
    class i when no sample carries both; classes with no irrelevant class, and classes without
    samples, are left out of d_inter.

    Args:
        codes: ``(n, K)`` continuous codes.
        labels: class ids ``(n,)`` or multi-hot ``(n, C)``.
    """
    codes = np.asarray(codes, dtype=np.float64)
    labels = np.asarray(labels)
    if labels.ndim == 1:
        multi_hot = np.zeros((labels.size, int(labels.max()) + 1))
        multi_hot[np.arange(labels.size), labels] = 1.0
    else:
        multi_hot = (labels > 0).astype(np.float64)
    if codes.ndim != 2 or codes.shape[0] != multi_hot.shape[0]:
        raise ValueError(f"codes {codes.shape} and labels {labels.shape} do not match")
    if not np.all(np.isfinite(codes)):
        raise ValueError("codes contain NaN or infinity")
    sizes = multi_hot.sum(axis=0)
    present = sizes > 0
    centres = (multi_hot.T @ codes)[present] / sizes[present, None]
    member = multi_hot[:, present]
    to_centre = np.linalg.norm(codes[:, None, :] - centres[None, :, :], axis=-1)
    d_intra = float((to_centre * member).sum() / member.sum()) if member.sum() else 0.0
    co_occur = (member.T @ member) > 0
    between = np.linalg.norm(centres[:, None, :] - centres[None, :, :], axis=-1)
    between = np.where(co_occur, np.inf, between)
    closest = between.min(axis=1)
    finite = np.isfinite(closest)
    d_inter = float(closest[finite].mean()) if finite.any() else float("nan")
    return {"d_intra": d_intra, "d_inter": d_inter}
