"""Index benchmark: build time, memory, query time at k = 1, 10, 100 and recall@k of each
index kind on random-but-clustered codes, beside plain FAISS calls and a NumPy reference.

    python -m benchmarks.index [--seed 0] [--sizes 1000000 10000000] [--bits 64 128]

Data: 1,000 random centre codes; each item copies a centre and flips every bit with probability
1/8 (generated packed, in chunks). Queries come from the same distribution. recall@k is measured up
to ties: the share of returned items whose distance is at most the true k-th distance.
"""

from __future__ import annotations

import argparse
import time

import faiss
import numpy as np
import psutil

from benchmarks.common import markdown_table, write_results
from tfhash.codes import hamming_distances
from tfhash.index import index_factory

KS = (1, 10, 100)


def clustered_packed(n: int, centres: np.ndarray, rng, chunk: int = 1_000_000) -> np.ndarray:
    out = np.empty((n, centres.shape[1]), dtype=np.uint8)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        shape = (stop - start, centres.shape[1])
        flips = rng.integers(0, 256, shape, dtype=np.uint8) & rng.integers(0, 256, shape, dtype=np.uint8)
        flips &= rng.integers(0, 256, shape, dtype=np.uint8)  # each bit set with probability 1/8
        out[start:stop] = centres[rng.integers(0, len(centres), stop - start)] ^ flips
    return out


def rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


def timed_search(search, queries, k):
    search(queries[:2], k)  # warm
    start = time.perf_counter()
    result = search(queries, k)
    return result, (time.perf_counter() - start) / len(queries) * 1000.0


def recall_up_to_ties(distances, truth_distances) -> float:
    return float(np.mean(distances <= truth_distances[:, -1:]))


def numpy_reference(db, queries, k):
    distances = hamming_distances(queries, db)
    order = np.argsort(distances, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(distances, order, axis=1), order


def run(n: int, bits: int, seed: int, n_queries: int, numpy_queries: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 256, (1000, bits // 8), dtype=np.uint8)
    db = clustered_packed(n, centres, rng)
    queries = clustered_packed(n_queries, centres, rng)
    rows = []
    # Ground truth and the plain FAISS baseline.
    plain = faiss.IndexBinaryFlat(bits)
    plain.use_heap = False
    start = time.perf_counter()
    plain.add(db)
    plain_build = time.perf_counter() - start
    truth = {}
    for k in KS:
        (distances, _), ms = timed_search(lambda q, kk: plain.search(q, kk), queries, k)
        truth[k] = distances
        rows.append({"n": n, "bits": bits, "index": "plain faiss.IndexBinaryFlat", "exact": True, "k": k,
                     "build_s": round(plain_build, 2), "query_ms": round(ms, 3), "recall@k": 1.0, "seed": seed})  # fmt: skip
    plain.reset()
    (ref_d, _), ms = timed_search(lambda q, kk: numpy_reference(db, q, kk), queries[:numpy_queries], 100)
    rows.append({"n": n, "bits": bits, "index": f"NumPy reference ({numpy_queries} queries)", "exact": True, "k": 100,
                 "query_ms": round(ms, 3), "recall@k": recall_up_to_ties(ref_d, truth[100][:numpy_queries]), "seed": seed})  # fmt: skip
    nlist = 1024 if n <= 1_000_000 else 4096
    configs = [("BFlat", {}), (f"BIVF{nlist}", {"nprobe": 8}), (f"BIVF{nlist}", {"nprobe": 32}),
               (f"BMultiHash{bits // 16}", {"nflip": 2})]  # fmt: skip
    if n <= 1_000_000:
        configs.append(("ScaNN", {"num_leaves": 1000, "leaves_to_search": 50, "reorder": 200}))
    for description, params in configs:
        before = rss_mib()
        start = time.perf_counter()
        index = index_factory(bits, description, seed=seed, **params)  # seeds the IVF / ScaNN k-means
        if description.startswith("BIVF"):
            index.train(db[rng.choice(n, min(n, 200_000), replace=False)])
        index.add(db)
        if description == "ScaNN":
            index.search(queries[:1], max(KS))  # ScaNN builds its searcher lazily
        build = time.perf_counter() - start
        memory = rss_mib() - before
        for k in KS:
            result, ms = timed_search(index.search, queries, k)
            rows.append({"n": n, "bits": bits, "index": f"tfhash {description} {params or ''}".strip(),
                         "exact": index.exact, "k": k, "build_s": round(build, 2), "memory_MiB": round(memory, 1),
                         "query_ms": round(ms, 3), "recall@k": recall_up_to_ties(result.distances, truth[k]),
                         "seed": seed})  # fmt: skip
            print(rows[-1], flush=True)
        del index
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--bits", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--name", default="index", help="results file name (benchmarks/results/<name>.*)")
    args = parser.parse_args()
    rows = []
    for n in args.sizes:
        for bits in args.bits:
            rows += run(n, bits, args.seed, args.queries if n <= 1_000_000 else args.queries // 5, 20)
    md = (
        "# Index benchmark\n\n"
        f"Command: `python -m benchmarks.index --seed {args.seed} --sizes {' '.join(map(str, args.sizes))} "
        f"--bits {' '.join(map(str, args.bits))} --name {args.name}`; FAISS threads: {faiss.omp_get_max_threads()}. "
        "query_ms is wall time per query over a batch (1,000 queries at 1M, 200 at 10M; the NumPy reference "
        "on 20). recall@k counts returned items within the true k-th distance (ties make id sets ambiguous). "
        "memory_MiB is the growth of the process RSS during the build.\n\n"
        + markdown_table(rows, ["n", "bits", "index", "exact", "k", "build_s", "memory_MiB", "query_ms", "recall@k"])
        + "\n"
    )
    write_results(args.name, {"seed": args.seed, "rows": rows}, md)


if __name__ == "__main__":
    main()
