"""The gallery of an evaluation: a fixed, seeded set of queries, each with its nearest items, the
wrong ones framed, beside the precision-recall curve (``gallery.png`` and ``gallery.html``).

People judge retrieval by looking at it first; the gallery is what an evaluation shows them.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tfhash import storage
from tfhash.codes import hamming_distances
from tfhash.metrics.plots import save_figure

__all__ = ["gallery_queries", "nearest", "write_gallery", "gallery_rows"]


#: The gallery's files, beside the evaluation's metrics.
GALLERY_HTML, GALLERY_PNG = "gallery.html", "gallery.png"


@dataclass(frozen=True)
class Shown:
    """One picture of the gallery: an item's id, its class names, its image (``uint8`` pixels
    ``(H, W)`` or ``(H, W, 3)``, or None for feature vectors) and, for a neighbour, its Hamming
    distance and whether it shares a class with the query."""

    id: int
    labels: tuple[str, ...]
    image: np.ndarray | None = None
    distance: int | None = None
    relevant: bool | None = None


def gallery_queries(labels: np.ndarray, per_class: int = 2, seed: int = 0, max_rows: int = 20) -> np.ndarray:
    """Row indices of the queries a gallery shows: ``per_class`` drawn with ``seed`` among the
    queries of each class (a multi-label query counts for its first class), classes in order, at
    most ``max_rows`` in all; a class without queries is skipped.

    Args:
        labels: multi-hot ``(n, C)`` query labels.
    """
    labels = np.asarray(labels)
    if labels.ndim != 2 or per_class < 1 or max_rows < 1:
        raise ValueError(f"labels must be multi-hot (n, C), per_class and max_rows positive; got {labels.shape}, {per_class}, {max_rows}")
    rng = np.random.default_rng(seed)
    first = np.where(labels.any(axis=1), labels.argmax(axis=1), -1)
    chosen = []
    for c in range(labels.shape[1]):
        rows = np.flatnonzero(first == c)
        chosen += sorted(rng.choice(rows, size=min(per_class, rows.size), replace=False).tolist()) if rows.size else []
    return np.asarray(chosen[:max_rows], dtype=np.int64)


def nearest(query_packed: np.ndarray, database: Iterable[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` nearest database items of each packed query by Hamming distance, ties in database
    order: ``(ids (q, k'), distances (q, k'))`` with ``k' = min(k, database size)``.

    Args:
        database: ``(packed codes, ids)`` batches in database order (one pass).
    """
    best_d = np.zeros((len(query_packed), 0), np.int64)
    best_i = np.zeros((len(query_packed), 0), np.int64)
    for codes, ids in database:
        d = np.concatenate([best_d, hamming_distances(query_packed, codes).astype(np.int64)], axis=1)
        i = np.concatenate([best_i, np.broadcast_to(np.asarray(ids, np.int64), (len(query_packed), len(ids)))], axis=1)
        order = np.argsort(d, axis=1, kind="stable")[:, :k]
        best_d, best_i = np.take_along_axis(d, order, axis=1), np.take_along_axis(i, order, axis=1)
    return best_i, best_d


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _draw(rows: list[tuple[Shown, list[Shown]]], pr_curve: dict | None, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    columns = 1 + max((len(found) for _, found in rows), default=0)
    height = 1.35 * max(len(rows), 3) + 0.8  # inches: a row of pictures each, and the title
    figure = plt.figure(figsize=(1.3 * columns + (4.5 if pr_curve else 0), height), dpi=100)
    grid = figure.add_gridspec(max(len(rows), 1), columns + (4 if pr_curve else 0), top=1 - 0.8 / height)
    figure.suptitle(title, fontsize=11, y=1 - 0.15 / height)
    for r, (query, found) in enumerate(rows):
        for c, shown in enumerate([query, *found]):
            axis = figure.add_subplot(grid[r, c])
            axis.set_xticks([])
            axis.set_yticks([])
            if shown.image is not None:
                axis.imshow(shown.image, cmap="gray" if shown.image.ndim == 2 else None, vmin=0, vmax=255)
            else:
                axis.text(0.5, 0.5, "\n".join(shown.labels[:3]) or "-", ha="center", va="center", fontsize=7, wrap=True)
            caption = "query" if c == 0 else f"d={shown.distance}"
            axis.set_title(f"{caption}: {', '.join(shown.labels[:2])}"[:24], fontsize=6)
            colour = "#1565c0" if c == 0 else "#d32f2f" if shown.relevant is False else "#9e9e9e"
            width = 3 if c == 0 or shown.relevant is False else 0.8
            axis.add_patch(Rectangle((0, 0), 1, 1, transform=axis.transAxes, fill=False, edgecolor=colour, linewidth=width, clip_on=False))
            for spine in axis.spines.values():
                spine.set_visible(False)
    if pr_curve:
        axis = figure.add_subplot(grid[: max(len(rows) // 2, 1), columns + 1 :])
        axis.plot(pr_curve["recall"], pr_curve["precision"], marker=".")
        axis.set_xlabel("recall", fontsize=8)
        axis.set_ylabel("precision", fontsize=8)
        axis.set_title("precision-recall by Hamming radius", fontsize=8)
        axis.set_xlim(0, 1)
        axis.set_ylim(0, 1.02)
        axis.grid(alpha=0.3)
    save_figure(figure, path, bbox_inches="tight")
    plt.close(figure)


def write_gallery(output_dir: str | os.PathLike, rows: list[tuple[Shown, list[Shown]]], pr_curve: dict | None = None,
                  title: str = "Queries and their nearest items", seed: int | None = None) -> dict:  # fmt: skip
    """Write ``gallery.png`` (every query and its neighbours in a row, wrong neighbours framed in
    red, the precision-recall curve beside them) and ``gallery.html`` (the same, each picture with
    its id, classes and distance) into ``output_dir``; returns the two paths.

    Args:
        rows: ``(query, neighbours)`` per query, in the order shown.
        pr_curve: ``{"precision": ..., "recall": ...}`` by radius, or None.
        seed: the seed that chose the queries, recorded on the page.
    """
    out = os.fspath(output_dir)
    _draw(rows, pr_curve, storage.join(out, GALLERY_PNG), title)

    def cell(shown: Shown, query: bool) -> str:
        picture = (f'<img src="data:image/png;base64,{base64.b64encode(_png(shown.image)).decode()}" alt="item {shown.id}">'
                   if shown.image is not None else "")  # fmt: skip
        words = html.escape(", ".join(shown.labels) or "no labels")
        note = "query" if query else f"distance {shown.distance}" + (" &#10007; wrong" if shown.relevant is False else "")
        kind = "query" if query else "wrong" if shown.relevant is False else "right"
        return f'<figure class="{kind}" data-id="{shown.id}">{picture}<figcaption>id {shown.id}: {words}<br>{note}</figcaption></figure>'

    body = "\n".join(f'<div class="row">{cell(q, True)}{"".join(cell(n, False) for n in found)}</div>' for q, found in rows)
    wrong = sum(n.relevant is False for _, found in rows for n in found)
    shown = sum(len(found) for _, found in rows)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5rem; }}
.row {{ display: flex; gap: .4rem; margin-bottom: .6rem; flex-wrap: wrap; }}
figure {{ margin: 0; width: 110px; border: 2px solid #ccc; padding: 2px; font-size: .7rem; }}
figure.query {{ border: 3px solid #1565c0; }}
figure.wrong {{ border: 3px solid #d32f2f; }}
figure img {{ width: 100%; image-rendering: pixelated; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{len(rows)} queries{"" if seed is None else f" chosen with seed {seed}"}, {shown} neighbours, {wrong} of them sharing no class with
their query (framed in red). <a href="{GALLERY_PNG}">The same as one picture</a>, with the precision-recall curve.</p>
{body}
</body></html>
"""
    storage.write_text(storage.join(out, GALLERY_HTML), page)
    return {"html": storage.join(out, GALLERY_HTML), "png": storage.join(out, GALLERY_PNG)}


def gallery_rows(query_ids, query_labels, neighbour_ids, neighbour_distances, labels_of, image_of=None,
                 class_names=None, query_image_of=None) -> list[tuple[Shown, list[Shown]]]:  # fmt: skip
    """The rows of :func:`write_gallery` from ids: ``labels_of(id)`` and ``image_of(id)`` (None:
    no pictures) look database items up, ``query_image_of(id)`` queries (default ``image_of``); a
    neighbour is relevant when it shares a class with its query.

    Args:
        query_ids, query_labels: the queries shown and their multi-hot labels.
        neighbour_ids, neighbour_distances: ``(q, k)`` as :func:`nearest` returns them.
        labels_of: id -> multi-hot labels of a database item.
        class_names: names of the classes (default ``"class <c>"``).
    """

    def names(multi_hot) -> tuple[str, ...]:
        return tuple(class_names[c] if class_names else f"class {c}" for c in np.flatnonzero(np.asarray(multi_hot)))

    rows = []
    for q, (item, labels) in enumerate(zip(query_ids, query_labels, strict=True)):
        picture = query_image_of or image_of
        query = Shown(int(item), names(labels), picture(int(item)) if picture else None)
        found = [Shown(int(i), names(labels_of(int(i))), image_of(int(i)) if image_of else None, int(d),
                       bool(np.any(np.asarray(labels_of(int(i))).astype(bool) & np.asarray(labels).astype(bool))))
                 for i, d in zip(neighbour_ids[q], neighbour_distances[q], strict=True)]  # fmt: skip
        rows.append((query, found))
    return rows
