"""Retrieval plots (matplotlib, PNG): PR curve, P@N curve, t-SNE of codes coloured by label."""

from __future__ import annotations

import io
import os

import numpy as np

from tfhash import storage

__all__ = ["save_figure", "plot_pr_curve", "plot_precision_at_n", "plot_tsne"]


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, plt.subplots(figsize=(5, 4), dpi=100)


def save_figure(figure, path: str | os.PathLike, **options) -> None:
    """Write a matplotlib figure as PNG to ``path`` (a file or a URI of remote storage)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", **options)
    storage.write_bytes(os.fspath(path), buffer.getvalue())


def plot_pr_curve(curve: dict, path: str | os.PathLike, title: str = "Precision-recall by Hamming radius") -> None:
    """``curve`` as returned by :func:`tfhash.metrics.pr_curve_by_radius`."""
    plt, (fig, ax) = _figure()
    ax.plot(curve["recall"], curve["precision"], marker=".")
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_precision_at_n(curve: dict, path: str | os.PathLike, title: str = "Precision of the top N") -> None:
    """``curve`` as returned by :func:`tfhash.metrics.precision_at_n_curve`."""
    plt, (fig, ax) = _figure()
    ax.plot(curve["n"], curve["precision"], marker=".")
    ax.set_xlabel("N")
    ax.set_ylabel("precision@N")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_tsne(codes: np.ndarray, labels: np.ndarray, path: str | os.PathLike, seed: int = 0,
              max_points: int = 2000, title: str = "t-SNE of codes") -> None:  # fmt: skip
    """2-D t-SNE (scikit-learn) of up to ``max_points`` codes (a seeded sample), coloured by the
    first label of each item."""
    from sklearn.manifold import TSNE

    codes = np.asarray(codes, dtype=np.float32)
    labels = np.asarray(labels)
    colour = labels if labels.ndim == 1 else labels.argmax(axis=1)
    rng = np.random.default_rng(seed)
    pick = rng.choice(codes.shape[0], size=min(max_points, codes.shape[0]), replace=False)
    perplexity = float(min(30, max(2, (pick.size - 1) // 3)))
    points = TSNE(n_components=2, random_state=seed, init="pca", perplexity=perplexity).fit_transform(codes[pick])
    plt, (fig, ax) = _figure()
    scatter = ax.scatter(points[:, 0], points[:, 1], c=colour[pick], cmap="tab10", s=4)
    ax.legend(*scatter.legend_elements(), fontsize=6, loc="best", markerscale=0.7)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
