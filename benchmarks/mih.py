"""``BMIH`` (exact multi-index hashing, :mod:`tfhash.mih`) beside ``BFlat`` and FAISS's binary
indexes, from 1M to 100M codes.

    python -m benchmarks.mih [--sizes 1000000 10000000 100000000] [--bits 64] [--codes clustered uniform]
                             [--faiss flat multihash ivf hnsw] [--faiss-up-to 10000000] [--hnsw-up-to 1000000]
                             [--add 1000000] [--seed 0]

Codes: ``clustered``, the index benchmark's (1,000 random centres, each item a centre with every
bit flipped with probability 1/8; queries drawn the same way), or ``uniform`` random bits (the
worst case: the k-th neighbour lies far). For each size, bits and codes:

* ``BMIH``: build seconds, the bytes its arrays hold against the codes', the peak resident memory
  the build added, its disk size (saved and loaded back mapped, as the search service loads it);
  single queries (``--singles`` of them, one call each: p50, p99 and QPS) and batches of 32, at
  k = 1, 10, 100; and **every answer compared with ``BFlat``'s** (distances and ids, ties in
  insertion order) on the queries ``BFlat`` answers.
* ``BFlat``: the same queries (``--flat-singles`` of them one by one where a scan is slow).
* FAISS (up to ``--faiss-up-to`` codes: their copies and structures must fit beside ours):
  ``IndexBinaryFlat`` (exact), and ``IndexBinaryMultiHash`` (``nflip``), ``IndexBinaryIVF``
  (sqrt(n) lists, ``nprobe``) and ``IndexBinaryHNSW`` (``efSearch``), each at the first setting of
  its knob whose recall@10 up to ties reaches 0.999 (or its last), with that recall.
* ``--add N``: N more codes added to the built index (a segment of their own), the add's seconds
  beside the whole build, and the answers compared with an index built whole.

Threads: numba's and FAISS's, both every core. Results: ``benchmarks/results/mih.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import faiss
import numba
import numpy as np

from benchmarks.common import clustered_packed, cpu_description, markdown_table, write_results
from tfhash.hamming import knn_search
from tfhash.index import MultiIndexHashing, index_factory, load_index

KS = (1, 10, 100)
BATCH = 32
CENTRES = 1000
RECALL = 0.999


def peak_rss_reset() -> None:
    """Start a new peak of this process's resident memory (Linux: ``clear_refs`` 5)."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def rss_mib(field: str) -> float:
    """``VmRSS`` or ``VmHWM`` (the peak since :func:`peak_rss_reset`) of this process, MiB."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def make_codes(kind: str, n: int, bits: int, rng, centres: np.ndarray | None) -> np.ndarray:
    if kind == "clustered":
        return clustered_packed(n, centres, rng)
    out = np.empty((n, bits // 8), np.uint8)
    for start in range(0, n, 1_000_000):
        stop = min(start + 1_000_000, n)
        out[start:stop] = rng.integers(0, 256, (stop - start, bits // 8), dtype=np.uint8)
    return out


def timed_singles(search, queries: np.ndarray, k: int) -> tuple[list, np.ndarray, np.ndarray]:
    """One call per query: the answers and each call's milliseconds."""
    search(queries[:1], k)  # warm (compiles)
    times, distances, ids = [], [], []
    for i in range(len(queries)):
        start = time.perf_counter()
        d, p = search(queries[i : i + 1], k)
        times.append((time.perf_counter() - start) * 1e3)
        distances.append(d[0])
        ids.append(p[0])
    return times, np.array(distances), np.array(ids)


