"""How much an ImageNet network knows of CIFAR-10 before any training: its frozen, global-average-
pooled features of 1,000 training images (100 a class) as the database and 300 test images (30 a
class) as queries, ranked by cosine similarity; 1-NN accuracy and mAP over the whole ranking.

Each network runs on the 32x32 images resized to ``--sizes`` inside the model, with its own
preprocessing, as tfhash's backbones do. The images are drawn with ``--seed``. Results in
``benchmarks/results/frozen_features.{json,md}`` (a rerun replaces its rows)::

    python -m benchmarks.frozen_features --backbones squeezenet efficientnet_lite0 --sizes 128 224
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from benchmarks.common import RESULTS_DIR, cpu_description, markdown_table, write_results  # noqa: E402
from tfhash.data.cifar10 import load_cifar10_arrays  # noqa: E402
from tfhash.models import image_backbone  # noqa: E402
from tfhash.networks import EFFICIENTNET_LITE  # noqa: E402

BACKBONES = ("squeezenet", *EFFICIENTNET_LITE)


def sample(labels: np.ndarray, rows: np.ndarray, per_class: int, rng) -> np.ndarray:
    return np.concatenate([rng.choice(rows[labels[rows] == c], per_class, replace=False) for c in range(10)])


def cosine_scores(query: np.ndarray, database: np.ndarray, query_labels, db_labels) -> tuple[float, float]:
    """1-NN accuracy and mAP over the whole cosine ranking (single labels)."""
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # noqa: E731
    order = np.argsort(-unit(query) @ unit(database).T, axis=1, kind="stable")
    relevant = db_labels[order] == query_labels[:, None]
    hits = np.cumsum(relevant, axis=1)
    precision = hits / np.arange(1, relevant.shape[1] + 1)
    average_precision = (precision * relevant).sum(axis=1) / np.maximum(relevant.sum(axis=1), 1)
    return float(relevant[:, 0].mean()), float(average_precision.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbones", nargs="+", choices=BACKBONES, default=list(BACKBONES))
    parser.add_argument("--sizes", nargs="+", type=int, default=[128, 224])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    images, labels = load_cifar10_arrays()
    rng = np.random.default_rng(args.seed)
    train, test = np.arange(50000), np.arange(50000, 60000)
    database, queries = sample(labels, train, 100, rng), sample(labels, test, 30, rng)
    path = RESULTS_DIR / "frozen_features.json"
    rows = json.loads(path.read_text())["rows"] if path.is_file() else []
    for backbone in args.backbones:
        for size in args.sizes:
            network = image_backbone(backbone, (32, 32, 3), size=size, weights="imagenet")
            start = time.perf_counter()
            features = [network.predict(images[rows_], batch_size=100, verbose=0) for rows_ in (queries, database)]
            seconds = time.perf_counter() - start
            nn, map_ = cosine_scores(features[0], features[1], labels[queries], labels[database])
            row = {"backbone": backbone, "size": size, "1-NN accuracy": nn, "mAP": map_, "features": int(features[0].shape[1]),
                   "seconds for 1,300 images": round(seconds, 1), "cpu": cpu_description(), "seed": args.seed}  # fmt: skip
            print(json.dumps(row), flush=True)
            rows = [r for r in rows if (r["backbone"], r["size"], r["seed"]) != (backbone, size, args.seed)] + [row]
    rows.sort(key=lambda r: (BACKBONES.index(r["backbone"]), r["size"], r["seed"]))
    lines = ["# Frozen ImageNet features on CIFAR-10 (python -m benchmarks.frozen_features)", "",
             "1,000 training images (100 a class) are the database, 300 test images (30 a class) the queries; global-average-pooled "
             "features of the network as loaded, ranked by cosine similarity. No training.", "",
             markdown_table(rows, ["backbone", "size", "1-NN accuracy", "mAP", "features", "seconds for 1,300 images", "cpu", "seed"])]  # fmt: skip
    write_results("frozen_features", {"rows": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
