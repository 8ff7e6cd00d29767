"""Speed of the metrics module against a straightforward NumPy argsort implementation.

    python -m benchmarks.metrics [--seed 0] [--skip-large]

Codes are random but clustered: each of 10 classes has a random centre code and items flip each
bit with probability 0.15, so relevant items are near and ties are plentiful, as with trained codes.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from benchmarks.common import markdown_table, write_results
from tfhash.codes import pack_codes
from tfhash.metrics import evaluate_retrieval


def clustered_codes(n: int, centres: np.ndarray, rng, flip: float = 0.15):
    """``n`` codes around the given class centre codes, each bit flipped with probability ``flip``."""
    labels = rng.integers(0, centres.shape[0], n)
    codes = centres[labels].copy()
    codes[rng.random(codes.shape) < flip] *= -1
    return codes, labels


def naive_map(query, db, query_labels, db_labels) -> float:
    """The straightforward implementation found in many hashing repositories: per query, a float
    distance vector from a dot product, a full argsort, cumulative sums."""
    bits = query.shape[1]
    db_f = db.astype(np.float32)
    aps = []
    for i in range(query.shape[0]):
        distance = 0.5 * (bits - db_f @ query[i].astype(np.float32))
        relevant = (db_labels == query_labels[i]).astype(np.float32)[np.argsort(distance, kind="stable")]
        hits = relevant.sum()
        if hits == 0:
            aps.append(0.0)
            continue
        precision = np.cumsum(relevant) / np.arange(1, relevant.size + 1)
        aps.append(float((precision * relevant).sum() / hits))
    return float(np.mean(aps))


def fast_map(query, db, query_labels, db_labels) -> float:
    return evaluate_retrieval(pack_codes(query), pack_codes(db), query_labels, db_labels).mean_average_precision()


def timed(fn, *args):
    tracemalloc.start()
    start = time.perf_counter()
    value = fn(*args)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return value, seconds, peak / 2**20


def compile_kernels() -> float:
    """Seconds for the first (compiling or cache-loading) call of the numba kernel: a one-time
    cost per process, reported apart from the timings."""
    start = time.perf_counter()
    codes = np.ones((2, 64), dtype=np.int8)
    fast_map(codes, codes, np.arange(2), np.arange(2))
    return time.perf_counter() - start


def run_case(name, n_query, n_db, bits, seed, naive_queries=None) -> dict:
    rng = np.random.default_rng(seed)
    centres = rng.choice(np.array([-1, 1], dtype=np.int8), size=(10, bits))
    db, db_labels = clustered_codes(n_db, centres, rng)
    query, query_labels = clustered_codes(n_query, centres, rng)
    fast_value, fast_s, fast_mb = timed(fast_map, query, db, query_labels, db_labels)
    subset = n_query if naive_queries is None else naive_queries
    naive_value, naive_s, naive_mb = timed(naive_map, query[:subset], db, query_labels[:subset], db_labels)
    # the fast path on the same subset, so the values can be compared exactly
    fast_subset = fast_value if subset == n_query else fast_map(query[:subset], db, query_labels[:subset], db_labels)
    naive_full_s = naive_s * n_query / subset
    row = {
        "case": name, "queries": n_query, "database": n_db, "bits": bits, "seed": seed,
        "fast_s": round(fast_s, 2), "fast_peak_MiB": round(fast_mb, 1), "fast_mAP": fast_value,
        "naive_s": round(naive_full_s, 2), "naive_queries_timed": subset,
        "naive_peak_MiB": round(naive_mb, 1),
        "speed-up": round(naive_full_s / fast_s, 1),
        "same mAP on timed queries": bool(abs(naive_value - fast_subset) < 1e-9),
    }  # fmt: skip
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-large", action="store_true", help="skip 10,000 x 1,000,000")
    args = parser.parse_args()
    first_call_s = compile_kernels()
    print(f"first call (numba compile or cache load): {first_call_s:.2f} s", flush=True)
    rows = [run_case("CIFAR-10 protocol", 1000, 59000, 64, args.seed)]
    if not args.skip_large:
        rows.append(run_case("large", 10000, 1_000_000, 64, args.seed, naive_queries=100))
    md = (
        "# Metrics benchmark\n\n"
        f"Command: `python -m benchmarks.metrics --seed {args.seed}`. mAP@all over clustered random codes. "
        "`naive` is a per-query float distance + full argsort + cumsum loop; where `naive_queries_timed` is "
        "below the query count it was timed on that many queries and scaled linearly (stated, not run in full). "
        "Peak memory is NumPy's traced allocations (tracemalloc). Timings are of warm calls; the first call "
        f"in a process compiles or loads the numba kernel ({first_call_s:.2f} s in this run).\n\n"
        + markdown_table(rows, ["case", "queries", "database", "bits", "fast_s", "fast_peak_MiB", "naive_s",
                                "naive_queries_timed", "naive_peak_MiB", "speed-up", "same mAP on timed queries", "seed"])  # fmt: skip
        + "\n"
    )
    write_results("metrics", {"seed": args.seed, "first_call_s": first_call_s, "rows": rows}, md)


if __name__ == "__main__":
    main()
