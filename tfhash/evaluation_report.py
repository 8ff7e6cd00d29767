"""``tfhash evaluate``: metrics JSON and plots from saved codes and labels."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from tfhash.codes import as_packed, unpack_codes
from tfhash.labels import multi_hot
from tfhash.metrics import evaluate_retrieval, precision_at_n_curve
from tfhash.metrics.plots import plot_pr_curve, plot_precision_at_n, plot_tsne

__all__ = ["load_codes_file", "write_evaluation"]

REQUIRED_ARRAYS = ("query_codes", "db_codes", "query_labels", "db_labels")
#: Arrays a codes file may add: the items' pixels (``uint8``, one per code), which the gallery shows.
IMAGE_ARRAYS = ("query_images", "db_images")


def load_codes_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read an ``.npz`` holding ``query_codes``, ``db_codes`` (+-1 or packed ``uint8``),
    ``query_labels`` and ``db_labels``. Pickled objects are refused.

    Raises:
        ValueError: unreadable file or missing arrays, with the names that are missing.
    """
    try:
        with np.load(path, allow_pickle=False) as content:
            arrays = {key: content[key] for key in content.files}
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable .npz codes file ({err})") from err
    missing = [key for key in REQUIRED_ARRAYS if key not in arrays]
    if missing:
        raise ValueError(f"{path}: missing arrays {missing}; it must hold {list(REQUIRED_ARRAYS)}")
    return arrays


def write_evaluation(codes_path, output_dir, top_r=None, radius: int = 2, tsne: bool = True, seed: int = 0) -> dict:
    """Evaluate the codes of ``codes_path`` and write ``metrics.json``, ``pr_curve.png``,
    ``precision_at_n.png``, the gallery (``gallery.html``, ``gallery.png``: queries chosen with
    ``seed``, pictures when the file holds :data:`IMAGE_ARRAYS`) and (optionally) ``tsne.png`` into
    ``output_dir``."""
    from tfhash.metrics.gallery import gallery_queries, gallery_rows, nearest, write_gallery

    arrays = load_codes_file(codes_path)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    q, db = arrays["query_codes"], arrays["db_codes"]
    ql, dl = arrays["query_labels"], arrays["db_labels"]
    report = evaluate_retrieval(q, db, ql, dl, top_r=top_r, tie_aware=top_r is None, precision_at=[min(1000, len(db))])
    metrics = report.summary(radius)
    curve = {
        "radius": list(range(report.bits + 1)),
        "precision": report.precision_by_radius.mean(axis=0).tolist(),
        "recall": report.recall_by_radius.mean(axis=0).tolist(),
    }
    ns = sorted({int(n) for n in np.unique(np.geomspace(1, len(db), num=20).astype(int))})
    pn = precision_at_n_curve(q, db, ql, dl, ns)
    (out / "metrics.json").write_text(json.dumps({"metrics": metrics, "pr_curve": curve,
                                                  "precision_at_n": {k: v.tolist() for k, v in pn.items()}}, indent=2))  # fmt: skip
    plot_pr_curve({k: np.asarray(v) for k, v in curve.items()}, out / "pr_curve.png")
    plot_precision_at_n(pn, out / "precision_at_n.png")
    classes = None if ql.ndim == 2 else int(max(ql.max(), dl.max())) + 1
    ql, dl = multi_hot(ql, classes), multi_hot(dl, classes)
    chosen = gallery_queries(ql, seed=seed)
    packed = [as_packed(c) for c in (q, db)]
    ids, distances = nearest(packed[0][chosen], [(packed[1], np.arange(len(db)))], 10)
    images = [arrays.get(name) for name in IMAGE_ARRAYS]
    pictures = all(x is not None and x.dtype == np.uint8 and len(x) == len(c) for x, c in zip(images, (q, db), strict=True))
    rows = gallery_rows(chosen, ql[chosen], ids, distances, lambda i: dl[i], (lambda i: images[1][i]) if pictures else None,
                        query_image_of=(lambda i: images[0][i]) if pictures else None)  # fmt: skip
    write_gallery(out, rows, curve, f"{Path(codes_path).name}: queries and their 10 nearest items", seed=seed)
    if tsne:
        db_codes = db if db.dtype != np.uint8 else unpack_codes(db)
        plot_tsne(db_codes, dl, out / "tsne.png", seed=seed)
    return metrics