def timed_batches(search, queries: np.ndarray, k: int) -> float:
    """Queries per second over batches of :data:`BATCH`."""
    search(queries[:BATCH], k)
    start = time.perf_counter()
    for i in range(0, len(queries) - BATCH + 1, BATCH):
        search(queries[i : i + BATCH], k)
    return (len(queries) // BATCH * BATCH) / (time.perf_counter() - start)


def recall_up_to_ties(distances: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean(distances <= truth[:, -1:]))


def latency_row(times: list) -> dict:
    return {"p50_ms": round(float(np.percentile(times, 50)), 3), "p99_ms": round(float(np.percentile(times, 99)), 3),
            "qps_single": round(1e3 / float(np.mean(times)), 1)}  # fmt: skip


def faiss_rows(kind: str, db: np.ndarray, queries: np.ndarray, truth: dict, base: dict, mih_tables: int) -> list[dict]:
    """FAISS's binary indexes on the same codes; the approximate ones at the first setting of their
    knob that reaches :data:`RECALL` at k = 10."""
    bits = db.shape[1] * 8
    rows = []
    for name in kind:
        start = time.perf_counter()
        if name == "flat":
            index, knob, values = faiss.IndexBinaryFlat(bits), None, [None]
        elif name == "multihash":
            index, knob, values = faiss.IndexBinaryMultiHash(bits, mih_tables, bits // mih_tables), "nflip", [0, 1, 2, 3, 4]
        elif name == "ivf":  # sqrt(n) lists trained on 30 codes a list: 4 sqrt(n) trains for hours at 10M on 2 cores
            nlist = int(np.sqrt(db.shape[0]))
            index, knob, values = faiss.IndexBinaryIVF(faiss.IndexBinaryFlat(bits), bits, nlist), "nprobe", [1, 4, 16, 64, 256]
            index.train(db[np.random.default_rng(0).choice(db.shape[0], min(db.shape[0], 30 * nlist), replace=False)])
        else:
            index, knob, values = faiss.IndexBinaryHNSW(bits, 16), "efSearch", [16, 64, 256, 1024]
        index.add(db)
        build = time.perf_counter() - start
        chosen = None
        for value in values:
            if knob == "efSearch":
                index.hnsw.efSearch = value
            elif knob is not None:
                setattr(index, knob, value)
            distances, _ = index.search(queries, 10)
            recall = recall_up_to_ties(distances, truth[10][0])
            chosen = (value, recall)
            if recall >= RECALL:
                break
        for k in KS:
            times, distances, _ = timed_singles(index.search, queries, k)
            row = {**base, "index": f"faiss {name}" + (f" {knob}={chosen[0]}" if knob else ""), "k": k, "build_s": round(build, 1),
                   **latency_row(times), "qps_batch32": round(timed_batches(index.search, queries, k), 1),
                   "recall": round(recall_up_to_ties(distances, truth[k][0]), 4)}  # fmt: skip
            rows.append(row)
            print(row, flush=True)
        del index
    return rows


def run(n: int, bits: int, kind: str, args, rng) -> list[dict]:
    centres = rng.integers(0, 256, (CENTRES, bits // 8), dtype=np.uint8)
    db = make_codes(kind, n, bits, rng, centres)
    queries = make_codes(kind, args.singles, bits, rng, centres)
    base = {"n": n, "bits": bits, "codes": kind}
    rows = []

    peak_rss_reset()
    before = rss_mib("VmRSS")
    start = time.perf_counter()
    index = MultiIndexHashing(bits)
    index.add(db)
    build = time.perf_counter() - start
    peak = rss_mib("VmHWM") - before
    held = sum(a.nbytes for s in index.segments for a in s.files().values())
    segment = index.segments[0]
    folder = tempfile.mkdtemp(prefix="tfhash-mih-bench-", dir=args.scratch)
    try:
        start = time.perf_counter()
        index.save(os.path.join(folder, "index"))
        save = time.perf_counter() - start
        disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)
        del index
        start = time.perf_counter()
        index = load_index(os.path.join(folder, "index"), mapped=True)
        load = time.perf_counter() - start
        structure = {"tables": segment.tables, "key_bits": segment.key_bits, "build_s": round(build, 1),
                     "held_vs_codes": round(held / db.nbytes, 2),
                     "build_peak_vs_codes": round(peak * 2**20 / db.nbytes, 2), "disk_GB": round(disk / 1e9, 2),
                     "save_s": round(save, 1), "load_mapped_s": round(load, 1)}  # fmt: skip
        print(base, structure, flush=True)

        flat = index_factory(bits, "BFlat")
        flat.add(db)
        truth, flat_times = {}, {}
        checked = queries[: args.flat_singles]
        for k in KS:
            flat_times[k], d, p = timed_singles(lambda q, kk: knn_search(q, db, kk), checked, k)
            truth[k] = (d, p)
        for k in KS:
            times, d, p = timed_singles(index.search, queries, k)
            index.scanned = 0
            index.search(queries, k)
            scanned = index.scanned
            same = bool(np.array_equal(d[: len(checked)], truth[k][0]) and np.array_equal(p[: len(checked)], truth[k][1]))
            flat_row = latency_row(flat_times[k])
            row = {**base, "index": "tfhash BMIH", "k": k, **structure, **latency_row(times),
                   "qps_batch32": round(timed_batches(index.search, queries, k), 1), "recall": 1.0,
                   "identical_to_BFlat": f"{same} ({len(checked)} queries)",
                   "vs_BFlat_single": round(1e3 / np.mean(times) / flat_row["qps_single"], 1),
                   "kth_distance_median": float(np.median(d[:, -1])),
                   "scanned": round(scanned / len(queries), 3)}  # fmt: skip
            rows.append(row)
            print(row, flush=True)
            rows.append({**base, "index": "tfhash BFlat", "k": k, **flat_row,
                         "qps_batch32": round(timed_batches(flat.search, checked if len(checked) >= BATCH else queries, k), 1),
                         "recall": 1.0})  # fmt: skip
            print(rows[-1], flush=True)
        del flat
        if n <= args.faiss_up_to:
            kinds = [name for name in args.faiss if name != "hnsw" or n <= args.hnsw_up_to]
            rows += faiss_rows(kinds, db, checked, truth, base, segment.tables)
        if args.add:
            more = make_codes(kind, args.add, bits, rng, centres)
            start = time.perf_counter()
            index.add(more)
            added = time.perf_counter() - start
            whole = MultiIndexHashing(bits)
            whole.add(np.concatenate([db, more]))
            d1, p1 = index.search(queries, 10)
            d2, p2 = whole.search(queries, 10)
            row = {**base, "index": f"tfhash BMIH + {args.add} added", "k": 10, "build_s": round(added, 1),
                   "segments": " + ".join(str(s.count) for s in index.segments),
                   "identical_to_BFlat": f"{bool(np.array_equal(d1, d2) and np.array_equal(p1, p2))} (to a BMIH built whole, "
                                         f"{len(queries)} queries)"}  # fmt: skip
            rows.append(row)
            print(row, flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000, 100_000_000])
    parser.add_argument("--bits", type=int, nargs="+", default=[64])
    parser.add_argument("--codes", nargs="+", choices=["clustered", "uniform"], default=["clustered", "uniform"])
    parser.add_argument("--faiss", nargs="*", choices=["flat", "multihash", "ivf", "hnsw"], default=["flat", "multihash", "ivf", "hnsw"])
    parser.add_argument("--faiss-up-to", type=int, default=10_000_000, help="sizes beyond this run no FAISS index")
    parser.add_argument("--hnsw-up-to", type=int, default=1_000_000, help="sizes beyond this build no HNSW graph (the slowest build: see its build_s at 1M)")
    parser.add_argument("--singles", type=int, default=1000, help="queries timed one by one")
    parser.add_argument("--flat-singles", type=int, default=200, help="of them, the ones BFlat and FAISS answer too")
    parser.add_argument("--add", type=int, default=0, help="codes added to each built index (0: none)")
    parser.add_argument("--scratch", default=None, help="folder for the saved index (default: the system's temporary folder)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="mih")
    args = parser.parse_args()
    faiss.omp_set_num_threads(numba.get_num_threads())
    rng = np.random.default_rng(args.seed)
    rows = [row for n in args.sizes for bits in args.bits for kind in args.codes for row in run(n, bits, kind, args, rng)]
    command = ("python -m benchmarks.mih --sizes " + " ".join(map(str, args.sizes)) + " --bits " + " ".join(map(str, args.bits))
               + " --codes " + " ".join(args.codes) + " --faiss " + " ".join(args.faiss) + f" --faiss-up-to {args.faiss_up_to} --hnsw-up-to {args.hnsw_up_to}"
               + f" --singles {args.singles} --flat-singles {args.flat_singles} --add {args.add} --seed {args.seed}")  # fmt: skip
    columns = ["n", "bits", "codes", "index", "k", "p50_ms", "p99_ms", "qps_single", "qps_batch32", "recall", "vs_BFlat_single",
               "identical_to_BFlat", "kth_distance_median", "scanned", "tables", "key_bits", "build_s", "held_vs_codes",
               "build_peak_vs_codes", "disk_GB", "load_mapped_s", "segments"]  # fmt: skip
    md = (f"# BMIH: exact multi-index hashing beside BFlat and FAISS\n\nCommand: `{command}`; {cpu_description()}, "
          f"{numba.get_num_threads()} threads (numba and FAISS). Clustered codes: {CENTRES} centres, every bit flipped with "
          "probability 1/8. p50 / p99 / qps_single: one call per query; qps_batch32: batches of 32. recall: returned items "
          "within the true k-th distance. held_vs_codes: bytes of the index's arrays (its copy of the codes and the tables; the "
          "automatic ids are a range, kept as its first id) over the codes' bytes; build_peak_vs_codes: the resident "
          "memory the build added, over the codes' bytes. identical_to_BFlat: every distance and id equal on the queries "
          "BFlat answered. scanned: the share of single queries whose work passed the limit and that scanned linearly "
          "instead.\n\n" + markdown_table(rows, columns) + "\n")  # fmt: skip
    write_results(args.name, {"seed": args.seed, "command": command, "rows": rows}, md)


if __name__ == "__main__":
    main()
