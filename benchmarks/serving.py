"""Search service load benchmark: QPS and p50 / p99 latency at 1, 8 and 32 concurrent
clients over a 1M-code index, bounded in time, over gRPC on loopback.

    python -m benchmarks.serving [--seed 0] [--size 1000000] [--bits 64] [--kinds BFlat BIVF1024]
                                 [--clients 1 8 32] [--seconds 10] [--repeats 3] [--modes codes features]
                                 [--processes 1 2] [--tf-threads 0] [--baseline DIR [--baseline-front compiled]]
                                 [--load-generators python cpp] [--load-processes 2]

Set-up: a seeded, untrained SCDH model over 32-d feature vectors is exported as version 1 (the
pipeline's export code); ``size`` random-but-clustered codes (as in ``benchmarks.index``) form the
database of each index kind, saved as that version's index. The search service runs as its own
process (``tfhash serve search``, in-process encoder), or as ``--processes`` serving processes on
one port under a supervising parent. The clients are closed-loop: each sends one query per
request (k = 10, serialized in advance) back to back for ``seconds`` after a warm-up, on a
connection of its own. ``--load-generators python`` runs them as asyncio gRPC clients spread over
``--load-processes`` processes; ``cpp`` in one thread of ``benchmarks/loadgen.cc``, on gRPC's C++
asynchronous client (compiled here, against Debian's ``libgrpc++-dev``), which takes a few times less
CPU per request, so that less of the shared cores goes to the clients. ``codes``
requests carry packed codes (search only); ``features`` requests carry a feature vector that the
service encodes with the model first. Client and server share the
machine's cores; the CPU seconds per request of the server and of the load generator are measured
apart, from the OS. Every service of an index (each ``--processes`` value and ``--event-loops`` entry)
runs at once on its own copy of the index, and the repeats take turns between them, so that a slow
spell of this shared machine falls on all of them alike. ``--baseline DIR`` runs, beside this
checkout's service (front ``aio+<loop>``), the service of another checkout ``DIR`` (an earlier commit with
its own ``.venv``) with ``--front <baseline-front>`` (front ``<baseline-front>@<DIR's commit>``), to
compare with code that no longer exists here. Before any load, each service must answer the first
:data:`CHECKED` code requests as the library's search of its index does.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import psutil
from tfhash.serving.event_loop import EVENT_LOOPS

from benchmarks.certificates import make_certificates
from benchmarks.common import checkout_commit, clustered_packed, markdown_table, write_results

DIM, K = 32, 10
CHECKED = 200  # requests whose answers each service must give as the library does, before any load


def export_model(path: str, bits: int, seed: int) -> None:
    import keras

    from tfhash.export import export_feature_model
    from tfhash.models import build_scdh, mlp

    keras.utils.set_random_seed(seed)
    model = build_scdh(mlp(DIM, (64,)), 10, bits)
    model(np.zeros((1, DIM), np.float32))
    export_feature_model(model, path, "features", [DIM], bits)


def start_service(model_base: str, index_base: str, kind: str, search_threads: int, processes: int = 1, tf_threads: int = 0,
                  baseline: tuple[str, str] | None = None, event_loop: str = "auto", access_args: list[str] = ()):  # fmt: skip
    """``tfhash serve search`` as its own process(es) (in-process encoder, ``--event-loop
    event_loop``, and ``access_args``: TLS and the token); returns (the started process, address).
    ``baseline`` ``(checkout, front)``: the command of that checkout's own ``.venv`` with ``--front
    front`` instead (its other options at their defaults)."""
    from tfhash.serving.processes import start_command

    args = ["serve", "search", "--model-base-dir", model_base, "--index-base-dir", index_base, "--kind", kind, "--port", "0",
            "--search-threads", str(search_threads), "--processes", str(processes), "--tf-threads", str(tf_threads), *access_args]  # fmt: skip
    if baseline is None:
        return start_command([*args, "--event-loop", event_loop], "search service on ")
    checkout, front = baseline
    return start_command([*args, "--front", front], "search service on ", executable=os.path.join(checkout, ".venv", "bin", "python"))


def family(processes: psutil.Process | list[psutil.Process]) -> list[psutil.Process]:
    """``processes`` (a service's top process, or a load generator's processes) and all their
    children (a service's serving processes and front)."""
    tops = processes if isinstance(processes, list) else [processes]
    return [p for process in tops for p in [process, *process.children(recursive=True)]]


def server_memory(server) -> dict:
    """Memory of the service's processes (the parent and its children), in MB, from the OS: the sum
    of resident sets (pages shared between processes counted in each), of proportional sets (shared
    pages split between their sharers: the sum counts them once) and of unshared pages; and the
    same for the mapped index codes (``codes.npy``) alone and for every mapped array of the index
    (``*.npy``: BMIH's tables too)."""
    totals = dict.fromkeys(("rss_mb", "pss_mb", "uss_mb", "codes_rss_mb", "codes_pss_mb", "mapped_rss_mb", "mapped_pss_mb"), 0.0)
    processes = family(server)
    for process in processes:
        full = process.memory_full_info()
        totals["rss_mb"] += full.rss / 2**20
        totals["pss_mb"] += full.pss / 2**20
        totals["uss_mb"] += full.uss / 2**20
        for mapping in process.memory_maps(grouped=True):
            if mapping.path.endswith("codes.npy"):
                totals["codes_rss_mb"] += mapping.rss / 2**20
                totals["codes_pss_mb"] += mapping.pss / 2**20
            if mapping.path.endswith(".npy"):
                totals["mapped_rss_mb"] += mapping.rss / 2**20
                totals["mapped_pss_mb"] += mapping.pss / 2**20
    return {"server_processes": len(processes), **{key: round(value, 1) for key, value in totals.items()}}


SEARCH_METHOD = "/tfhash.serving.HashSearch/Search"


def secure_channel(address: str, secure: dict | None, aio: bool = False, options=()):
    """A channel to ``address``: plaintext, or (``secure``: ``{"ca": PEM file, "token": str}``) TLS
    trusting that CA; the calls carry :func:`call_metadata`."""
    import grpc

    module = grpc.aio if aio else grpc
    if secure is None:
        return module.insecure_channel(address, options=list(options))
    with open(secure["ca"], "rb") as file:
        return module.secure_channel(address, grpc.ssl_channel_credentials(file.read()), options=list(options))


def call_metadata(secure: dict | None) -> tuple:
    return (("authorization", f"Bearer {secure['token']}"),) if secure else ()


def load_process(address: str, clients: int, first_slot: int, requests: list[bytes], k: int, conn, secure: dict | None = None) -> None:
    """One Python load-generator process: ``clients`` asyncio clients (numbered from ``first_slot``),
    each with its own gRPC channel, sending pre-serialized requests back to back. Answers are parsed
    and checked once per client after its warm-up and otherwise left as bytes, so the generator
    spends little CPU. Sends "ready" after the warm-up, receives the ``(start, stop)`` wall-clock
    times of the measured span, and sends back the latency in ms of each request answered within
    the span and the errors; or, if anything fails, the error's text. ``secure``: TLS and the token
    (:func:`secure_channel`)."""
    import asyncio

    import grpc

    metadata = call_metadata(secure)

    async def main() -> None:
        warm, go, window, latencies = asyncio.Event(), asyncio.Event(), [], []
        warmed = [0]

        async def client(slot: int) -> int:
            errors = 0
            # a connection of its own, as separate clients have (gRPC otherwise shares one connection
            # between the channels of a process to one address)
            async with secure_channel(address, secure, aio=True, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
                call = channel.unary_unary(SEARCH_METHOD)  # bytes in and out
                for i in range(5):  # warm-up: connection, first calls
                    answer = await call(requests[(slot + i) % len(requests)], timeout=30, metadata=metadata)
                check_answer(answer, address, k)
                warmed[0] += 1
                if warmed[0] == clients:
                    warm.set()
                await go.wait()
                start, stop = window
                await asyncio.sleep(max(start - time.time(), 0.0))
                i = slot * 7919
                while time.time() < stop:
                    request, i = requests[i % len(requests)], i + 1
                    begin = time.perf_counter()
                    try:
                        await call(request, timeout=30, metadata=metadata)
                    except grpc.aio.AioRpcError:
                        errors += 1
                        continue
                    if time.time() <= stop:
                        latencies.append((time.perf_counter() - begin) * 1000.0)
            return errors

        tasks = [asyncio.create_task(client(slot)) for slot in range(first_slot, first_slot + clients)]
        warming = asyncio.gather(*tasks)
        await asyncio.wait([warming, asyncio.create_task(warm.wait())], return_when=asyncio.FIRST_COMPLETED)
        if warming.done():  # a client failed during its warm-up
            warming.result()
        conn.send("ready")
        window.extend(await asyncio.get_running_loop().run_in_executor(None, conn.recv))
        go.set()
        errors = sum(await warming)
        conn.send((np.asarray(latencies), errors))

    try:
        asyncio.run(main())
    except BaseException as err:  # noqa: BLE001 - reported to the benchmark, which stops with it
        conn.send(f"load process failed: {type(err).__name__}: {err}")


def check_answer(answer: bytes, address: str, k: int) -> None:
    """A warm-up answer must be one result of ``k`` ids: the load is then known to be real searches."""
    from tfhash.serving import search_pb2

    found = search_pb2.SearchResponse.FromString(answer)
    if len(found.results) != 1 or len(found.results[0].ids) != k:
        raise RuntimeError(f"unexpected answer from {address}: {found}")


def check_answers(address: str, requests: list[bytes], expected, secure: dict | None = None) -> None:
    """Each of ``requests`` (one code each) must be answered with ``expected``'s row (the library's
    search): the ids and distances, in order."""
    from tfhash.serving import search_pb2

    with secure_channel(address, secure) as channel:
        search = channel.unary_unary(SEARCH_METHOD, response_deserializer=search_pb2.SearchResponse.FromString)
        for row, request in enumerate(requests):
            answer = search(request, timeout=30, metadata=call_metadata(secure))
            if len(answer.results) != 1 or answer.model_version != "1":
                raise RuntimeError(f"{address} answered request {row} with {len(answer.results)} results of version {answer.model_version!r}")
            found = answer.results[0]
            if list(found.ids) != expected.ids[row].tolist() or list(found.distances) != expected.distances[row].tolist():
                raise RuntimeError(f"{address} answered request {row} with ids {list(found.ids)}, distances {list(found.distances)}; "
                                   f"the library's search gives {expected.ids[row].tolist()}, {expected.distances[row].tolist()}")


class PythonLoad:
    """The Python load generator: ``clients`` spread over ``processes`` :func:`load_process`
    processes. A context manager: entered, its clients are connected and warmed up."""

    def __init__(self, address: str, clients: int, requests: list[bytes], processes: int = 2, secure: dict | None = None):
        self.args, self.secure = (address, clients, requests), secure
        self.shares = [clients // processes + (i < clients % processes) for i in range(min(processes, clients))]
        self.pipes, self.workers = [], []

    def __enter__(self) -> PythonLoad:
        import multiprocessing

        address, _, requests = self.args
        context = multiprocessing.get_context("spawn")
        try:
            for number, share in enumerate(self.shares):
                ours, theirs = context.Pipe()
                worker = context.Process(target=load_process, args=(address, share, sum(self.shares[:number]), requests, K, theirs, self.secure),
                                         daemon=True)  # fmt: skip
                worker.start()
                theirs.close()  # the child's end: a child that dies then reads as end of file here
                self.pipes.append(ours)
                self.workers.append(worker)
            for pipe, worker in zip(self.pipes, self.workers, strict=True):
                self._receive(pipe, worker, 120)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _receive(self, pipe, worker, timeout: float):
        if not pipe.poll(timeout):
            raise RuntimeError(f"a load-generator process did not answer within {timeout:g} s (exit code {worker.exitcode})")
        message = pipe.recv()
        if isinstance(message, str) and message != "ready":
            raise RuntimeError(message)
        return message

    @property
    def processes(self) -> list[psutil.Process]:
        return [psutil.Process(worker.pid) for worker in self.workers]

    def go(self, start: float, stop: float) -> None:
        for pipe in self.pipes:
            pipe.send((start, stop))

    def results(self) -> tuple[np.ndarray, int]:
        """The latencies (ms) of the requests answered within the span, and the errors."""
        reports = [self._receive(pipe, worker, 90) for pipe, worker in zip(self.pipes, self.workers, strict=True)]
        return np.concatenate([latencies for latencies, _ in reports]), sum(errors for _, errors in reports)

    def __exit__(self, *_) -> None:
        for pipe in self.pipes:  # a worker still waiting for its span then reads end of file and ends
            pipe.close()
        for worker in self.workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()


class CppLoad:
    """The compiled load generator (``benchmarks/loadgen.cc``, gRPC's C++ client): the same
    closed-loop clients, each on a connection of its own, driven by one thread through one
    completion queue.
    A context manager: entered, its clients are connected and warmed up, and each client's last
    warm-up answer has been checked."""

    def __init__(self, address: str, clients: int, requests: list[bytes], processes: int = 1):
        self.address, self.clients, self.requests = address, clients, requests
        self.shares = [clients]
        self.work = tempfile.mkdtemp(prefix="tfhash-loadgen-")
        self.process = None

    def __enter__(self) -> CppLoad:
        import subprocess

        try:
            with open(os.path.join(self.work, "requests"), "wb") as out:
                for request in self.requests:
                    out.write(len(request).to_bytes(4, "little") + request)
            with open(os.path.join(self.work, "stderr"), "w") as log:  # a file: gRPC's own logging can never fill a pipe and stall it
                self.process = subprocess.Popen([loadgen_binary(), self.address, SEARCH_METHOD, str(self.clients), os.path.join(self.work, "requests"),
                                                 os.path.join(self.work, "results")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                stderr=log, text=True)  # fmt: skip
            answers = []
            while (line := self.process.stdout.readline()).startswith("answer "):
                answers.append(bytes.fromhex(line[len("answer "):].strip()))
            if line.strip() != "ready" or len(answers) != self.clients:
                raise RuntimeError(f"the C++ load generator failed to start (exit code {self.process.wait(30)}): {self._log()}")
            for answer in answers:
                check_answer(answer, self.address, K)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _log(self) -> str:
        with open(os.path.join(self.work, "stderr")) as log:
            return log.read().strip()

    @property
    def processes(self) -> list[psutil.Process]:
        return [psutil.Process(self.process.pid)]

    def go(self, start: float, stop: float) -> None:
        self.process.stdin.write(f"{start!r} {stop!r}\n")
        self.process.stdin.flush()

    def results(self) -> tuple[np.ndarray, int]:
        code = self.process.wait(120)
        if code != 0:
            raise RuntimeError(f"the C++ load generator failed (exit code {code}): {self._log()}")
        with open(os.path.join(self.work, "results")) as lines:
            errors = int(next(lines).split()[1])
            latencies = np.array([float(line) for line in lines])
        return latencies, errors

    def __exit__(self, *_) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        shutil.rmtree(self.work, ignore_errors=True)


LOAD_GENERATORS = {"python": PythonLoad, "cpp": CppLoad}


def loadgen_binary() -> str:
    """The compiled load generator (``--load-generators cpp``; :func:`benchmarks.native.build`)."""
    from benchmarks import native

    return native.build(os.path.join(native.HERE, "loadgen.cc"))


def run_level(address: str, clients: int, seconds: float, requests: list[bytes], server=None, processes: int = 2, generator: str = "python",
              secure: dict | None = None) -> dict:  # fmt: skip
    """``clients`` closed-loop clients of the ``generator`` (``python``: :class:`PythonLoad` over
    ``processes`` processes; ``cpp``: :class:`CppLoad`), sending requests back to back for
    ``seconds``; latencies in ms. With ``server`` (as :func:`family` takes it), also the CPU seconds per
    request, from the OS, of the server (its processes and their children) and of the load generator's
    processes, over the span. ``secure``: TLS and the token (Python clients only)."""
    if secure is not None and generator != "python":
        raise ValueError("the compiled load generator speaks plaintext only: run --access tls with --load-generators python")
    with LOAD_GENERATORS[generator](address, clients, requests, processes, *([secure] if secure else [])) as load:
        start = time.time() + 0.5
        load.go(start, start + seconds)
        sides = server or [], load.processes  # the server's CPU and the load generator's
        time.sleep(max(start - time.time(), 0.0))
        before = [cpu_seconds(side) for side in sides]
        time.sleep(max(start + seconds / 2 - time.time(), 0.0))
        spread = connections_per_process(server, int(address.rsplit(":", 1)[1])) if server else ""
        time.sleep(max(start + seconds - time.time(), 0.0))
        server_cpu, client_cpu = (cpu_seconds(side) - used for side, used in zip(sides, before, strict=True))
        flat, errors = load.results()
    if flat.size == 0:
        raise RuntimeError(f"no request to {address} was answered within the {seconds:g} s span ({errors} errors): is the service still up?")
    row = {"clients": clients, "load_generator": generator, "load_processes": len(load.shares), "requests": int(flat.size), "errors": int(errors),
           "seconds": round(seconds, 2), "qps": round(flat.size / seconds, 1), "p50_ms": round(float(np.percentile(flat, 50)), 2),
           "p99_ms": round(float(np.percentile(flat, 99)), 2)}  # fmt: skip
    if server is not None:
        row.update({"connections": spread, "server_cpu_ms_per_request": round(server_cpu * 1000 / max(flat.size, 1), 3),
                    "client_cpu_ms_per_request": round(client_cpu * 1000 / max(flat.size, 1), 3)})  # fmt: skip
    return row


def connections_per_process(server, port: int) -> str:
    """How the clients' connections to ``port`` are spread over the service's processes (the kernel
    hands each new connection to one of the processes sharing the port), e.g. "20/12", busiest
    first; read from the OS halfway through the span."""
    counts = []
    for process in family(server):
        try:
            found = sum(1 for c in process.net_connections("tcp") if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port)
        except psutil.Error:
            continue
        if found:
            counts.append(found)
    return "/".join(str(count) for count in sorted(counts, reverse=True))


def cpu_seconds(processes) -> float:
    """User + system CPU seconds of ``processes`` (as :func:`family` takes them) and their
    children, from the OS."""
    return sum(sum(p.cpu_times()[:2]) for p in family(processes))


def summarise_runs(runs: list[dict]) -> dict:
    """Median QPS and latencies over repeated runs of one row, with the QPS and p99 range."""
    def median(key):
        return round(float(np.median([r[key] for r in runs])), 2)

    summary = {"clients": runs[0]["clients"], "load_generator": runs[0]["load_generator"], "load_processes": runs[0]["load_processes"], "repeats": len(runs), "requests": sum(r["requests"] for r in runs),
               "errors": sum(r["errors"] for r in runs), "qps": median("qps"), "qps_min": min(r["qps"] for r in runs),
               "qps_max": max(r["qps"] for r in runs), "p50_ms": median("p50_ms"), "p99_ms": median("p99_ms"),
               "p99_ms_max": max(r["p99_ms"] for r in runs)}  # fmt: skip
    if "connections" in runs[0]:
        summary["connections"] = " ".join(r["connections"] for r in runs)
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
    parser.add_argument("--search-threads", type=int, default=1, help="threads per index search in the server")
    parser.add_argument("--load-generators", nargs="+", default=["python"], choices=sorted(LOAD_GENERATORS),
                        help="python: asyncio gRPC clients over --load-processes processes; cpp: benchmarks/loadgen.cc, gRPC's C++ "
                             "client, every client driven by one thread (needs g++ and libgrpc++-dev); several: each a row, "
                             "their runs taking turns")
    parser.add_argument("--load-processes", type=int, default=2, help="Python load-generator processes the clients are spread over")
    parser.add_argument("--processes", nargs="+", type=int, default=[1, 2], help="the service's serving processes (each value a run)")
    parser.add_argument("--tf-threads", type=int, default=0, help="TensorFlow threads per serving process (0: its default)")
    parser.add_argument("--event-loops", nargs="+", default=["auto"], choices=EVENT_LOOPS,
                        help="this checkout's service with each of these --event-loop values (front aio+<loop>)")
    parser.add_argument("--baseline", default=None, help="a checkout of an earlier commit, with its .venv, whose service runs beside this one's")
    parser.add_argument("--baseline-front", default="compiled", help="the baseline service's --front")
    parser.add_argument("--access", nargs="+", default=["plain"], choices=["plain", "tls"],
                        help="plain: loopback without credentials; tls: TLS with a token (certificates made for the run); each a service")
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
    requests = {  # serialized once: the load generator sends bytes
        "codes": [search_request(codes=code[None], k=K).SerializeToString() for code in query_pool[:2000]],
        "features": [search_request(features=vector[None], k=K).SerializeToString() for vector in feature_pool[:2000]],
    }
    fronts = [(f"aio+{loop}", (None, loop)) for loop in args.event_loops]
    if args.baseline:
        fronts.append((f"{args.baseline_front}@{checkout_commit(args.baseline)}", ((os.path.abspath(args.baseline), args.baseline_front), "auto")))
    rows, memory_rows = [], []
    with tempfile.TemporaryDirectory() as work:
        model_base, index_base = os.path.join(work, "models"), os.path.join(work, "indexes")
        export_model(os.path.join(model_base, "1"), args.bits, args.seed)
        pki = make_certificates(os.path.join(work, "pki"))
        with open(pki["token"]) as file:
            accesses = {"plain": ([], None), "tls": (["--tls-cert", pki["server"], "--tls-key", pki["server_key"], "--token-file", pki["token"]],
                                                     {"ca": pki["ca"], "token": file.read().strip()})}  # fmt: skip
        fingerprint = signature_fingerprint(os.path.join(model_base, "1"))
        for kind in args.kinds:
            build_start = time.perf_counter()
            index = index_factory(args.bits, kind)
            index.add(database)
            index.save(os.path.join(index_base, "1", kind), model_version="1", signature_fingerprint=fingerprint)
            build_s = time.perf_counter() - build_start
            expected = index.search(query_pool[:CHECKED], K)
            del index
            # every service of this index at once, and each repeat runs them in turn: a slow spell of
            # this shared machine then falls on all of them, not on one
            services = []
            try:
                for number, ((front, (baseline, loop)), processes, access) in enumerate(itertools.product(fronts, args.processes, args.access)):
                    # a copy of the index each: a service's mapped codes are then shared by its own processes only
                    own_index = os.path.join(work, f"indexes-{number}")
                    shutil.copytree(os.path.join(index_base, "1", kind), os.path.join(own_index, "1", kind))
                    access_args, secure = accesses[access]
                    started, address = start_service(model_base, own_index, kind, args.search_threads, processes, args.tf_threads, baseline, loop,
                                                      access_args)  # fmt: skip
                    services.append(({"front": front, "processes": processes, "access": access}, started, address, psutil.Process(started.pid), secure))
                    check_answers(address, requests["codes"][:CHECKED], expected, secure)
                for mode, clients in itertools.product(args.modes, args.clients):
                    turns = list(itertools.product(services, args.load_generators))
                    runs = [[] for _ in turns]
                    for _ in range(args.repeats):
                        for runs_of, ((_, _, address, server, secure), generator) in zip(runs, turns, strict=True):
                            runs_of.append(run_level(address, clients, args.seconds, requests[mode], server, args.load_processes, generator, secure))
                    for runs_of, ((described, _, _, _, _), _) in zip(runs, turns, strict=True):
                        row = {"index": kind, "n": args.size, "bits": args.bits, **described, "mode": mode, "k": K,
                               **summarise_runs(runs_of), "index_build_s": round(build_s, 1), "seed": args.seed}  # fmt: skip
                        print(row, flush=True)
                        rows.append(row)
                for described, _, _, server, _ in services:
                    memory = {"index": kind, **described, **server_memory(server)}  # after the load
                    print(memory, flush=True)
                    memory_rows.append(memory)
            finally:
                for _, started, _, _, _ in services:
                    started.terminate()
                    started.wait(60)
    columns = ["index", "n", "bits", "front", "processes", "access", "mode", "clients", "load_generator", "load_processes", "repeats", "requests", "errors", "qps", "qps_min", "qps_max",
               "p50_ms", "p99_ms", "p99_ms_max", "connections", "server_cpu_ms_per_request", "client_cpu_ms_per_request", "seed"]  # fmt: skip
    command = "python -m benchmarks.serving " + " ".join(sys.argv[1:])
    markdown = (
        "# Search service load benchmark\n\n"
        f"Command: `{command.strip()}`. One query per request, k = {K}, over gRPC on loopback; the search "
        f"service (`tfhash serve search`, front `aio+<loop>`: gRPC's asyncio server on that `--event-loop`, concurrent searches of one kind joined, one joined "
        f"call in flight per process; {args.search_threads} thread(s) per index search, in-process encoder, TensorFlow threads "
        f"{args.tf_threads or 'by default'}) runs as its own process, or as `--processes` serving processes on one port "
        "under a supervising parent (the `processes` column)"
        + (f"; front `{fronts[-1][0]}`: the service of that commit (checked out with its own environment) with `--front "
           f"{args.baseline_front}`, its other options at their defaults" if args.baseline else "")
        + f"; before any load, each service answered the first {CHECKED} code requests as the library's search of its index does"
        + ("; the clients are asyncio gRPC clients spread over the load-generator processes, one channel each, "
           if args.load_generators == ["python"] else
           "; the clients (`load_generator` python) are asyncio gRPC clients spread over the load-generator processes, or "
           "(cpp) are driven by one thread of benchmarks/loadgen.cc, gRPC's C++ asynchronous client; one channel each; the "
           "generators' runs take turns, ")
        + "sending requests serialized in advance back to back "
        + ("(`access` tls: TLS with a bearer token on every call, the certificates made for the run; plain: loopback "
           "plaintext) " if "tls" in args.access else "")
        + f"for {args.seconds:g} s per run after a warm-up, on the same {os.cpu_count()} cores as the server; each row "
        f"is run {args.repeats} times (qps, p50 and p99 are medians; min / max give the spread, which is wide on "
        "this shared virtual machine), and every service of an index runs at once, its runs taking turns with the other "
        "services' (an idle service only looks for a new version every 2 s), so that slow spells of the machine fall on all of them. "
        "`codes`: the request carries a packed code (search only); `features`: a 32-d vector that the "
        "service encodes with the model (an MLP) before it searches. Database: random-but-clustered codes "
        "as in the index benchmark. CPU per request is from the OS (user + system seconds over the measured "
        "span divided by the requests answered): the server's process and children, and the load-generator processes. "
        "`connections`: the clients' connections held by each serving process halfway through each run (busiest first; "
        "the kernel hands each new connection to one of the processes sharing the port).\n\n" + markdown_table(rows, columns) + "\n"
        "\n## Memory of the service's processes after the load (MB)\n\n"
        "`rss`: resident sets summed (a page that processes share counted in each), `pss`: proportional sets summed "
        "(shared pages split between their sharers, so counted once), `uss`: pages only one process holds; `codes_*`: "
        "the same for the index's codes, mapped from `codes.npy` (flat indexes and BMIH; other types copy their data "
        "into each process); `mapped_*`: every mapped array of the index (BMIH's tables too). Each service maps its own copy of the index, so `codes_*` are its own; library pages "
        "(TensorFlow's, gRPC's) are shared with every process that maps them, the other services running at the same "
        "time included, which lowers `pss` and `uss` when several services run.\n\n" + markdown_table(memory_rows, list(dict.fromkeys(key for row in memory_rows for key in row))) + "\n"
    )
    write_results(args.name, {"command": command, "rows": rows, "memory": memory_rows, "seed": args.seed}, markdown)


if __name__ == "__main__":
    main()
