"""Index benchmark: build time, memory, query time at k = 1, 10, 100 and recall@k of each
index kind on random-but-clustered codes, beside plain FAISS calls and a NumPy reference; and the
exact kernel (:mod:`tfhash.hamming`, behind ``BFlat``) beside ``faiss.IndexBinaryFlat`` against
the machine's limits.

    python -m benchmarks.index [--seed 0] [--sizes 1000000 10000000] [--bits 64 128] [--part indexes kernel milvus]

Data: 1,000 random centre codes; each item copies a centre and flips every bit with probability
1/8 (generated packed, in chunks). Queries come from the same distribution. recall@k is measured up
to ties: the share of returned items whose distance is at most the true k-th distance.

``kernel`` part: for batches of 1, 32 and 1,000 queries and k = 1, 10, 100, queries per second of
``BFlat`` and of ``faiss.IndexBinaryFlat`` (``use_heap = False``) with the same threads, the same
batches and the same codes (every answer compared: distances and ids, ties included), the median
of three timings each. The roofline: a search must read the database once (``n K / 8`` bytes at
the measured read bandwidth) and XOR + popcount + add ``m n K / 64`` words (at the measured
throughput of that loop on data in L1, all threads); its time is at least the larger of the two,
and each row reports which share of that limit it reaches.

``milvus`` part (default sizes 100,000 and 1,000,000, 64 bits): the ``Milvus`` index (a Milvus Lite
file in a temporary folder: the embedded server, over gRPC on a local socket) beside ``BFlat`` on
the same codes: build time (create + add), queries per second for single queries (k = 10) and
for one batch of all queries (k = 10 and 100), recall@k up to ties against ``BFlat``, and the
memory of the process (plus, for Milvus, of its server process).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import faiss
import numba
import numpy as np
import psutil

from benchmarks.common import clustered_packed, markdown_table, write_results
from tfhash.codes import hamming_distances
from tfhash.hamming import popcount
from tfhash.index import index_factory

KS = (1, 10, 100)


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


def _qps(search, queries, k, single: bool) -> float:
    """Queries per second: one call per query (``single``) or one call for the batch (median of 3)."""
    search(queries[:1], k)  # warm
    if single:
        seconds, _ = _median_time(lambda: [search(queries[i : i + 1], k) for i in range(len(queries))])
    else:
        seconds, _ = _median_time(lambda: search(queries, k))
    return len(queries) / seconds


def _milvus_lite_version() -> str:
    from importlib.metadata import version

    return version("milvus-lite")


def milvus_rows(n: int, bits: int, seed: int, n_queries: int, single_queries: int) -> list[dict]:
    """``BFlat`` and ``Milvus`` (Lite) on the same clustered codes (see the module docstring)."""
    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 256, (1000, bits // 8), dtype=np.uint8)
    db = clustered_packed(n, centres, rng)
    queries = clustered_packed(n_queries, centres, rng)
    rows, truth = [], {}
    with tempfile.TemporaryDirectory(prefix="tfhash-milvus-") as folder:
        for description in ("BFlat", "Milvus"):
            where = {"uri": f"{folder}/bench.db", "collection": f"bench_{n}_{bits}"} if description == "Milvus" else {}
            before = rss_mib()
            start = time.perf_counter()
            index = index_factory(bits, description, **where)
            index.add(db)
            build = time.perf_counter() - start
            server = sum(child.memory_info().rss for child in psutil.Process().children(recursive=True)) / 2**20
            memory = rss_mib() - before + (server if description == "Milvus" else 0.0)
            for k, single in ((10, True), (10, False), (100, False)):
                result = index.search(queries, k)
                truth.setdefault(k, result.distances)  # BFlat runs first: the exact answer
                qps = _qps(index.search, queries[:single_queries] if single else queries, k, single)
                rows.append({"n": n, "bits": bits, "index": description, "k": k,
                             "queries": f"single x {single_queries}" if single else f"batch of {n_queries}",
                             "build_s": round(build, 2), "memory_MiB": round(memory, 1), "QPS": round(qps, 1),
                             "recall@k": recall_up_to_ties(result.distances, truth[k]), "seed": seed})  # fmt: skip
                print(rows[-1], flush=True)
            index.close()
            del index
    return rows


BATCHES = (1, 32, 1000)


@numba.njit(parallel=True, nogil=True)
def _read_all(words):  # pragma: no cover - compiled
    chunks = numba.get_num_threads()
    size = -(-words.size // chunks)
    partial = np.zeros(chunks, np.uint64)
    for c in numba.prange(chunks):
        part = words[c * size : (c + 1) * size]
        acc = np.uint64(0)
        for j in range(np.uint64(part.size)):  # unsigned: no wrap-around checks, a vectorised loop
            acc ^= part[j]
        partial[c] = acc
    return partial


@numba.njit(parallel=True, nogil=True)
def _popcounts(words, query, rounds):  # pragma: no cover - compiled
    chunks = numba.get_num_threads()
    partial = np.zeros(chunks, np.int64)
    for c in numba.prange(chunks):
        acc = 0
        for _ in range(rounds):
            for j in range(words.size):
                acc += popcount(words[j] ^ query)
        partial[c] = acc
    return partial


def machine_limits(seed: int) -> dict:
    """Measured read bandwidth (GB/s, 1 GiB array) and XOR + popcount + add throughput (64-bit
    words per second, an L1-resident array), both on all of numba's threads; best of three."""
    rng = np.random.default_rng(seed)
    big = rng.integers(0, 2**63, 2**27, dtype=np.uint64)  # 1 GiB
    small = rng.integers(0, 2**63, 2048, dtype=np.uint64)  # 16 KiB
    _read_all(big[:1024]), _popcounts(small, np.uint64(1), 1)  # compile
    read, count = [], []
    rounds = 20_000
    for _ in range(3):
        start = time.perf_counter()
        _read_all(big)
        read.append(big.nbytes / (time.perf_counter() - start) / 1e9)
        start = time.perf_counter()
        _popcounts(small, np.uint64(12345), rounds)
        count.append(small.size * rounds * numba.get_num_threads() / (time.perf_counter() - start))
    return {"read_GBps": round(max(read), 1), "popcount_words_per_s": float(max(count)), "threads": numba.get_num_threads(),
            "seed": seed}  # fmt: skip


