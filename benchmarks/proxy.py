"""Proxy family: proxy quality table, HCLM / sHCLM (+ triplet) and the HCLM ablation on
CIFAR-10 SqueezeNet features, HyP2 on MIRFlickr-25K tags.

    python -m benchmarks.proxy [--seed 0] [--only quality|cifar|mirflickr] [--quick]

CIFAR-10 features: the shared ImageNet SqueezeNet v1.1 (frozen), CIFAR pixels resized to 128x128,
global-average-pooled to 512 values, cached under runs/cache/. A two-layer head on those features
is trained per method (the backbone is not fine-tuned here).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import markdown_table, write_results  # noqa: E402
from benchmarks.methods import cifar_features, fit_and_score, multilabel_benchmark_model  # noqa: E402
from tfhash import proxies  # noqa: E402
from tfhash.data import load_mirflickr25k  # noqa: E402
from tfhash.labels import multi_hot  # noqa: E402
from tfhash.losses import best_known_min_distance  # noqa: E402
from tfhash.models import HCLMModel, mlp  # noqa: E402

SETTINGS = [(10, 16), (10, 32), (10, 64), (21, 32), (38, 48), (100, 16), (100, 64), (1000, 128)]


def quality_rows(seed: int) -> list[dict]:
    rows = []
    for num_classes, bits in SETTINGS:
        start = time.perf_counter()
        codes = proxies.hclm_proxies(num_classes, bits, seed=seed)
        seconds = time.perf_counter() - start
        quality = proxies.code_quality(codes)
        rng = np.random.default_rng(seed)
        random_min = proxies.code_quality(rng.choice(np.array([-1, 1], np.int8), size=(num_classes, bits)))["min_distance"]
        hadamard = proxies.hadamard_codes(num_classes, bits)
        hadamard_min = proxies.code_quality(hadamard)["min_distance"] if hadamard is not None else None
        best = best_known_min_distance(num_classes, bits)
        rows.append({
            "C": num_classes, "K": bits, "HCLM min d": quality["min_distance"],
            "HCLM mean d": round(quality["mean_distance"], 2), "random min d": random_min,
            "Hadamard min d": "n/a" if hadamard_min is None else hadamard_min, "best known d": best,
            "HCLM / best": round(quality["min_distance"] / best, 3), "seconds": round(seconds, 1),
            "beats random": quality["min_distance"] > random_min,
            "matches Hadamard": "n/a" if hadamard_min is None else quality["min_distance"] >= hadamard_min,
            ">= 75% of best": quality["min_distance"] >= 0.75 * best, "seed": seed,
        })  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def cifar_rows(seed: int, bits_list, epochs: int) -> list[dict]:
    ds, features = cifar_features(seed)
    train, query, db = ds.split.train, ds.split.query, ds.split.database
    mean, std = features[train].mean(0), features[train].std(0) + 1e-6
    x = (features - mean) / std
    labels = multi_hot(ds.labels)
    similarity = proxies.class_mean_similarity(features[train], ds.class_ids[train])
    rows = []
    for bits in bits_list:
        rng = np.random.default_rng(seed)
        hclm = proxies.hclm_proxies(10, bits, seed=seed)
        variants = {
            "learned proxies": (rng.normal(size=(10, bits)), {"learn_proxies": True}),
            "random +-1 proxies": (rng.choice(np.array([-1, 1]), size=(10, bits)), {}),
            "Tammes proxies (real)": (proxies.tammes_points(10, bits, rng), {}),
            "HCLM": (hclm, {}),
            "sHCLM": (hclm[proxies.assign_proxies(hclm, similarity)], {}),
            "sHCLM + triplet": (hclm[proxies.assign_proxies(hclm, similarity)], {"triplet_weight": 1.0}),
        }
        for name, (proxy_matrix, options) in variants.items():
            keras.utils.set_random_seed(seed)
            model = HCLMModel(mlp(512, (512,)), proxy_matrix, **options)
            row = {"dataset": "CIFAR-10 (SqueezeNet features)", "method": name, "bits": bits}
            row.update(fit_and_score(model, x[train], labels[train], x[query], labels[query], x[db], labels[db], epochs, seed))
            rows.append(row)
            print(row, flush=True)
    return rows


def mirflickr_rows(seed: int, bits_list, epochs: int) -> list[dict]:
    ds = load_mirflickr25k(seed=seed)
    (train, train_y), (query, query_y), (db, db_y) = ds.part("train"), ds.part("query"), ds.part("database")
    rows = []
    for bits in bits_list:
        for name in ("HyP2", "sHCLM (balanced BCE)"):
            model, x, y = multilabel_benchmark_model(name, train["text"], train_y, bits, seed)
            row = {"dataset": "MIRFlickr-25K tags", "method": name, "bits": bits}
            row.update(fit_and_score(model, x, y, query["text"], query_y, db["text"], db_y, epochs, seed))
            rows.append(row)
            print(row, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["quality", "cifar", "mirflickr"], action="append")
    args = parser.parse_args()
    parts = set(args.only or ["quality", "cifar", "mirflickr"])
    bits_list = [16, 32] if args.quick else [16, 32, 64]
    results: dict = {"seed": args.seed, "quick": args.quick}
    md = [f"# Proxy family\n\nCommand: `python -m benchmarks.proxy --seed {args.seed}{' --quick' if args.quick else ''}`.\n"]
    if "quality" in parts:
        results["quality"] = quality_rows(args.seed)
        md += ["## Proxy quality (minimum Hamming distance between class proxies)\n",
               "`best known d`: the code table's best-known minimum distance for 2^ceil(log2 C) codewords of "
               "length K. Hadamard applies when K is a power of two and C <= 2K.\n",
               markdown_table(results["quality"], list(results["quality"][0].keys())), ""]  # fmt: skip
    if "cifar" in parts:
        results["cifar"] = cifar_rows(args.seed, bits_list, 15 if args.quick else 40)
        md += ["## CIFAR-10: HCLM ablation on frozen SqueezeNet features (1,000 queries / 59,000 database / 5,000 train)\n",
               markdown_table(results["cifar"], ["method", "bits", "mAP@all", "P@H<=2", "P@1000", "train_s", "seed"]), ""]  # fmt: skip
    if "mirflickr" in parts:
        results["mirflickr"] = mirflickr_rows(args.seed, bits_list, 10 if args.quick else 30)
        md += ["## MIRFlickr-25K, tags -> codes (2,000 queries / 18,015 database / 10,000 train)\n",
               markdown_table(results["mirflickr"], ["method", "bits", "mAP@all", "P@H<=2", "P@1000", "train_s", "seed"]), ""]  # fmt: skip
    write_results("proxy" + ("_quick" if args.quick else ""), results, "\n".join(md))


if __name__ == "__main__":
    main()
