"""Semantic-cluster family on real data: SCDH / SCDH-S on MNIST, multi-label SCUL and JCCH
coefficients vs JCCH-B on MIRFlickr-25K tags, and the O(n) cost of SCUL against an O(n^2)
pairwise loss (JCCH on Wiki: :mod:`benchmarks.wiki`).

    python -m benchmarks.semantic_cluster [--quick] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.common import markdown_table, write_results  # noqa: E402
from benchmarks.methods import fit_and_score, multilabel_benchmark_model  # noqa: E402
from tfhash import losses  # noqa: E402
from tfhash.data import load_mirflickr25k  # noqa: E402
from tfhash.labels import multi_hot  # noqa: E402
from tfhash.quickstart import train_scdh_mnist  # noqa: E402


def mnist_rows(bits_list, epochs, seed) -> list[dict]:
    rows = []
    for bits in bits_list:
        for ablation in (False, True):
            summary = train_scdh_mnist(bits=bits, epochs=epochs, seed=seed, ablation=ablation)["summary"]
            rows.append({"dataset": "MNIST", "method": summary["method"], "bits": bits, "mAP@all": summary["mAP@all"],
                         "P@H<=2": summary["P@H<=2"], "train_s": summary["train_seconds"], "seed": seed})  # fmt: skip
            print(rows[-1], flush=True)
    return rows


def mirflickr_rows(bits_list, epochs, seed, anchors: int | None) -> list[dict]:
    ds = load_mirflickr25k(seed=seed)
    (train, train_y), (query, query_y), (db, db_y) = ds.part("train"), ds.part("query"), ds.part("database")
    start = time.perf_counter()
    anchor_index = None if anchors is None else np.random.default_rng(seed).choice(len(train_y), anchors, replace=False)
    q, u = losses.jcch_coefficients(train_y, anchor_index)
    coefficient_seconds = time.perf_counter() - start
    variants = {
        "SCUL multi-label (JCCH-B: q = 1/|Y|, u = 1)": multi_hot(train_y),
        "JCCH coefficients": {"labels": multi_hot(train_y), "q": q.astype("float32"), "u": u.astype("float32")},
    }
    rows = []
    for bits in bits_list:
        for name, target in variants.items():
            model = multilabel_benchmark_model("SCDH multi-label", train["text"], train_y, bits, seed)[0]
            scores = fit_and_score(model, train["text"], target, query["text"], query_y, db["text"], db_y, epochs, seed)
            rows.append({"dataset": "MIRFlickr-25K tags", "method": name, "bits": bits, **scores,
                         "anchors": "all" if anchors is None else anchors,
                         "coefficient_s": round(coefficient_seconds, 1)})  # fmt: skip
            print(rows[-1], flush=True)
    return rows


def cost_rows(sizes, seed, bits=32, classes=10, repeats=3) -> list[dict]:
    rng = np.random.default_rng(seed)
    centres = tf.Variable(rng.normal(scale=0.5, size=(classes, bits)).astype("float32"))
    rows = []
    for n in sizes:
        codes = tf.Variable(rng.normal(size=(n, bits)).astype("float32"))
        labels = tf.constant(np.eye(classes, dtype="float32")[rng.integers(0, classes, n)])

        def unary():
            with tf.GradientTape() as tape:
                loss = losses.semantic_cluster_unary_loss(labels, -tf.norm(codes[:, None] - centres[None], axis=-1), 0.005)
            return tape.gradient(loss, [codes, centres])

        def pairwise():
            with tf.GradientTape() as tape:
                loss = losses.pairwise_likelihood_loss(codes, codes, losses.pairwise_similarity(labels, labels), eta=0.0)
            return tape.gradient(loss, [codes])

        row = {"n": n, "seed": seed}
        for name, fn in (("SCUL_s", unary), ("pairwise_s", pairwise)):
            fn()
            start = time.perf_counter()
            for _ in range(repeats):
                fn()
            row[name] = (time.perf_counter() - start) / repeats
        rows.append(row)
        print(row, flush=True)
    for name in ("SCUL_s", "pairwise_s"):
        slope = np.polyfit(np.log([r["n"] for r in rows]), np.log([r[name] for r in rows]), 1)[0]
        for row in rows:
            row[f"{name} log-log slope"] = round(float(slope), 2)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer epochs and bit lengths (minutes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=["mnist", "mirflickr", "cost"], action="append")
    args = parser.parse_args()
    parts = set(args.only or ["mnist", "mirflickr", "cost"])
    quick = args.quick
    results: dict = {"seed": args.seed, "quick": quick}
    if "cost" in parts:
        results["cost"] = cost_rows([1000, 2000, 4000, 8000] if quick else [1000, 2000, 4000, 8000, 16000], args.seed)
    if "mirflickr" in parts:
        results["mirflickr"] = mirflickr_rows([16, 32, 64], 5 if quick else 30, args.seed, anchors=None)
    if "mnist" in parts:
        results["mnist"] = mnist_rows([32] if quick else [32, 48], 3 if quick else 20, args.seed)
    md = [f"# Semantic-cluster family on real data\n\nCommand: `python -m benchmarks.semantic_cluster"
          f"{' --quick' if quick else ''} --seed {args.seed}`. Seeds are recorded in every row.\n"]  # fmt: skip
    if "mnist" in results:
        md += ["## MNIST (small CNN, 5,000 train / 1,000 queries / 69,000 database)\n",
               markdown_table(results["mnist"], ["method", "bits", "mAP@all", "P@H<=2", "train_s", "seed"]), ""]  # fmt: skip
    if "mirflickr" in results:
        md += ["## MIRFlickr-25K, tags -> codes (the image modality is not available offline)\n",
               markdown_table(results["mirflickr"], ["method", "bits", "mAP@all", "P@H<=2", "P@1000", "train_s", "anchors", "seed"]), ""]  # fmt: skip
    if "cost" in results:
        md += ["## Cost of one loss + gradient evaluation vs n (32 bits, 10 classes)\n",
               markdown_table(results["cost"], ["n", "SCUL_s", "pairwise_s", "SCUL_s log-log slope", "pairwise_s log-log slope"]), ""]  # fmt: skip
    write_results("semantic_cluster" + ("_quick" if quick else ""), results, "\n".join(md))


if __name__ == "__main__":
    main()