def read_bandwidth(array: np.ndarray) -> float:
    """GB/s of reading ``array`` once more, on all threads (warm: from cache when it fits); best of three."""
    words = array.reshape(-1).view(np.uint64)
    _read_all(words)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        _read_all(words)
        times.append(time.perf_counter() - start)
    return array.nbytes / min(times) / 1e9


def roofline_seconds(n: int, bits: int, queries: int, read_gbps: float, limits: dict) -> float:
    """The least time a search of ``queries`` over ``n`` codes can take on this machine: one read of
    the codes at ``read_gbps``, or the popcounts at the measured rate, whichever takes longer."""
    return max(n * bits / 8 / (read_gbps * 1e9), queries * n * (bits / 64) / limits["popcount_words_per_s"])


def _median_time(call, repeats: int = 3):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), result


def kernel_rows(n: int, bits: int, seed: int, limits: dict) -> list[dict]:
    """``BFlat`` (the kernel) beside ``faiss.IndexBinaryFlat``: same codes, threads and batches."""
    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 256, (1000, bits // 8), dtype=np.uint8)
    db = clustered_packed(n, centres, rng)
    queries = clustered_packed(max(BATCHES) * 2, centres, rng)
    plain = faiss.IndexBinaryFlat(bits)
    plain.use_heap = False
    plain.add(db)
    flat = index_factory(bits, "BFlat")
    flat.add(db)  # ids 0..n-1: the positions FAISS returns
    codes_gbps = read_bandwidth(db)
    rows = []
    for batch in BATCHES:
        # enough calls that a timing covers a few hundred milliseconds at 1M codes
        calls = max(1, min(200, 200_000_000 // (n * batch)))
        for k in KS:
            sets = [queries[(c * batch) % len(queries) :][:batch] for c in range(calls)]
            flat.search(sets[0], k), plain.search(sets[0], k)  # warm (compiles the kernel once)
            ours_s, ours = _median_time(lambda sets=sets, k=k: [flat.search(q, k) for q in sets])
            faiss_s, theirs = _median_time(lambda sets=sets, k=k: [plain.search(q, k) for q in sets])
            equal = all(np.array_equal(a.distances, d) and np.array_equal(a.ids, i)
                        for a, (d, i) in zip(ours, theirs, strict=True))  # fmt: skip
            limit = roofline_seconds(n, bits, batch, codes_gbps, limits) * calls
            rows.append({"n": n, "bits": bits, "batch": batch, "k": k, "calls": calls,
                         "tfhash_qps": round(batch * calls / ours_s, 1), "faiss_qps": round(batch * calls / faiss_s, 1),
                         "ratio": round(faiss_s / ours_s, 2), "tfhash_roofline": round(limit / ours_s, 3),
                         "faiss_roofline": round(limit / faiss_s, 3), "equal": equal, "codes_read_GBps": round(codes_gbps, 1),
                         "codes_MiB": round(flat.codes().nbytes / 2**20, 1),
                         "faiss_codes_MiB": round(plain.ntotal * plain.code_size / 2**20, 1), "seed": seed})  # fmt: skip
            print(rows[-1], flush=True)
    return rows


def kernel_markdown(rows: list[dict], limits: dict, command: str) -> str:
    return (
        "# Exact Hamming search: tfhash's kernel (BFlat) beside faiss.IndexBinaryFlat\n\n"
        f"Command: `{command}`. Threads: {limits['threads']} for both (numba and FAISS's OpenMP). Each row: "
        "the same batches of queries through `BFlat.search` and `faiss.IndexBinaryFlat.search` (`use_heap = False`), "
        "`calls` batches per timing, median of three timings; `equal`: every answer identical (distances and ids, ties "
        "included). `ratio`: FAISS time / tfhash time. Machine limits measured in the same run: read bandwidth "
        f"{limits['read_GBps']} GB/s (1 GiB array, all threads), XOR + popcount + add "
        f"{limits['popcount_words_per_s'] / 1e9:.2f} G words/s (L1-resident, all threads, as numba compiles the kernel). "
        "Roofline of a batch: max(n K/8 bytes / `codes_read_GBps`, m n K/64 words / popcount rate), where "
        "`codes_read_GBps` is the measured rate of reading these codes once more (from cache when they fit, so the "
        "memory roof of 1M codes is the cache's); `*_roofline` is that time over the measured time (1.0 = at the "
        "limit). `codes_MiB`: the codes each holds (BFlat also keeps the int64 ids).\n\n"
        + markdown_table(rows, ["n", "bits", "batch", "k", "calls", "tfhash_qps", "faiss_qps", "ratio", "tfhash_roofline",
                                "faiss_roofline", "equal", "codes_read_GBps", "codes_MiB", "faiss_codes_MiB"])  # fmt: skip
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--bits", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--name", default=None, help="results file name (default: index, or index_kernel for --part kernel)")
    parser.add_argument("--part", choices=["indexes", "kernel", "milvus"], default="indexes",
                        help="indexes: every index type; kernel: BFlat's kernel beside faiss.IndexBinaryFlat and the roofline; "
                             "milvus: the Milvus index (Lite) beside BFlat")  # fmt: skip
    args = parser.parse_args()
    if args.part == "milvus":
        sizes = args.sizes if args.sizes != parser.get_default("sizes") else [100_000, 1_000_000]
        bits = args.bits if args.bits != parser.get_default("bits") else [64]
        name = args.name or "index_milvus"
        rows = [row for n in sizes for b in bits for row in milvus_rows(n, b, args.seed, args.queries, 200)]
        command = (f"python -m benchmarks.index --part milvus --seed {args.seed} --sizes {' '.join(map(str, sizes))} "
                   f"--bits {' '.join(map(str, bits))}")  # fmt: skip
        md = (f"# Milvus index beside BFlat\n\nCommand: `{command}`. Milvus Lite {_milvus_lite_version()} (embedded server, "
              f"local socket), BIN_FLAT, HAMMING; BFlat threads: {numba.get_num_threads()}. QPS: median of 3 timings; "
              "single: one search call per query; batch: one call for all queries. recall@k: returned items within "
              "BFlat's k-th distance. memory_MiB: process RSS growth during the build, plus the Milvus Lite server's "
              "RSS for Milvus.\n\n"
              + markdown_table(rows, ["n", "bits", "index", "k", "queries", "build_s", "memory_MiB", "QPS", "recall@k"]) + "\n")  # fmt: skip
        write_results(name, {"seed": args.seed, "rows": rows}, md)
        return
    if args.part == "kernel":
        name = args.name or "index_kernel"
        faiss.omp_set_num_threads(numba.get_num_threads())
        limits = machine_limits(args.seed)
        print(limits, flush=True)
        rows = [row for n in args.sizes for bits in args.bits for row in kernel_rows(n, bits, args.seed, limits)]
        command = (f"python -m benchmarks.index --part kernel --seed {args.seed} --sizes {' '.join(map(str, args.sizes))} "
                   f"--bits {' '.join(map(str, args.bits))}")  # fmt: skip
        write_results(name, {"seed": args.seed, "limits": limits, "rows": rows}, kernel_markdown(rows, limits, command))
        return
    args.name = args.name or "index"
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
