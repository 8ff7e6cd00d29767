"""The small end-to-end job: train SCDH on MNIST (standard protocol), encode, search, mAP.

The main job without TFX (the README's first command runs the pipeline).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from tfhash.codes import pack_codes
from tfhash.data import load_mnist
from tfhash.metrics import evaluate_retrieval

__all__ = ["train_scdh_mnist", "run_quickstart"]

logger = logging.getLogger(__name__)


def train_scdh_mnist(bits: int = 48, epochs: int = 30, seed: int = 0, data_root=None, ablation: bool = False,
                     batch_size: int = 64, learning_rate: float = 1e-3, verbose: int = 0) -> dict:  # fmt: skip
    """Train SCDH (or SCDH-S) on the 5,000 MNIST training images, encode the 1,000 queries and the
    69,000 database images and evaluate. Returns a JSON-ready dict with the seed and timings."""
    import keras

    from tfhash.models import build_scdh, small_cnn

    keras.utils.set_random_seed(seed)
    dataset = load_mnist(data_root, seed=seed)
    train_x, train_y = dataset.part("train")
    query_x, query_y = dataset.part("query")
    db_x, db_y = dataset.part("database")
    model = build_scdh(small_cnn((28, 28)), dataset.num_classes, bits, preset="cifar10", ablation=ablation)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate))
    start = time.perf_counter()
    history = model.fit(train_x["image"], train_y, batch_size=batch_size, epochs=epochs,
                        shuffle=True, verbose=verbose)  # fmt: skip
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    query_codes = model.encode(query_x["image"])
    db_codes = model.encode(db_x["image"])
    encode_seconds = time.perf_counter() - start
    report = evaluate_retrieval(query_codes, db_codes, query_y, db_y, tie_aware=True, precision_at=[1000])
    summary = report.summary()
    summary.update(
        method="SCDH-S" if ablation else "SCDH",
        dataset=dataset.describe(),
        epochs=epochs,
        seed=seed,
        final_training_losses={k: float(v[-1]) for k, v in history.history.items()},
        train_seconds=round(train_seconds, 1),
        encode_seconds=round(encode_seconds, 1),
    )
    return {"summary": summary, "model": model, "query_codes": query_codes, "db_codes": db_codes,
            "query_labels": query_y, "db_labels": db_y}  # fmt: skip


def run_quickstart(bits: int = 48, epochs: int = 30, seed: int = 0, data_root=None, output_dir="runs/quickstart",
                   verbose: int = 0) -> dict:  # fmt: skip
    """Train, encode, search one example query, evaluate, and write ``summary.json``, the codes
    (``codes.npz``) and the trained model (``model.keras``: ``keras.saving.load_model`` reads it
    once :mod:`tfhash.models` is imported, and its ``encode`` gives codes of new images) to
    ``output_dir``."""
    result = train_scdh_mnist(bits=bits, epochs=epochs, seed=seed, data_root=data_root, verbose=verbose)
    summary = result["summary"]
    query_packed = pack_codes(result["query_codes"])
    db_packed = pack_codes(result["db_codes"])
    from tfhash.codes import hamming_distances

    distances = hamming_distances(query_packed[:1], db_packed)[0]
    nearest = np.argsort(distances, kind="stable")[:10]
    summary["example_query"] = {
        "query_label": int(np.argmax(result["query_labels"][0])),
        "nearest_database_rows": nearest.tolist(),
        "nearest_labels": np.argmax(result["db_labels"][nearest], axis=1).tolist(),
        "nearest_distances": distances[nearest].tolist(),
    }
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "codes.npz", query_codes=query_packed, db_codes=db_packed,
                        query_labels=result["query_labels"], db_labels=result["db_labels"], bits=bits)  # fmt: skip
    summary["model_path"] = os.fspath(out / "model.keras")
    result["model"].save(summary["model_path"])
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    summary["output_dir"] = os.fspath(out)
    return summary
