"""A measurement of a design option for the search service's front, not a service: the library's
``HashSearchServicer`` behind gRPC's asyncio server, searches run on the event loop (no hand-over
to a worker thread), one event loop per process, ``processes`` processes on one port
(``SO_REUSEPORT``, the port reserved by the parent as ``tfhash serve search --processes`` does).
``python -m benchmarks.serving --fronts asyncio asyncio-batched`` runs it in place of ``tfhash
serve search``.

Two ways to run a search on the loop:

* ``inline``: each request's ``Search`` as it comes (the servicer's own code path).
* ``batched``: a request's queries wait for the end of the loop's current turn; every request of
  the same form (codes or features, width, k, radius, pinned version) that arrived in that turn is
  then encoded and searched in one call of the library's searcher (up to its batch limit), and
  each gets its own rows back. The loop itself does what the threaded service's batchers do with
  threads and locks.

What it leaves out, and a service front would need: the request-bytes checks and the stop gate of
:mod:`tfhash.serving.grpc_server`, health, GetStatus across processes, REST, hot swap (the pair
loaded at start is served), concurrency limits, a drain on SIGTERM (it exits at once), and a bound
on how long one request may hold the loop (a large batch or k delays every other request of its
process).

    python -m benchmarks.asyncio_front <model_base_dir> <index_base_dir> <kind> [--processes N] [--port P] [--batched]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import threading

import numpy as np

READY = "asyncio search front on "


class LoopBatcher:
    """Joins the calls ``call(key, rows) -> list (one item per row)`` made in one turn of the event
    loop: :meth:`submit` queues its rows and waits; at the end of the turn each key's rows go in
    calls of at most ``max_rows`` rows, and every caller gets its own slice (or the call's error)."""

    def __init__(self, call, max_rows: int):
        self.call, self.max_rows, self.queued, self.flushing = call, int(max_rows), {}, False

    async def submit(self, key, rows):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.queued.setdefault(key, []).append((rows, future))
        if not self.flushing:
            self.flushing = True
            loop.call_soon(self.flush)  # after the handlers that are ready in this turn
        return await future

    def flush(self) -> None:
        queued, self.queued, self.flushing = self.queued, {}, False
        for key, waiting in queued.items():
            while waiting:
                batch, size = [], 0
                while waiting and (not batch or size + len(waiting[0][0]) <= self.max_rows):
                    batch.append(waiting.pop(0))
                    size += len(batch[-1][0])
                try:
                    out = self.call(key, np.concatenate([rows for rows, _ in batch]))
                except Exception as err:  # noqa: BLE001 - each caller gets the error
                    for _, future in batch:
                        future.set_exception(err)
                    continue
                start = 0
                for rows, future in batch:
                    future.set_result(out[start:start + len(rows)])
                    start += len(rows)


def serve(model_base_dir: str, index_base_dir: str, kind: str, port: int, batched: bool = False) -> None:
    """One process: load the newest pair, serve Search on the event loop until SIGTERM."""
    import faiss
    import grpc
    from tfhash.serving import search_pb2_grpc
    from tfhash.serving.errors import ServingError
    from tfhash.serving.requests import Query, query_from_proto
    from tfhash.serving.search_service import (
        HashSearchServicer,
        in_process_searcher,
        response_proto,
    )

    from tfhash.hamming import set_threads

    faiss.omp_set_num_threads(1)
    set_threads(1)
    searcher = in_process_searcher(model_base_dir, index_base_dir, kind)
    if not searcher.refresh():
        raise SystemExit(f"no model version with its {kind} index under {model_base_dir} / {index_base_dir}")
    servicer = HashSearchServicer(searcher, searcher.status)

    def search_rows(key, rows):
        form, k, radius, version = key[:4]
        pair, results = searcher.search(Query(**{form: rows}, k=k, radius=radius, model_version=version))
        return [(pair, found) for found in results]

    batcher = LoopBatcher(search_rows, searcher.limits.max_batch)

    class Inline(search_pb2_grpc.HashSearchServicer):
        async def Search(self, request, context):  # noqa: N802 - the proto's method name
            try:
                return await self.answer(request, context)
            except ServingError as err:  # an aio context's abort must be awaited
                await context.abort(err.code, err.message)

        async def answer(self, request, context):
            return HashSearchServicer.Search.__wrapped__(servicer, request, context)  # the servicer's own, undecorated

    class Batched(Inline):
        async def answer(self, request, context):
            query = query_from_proto(request)
            form = "codes" if query.codes is not None else "features" if query.features is not None else None
            if form is None:  # examples: as they come
                return await super().answer(request, context)
            rows = getattr(query, form)
            found = await batcher.submit((form, query.k, query.radius, query.model_version, rows.dtype.str, rows.shape[1:]), rows)
            return response_proto(found[0][0], [neighbours for _, neighbours in found])

    async def main() -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
        search_pb2_grpc.add_HashSearchServicer_to_server(Batched() if batched else Inline(), server)
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print(f"{READY}127.0.0.1:{bound}", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop(0)

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_base_dir")
    parser.add_argument("index_base_dir")
    parser.add_argument("kind")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--batched", action="store_true", help="join the searches of one loop turn (module docstring)")
    args = parser.parse_args()
    if args.processes == 1:
        serve(args.model_base_dir, args.index_base_dir, args.kind, args.port, args.batched)
        return
    from tfhash.serving.processes import START_SECONDS, read_until, reserve_port

    held = reserve_port("127.0.0.1", args.port)
    port = held.getsockname()[1]
    children = [subprocess.Popen([sys.executable, "-m", "benchmarks.asyncio_front", args.model_base_dir, args.index_base_dir,
                                  args.kind, "--port", str(port), *(["--batched"] if args.batched else [])],
                                 stderr=subprocess.PIPE, text=True)  # fmt: skip
                for _ in range(args.processes)]
    signal.signal(signal.SIGTERM, lambda *_: [child.terminate() for child in children])
    for child in children:
        if not read_until(child, READY, START_SECONDS)[1]:
            raise SystemExit(f"a serving process exited with code {child.wait()} before it served")
        threading.Thread(target=child.stderr.read, daemon=True).start()  # drained from now on
    print(f"{READY}127.0.0.1:{port} ({args.processes} processes)", file=sys.stderr, flush=True)
    codes = [child.wait() for child in children]
    held.close()
    raise SystemExit(max(codes))


if __name__ == "__main__":
    main()
