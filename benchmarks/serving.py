"""Search service load benchmark: QPS and p50 / p99 latency at 1, 8 and 32 concurrent
clients over a 1M-code index, bounded in time, over gRPC on loopback.

    python -m benchmarks.serving [--seed 0] [--size 1000000] [--bits 64] [--kinds BFlat BIVF1024]
                                 [--clients 1 8 32] [--seconds 10] [--repeats 3] [--modes codes features]

Set-up: a seeded, untrained SCDH model over 32-d feature vectors is exported as version 1 (the
pipeline's export code); ``size`` random-but-clustered codes (as in ``benchmarks.index``) form the
database of each index kind, saved as that version's index. The search service runs as its own
process (``tfhash serve search``, in-process encoder); the clients are threads of this process,
each with its own channel, sending one query per request (k = 10) back to back for ``seconds``
after a warm-up. ``codes`` requests carry packed codes (search only); ``features`` requests carry
a feature vector that the service encodes with the model first. Client and server share the
machine's cores, so the numbers include the clients' own CPU use.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

import numpy as np
import psutil

from benchmarks.common import markdown_table, write_results
from benchmarks.index import clustered_packed

DIM, K = 32, 10


def export_model(path: str, bits: int, seed: int) -> None:
    import keras
    from tfhash.components.export import export_feature_model

    from tfhash.models import build_scdh, mlp

    keras.utils.set_random_seed(seed)
    model = build_scdh(mlp(DIM, (64,)), 10, bits)
    model(np.zeros((1, DIM), np.float32))
    export_feature_model(model, path, "features", [DIM], bits)


def start_service(model_base: str, index_base: str, kind: str, threads: int, search_threads: int):
    """``tfhash serve search`` as its own process (in-process encoder); returns (process, address)."""
    from tests.serving_fixtures import start_cli

    return start_cli(["serve", "search", "--model-base-dir", model_base, "--index-base-dir", index_base, "--kind", kind,
                      "--port", "0", "--threads", str(threads), "--search-threads", str(search_threads)], "search service on ")  # fmt: skip


def run_level(address: str, clients: int, seconds: float, make_request, server=None) -> dict:
    """``clients`` threads sending requests back to back for ``seconds``; latencies in ms. With
    ``server`` (a ``psutil.Process``), also the CPU seconds per request, from the OS, of the server
    (its process and children) and of this process (the load generator), over the measured span."""
    import grpc
    from tfhash.serving import search_pb2_grpc

    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    start_barrier = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(slot: int) -> None:
        rng = np.random.default_rng(slot)
        with grpc.insecure_channel(address) as channel:
            stub = search_pb2_grpc.HashSearchStub(channel)
            for _ in range(5):  # warm-up: connection, first calls
                stub.Search(make_request(rng), timeout=30)
            start_barrier.wait()
            while time.perf_counter() < stop_at[0]:
                request = make_request(rng)
                begin = time.perf_counter()
                try:
                    stub.Search(request, timeout=30)
                    latencies[slot].append((time.perf_counter() - begin) * 1000.0)
                except grpc.RpcError:
                    errors[slot] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    stop_at[0] = time.perf_counter() + 3600
    start_barrier.wait()
    begin, cpu = time.perf_counter(), cpu_seconds(server)
    stop_at[0] = begin + seconds
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - begin
    server_cpu, client_cpu = (after - before for after, before in zip(cpu_seconds(server), cpu, strict=True))
    flat = np.concatenate([np.asarray(x) for x in latencies])
    row = {"clients": clients, "requests": int(flat.size), "errors": int(sum(errors)), "seconds": round(elapsed, 2),
           "qps": round(flat.size / elapsed, 1), "p50_ms": round(float(np.percentile(flat, 50)), 2),
           "p99_ms": round(float(np.percentile(flat, 99)), 2)}  # fmt: skip
    if server is not None:
        row.update({"server_cpu_ms_per_request": round(server_cpu * 1000 / max(flat.size, 1), 3),
                    "client_cpu_ms_per_request": round(client_cpu * 1000 / max(flat.size, 1), 3)})  # fmt: skip
    return row


def cpu_seconds(server) -> tuple[float, float]:
    """(user + system CPU seconds of ``server`` and its children, of this process) from the OS;
    (0, 0) without a server."""
    if server is None:
        return 0.0, 0.0
    processes = [server, *server.children(recursive=True)]
    used = sum(sum(p.cpu_times()[:2]) for p in processes)
    return used, sum(os.times()[:2])


def summarise_runs(runs: list[dict]) -> dict:
    """Median QPS and latencies over repeated runs of one row, with the QPS and p99 range."""
    def median(key):
        return round(float(np.median([r[key] for r in runs])), 2)

    summary = {"clients": runs[0]["clients"], "repeats": len(runs), "requests": sum(r["requests"] for r in runs),
               "errors": sum(r["errors"] for r in runs), "qps": median("qps"), "qps_min": min(r["qps"] for r in runs),
               "qps_max": max(r["qps"] for r in runs), "p50_ms": median("p50_ms"), "p99_ms": median("p99_ms"),
               "p99_ms_max": max(r["p99_ms"] for r in runs)}  # fmt: skip
    for key in ("server_cpu_ms_per_request", "client_cpu_ms_per_request"):
        if key in runs[0]:
            summary[key] = round(float(np.median([r[key] for r in runs])), 3)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--bits", type=int, default=64)
    parser.add_argument("--kinds", nargs="+", default=["BFlat", "BIVF1024"])
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3, help="runs per row (median and range reported)")
    parser.add_argument("--modes", nargs="+", default=["codes", "features"], choices=["codes", "features"])
    parser.add_argument("--threads", type=int, default=8, help="server worker threads")
    parser.add_argument("--search-threads", type=int, default=1, help="threads per index search in the server")
    parser.add_argument("--name", default="serving")
    args = parser.parse_args()

    from tfhash.serving.search_client import search_request

    from tfhash.artifacts import signature_fingerprint
    from tfhash.index import index_factory

    rng = np.random.default_rng(args.seed)
    centres = rng.integers(0, 256, (1000, args.bits // 8), dtype=np.uint8)
    database = clustered_packed(args.size, centres, rng)
    query_pool = clustered_packed(10_000, centres, rng)
    feature_pool = rng.normal(size=(10_000, DIM)).astype(np.float32)
    requests = {
        "codes": lambda r: search_request(codes=query_pool[r.integers(len(query_pool))][None], k=K),
        "features": lambda r: search_request(features=feature_pool[r.integers(len(feature_pool))][None], k=K),
    }
    rows = []
    with tempfile.TemporaryDirectory() as work:
        model_base, index_base = os.path.join(work, "models"), os.path.join(work, "indexes")
        export_model(os.path.join(model_base, "1"), args.bits, args.seed)
        fingerprint = signature_fingerprint(os.path.join(model_base, "1"))
        for kind in args.kinds:
            build_start = time.perf_counter()
            index = index_factory(args.bits, kind)
            index.add(database)
            index.save(os.path.join(index_base, "1", kind), model_version="1", signature_fingerprint=fingerprint)
            build_s = time.perf_counter() - build_start
            del index
            process, address = start_service(model_base, index_base, kind, args.threads, args.search_threads)
            server = psutil.Process(process.pid)
            try:
                for mode in args.modes:
                    for clients in args.clients:
                        runs = [run_level(address, clients, args.seconds, requests[mode], server) for _ in range(args.repeats)]
                        row = {"index": kind, "n": args.size, "bits": args.bits, "mode": mode, "k": K,
                               **summarise_runs(runs), "index_build_s": round(build_s, 1), "seed": args.seed}  # fmt: skip
                        print(row, flush=True)
                        rows.append(row)
            finally:
                process.terminate()
                process.wait(60)
    columns = ["index", "n", "bits", "mode", "clients", "repeats", "requests", "errors", "qps", "qps_min", "qps_max",
               "p50_ms", "p99_ms", "p99_ms_max", "server_cpu_ms_per_request", "client_cpu_ms_per_request", "seed"]  # fmt: skip
    command = "python -m benchmarks.serving " + " ".join(sys.argv[1:])
    markdown = (
        "# Search service load benchmark\n\n"
        f"Command: `{command.strip()}`. One query per request, k = {K}, over gRPC on loopback; the search "
        f"service (`tfhash serve search`, {args.threads} worker threads, {args.search_threads} thread(s) per index search, in-process encoder) runs as its own "
        "process; the clients are threads of the benchmark process, one channel each, sending back to back "
        f"for {args.seconds:g} s per run after a warm-up, on the same {os.cpu_count()} cores as the server; each row "
        f"is run {args.repeats} times (qps, p50 and p99 are medians; min / max give the spread, which is wide on "
        "this shared virtual machine). "
        "`codes`: the request carries a packed code (search only); `features`: a 32-d vector that the "
        "service encodes with the model (an MLP) before it searches. Database: random-but-clustered codes "
        "as in the index benchmark. CPU per request is from the OS (user + system seconds over the measured "
        "span divided by the requests answered): the server's process and children, and the benchmark process "
        "that runs the clients.\n\n" + markdown_table(rows, columns) + "\n"
    )
    write_results(args.name, {"command": command, "rows": rows, "seed": args.seed}, markdown)


if __name__ == "__main__":
    main()
