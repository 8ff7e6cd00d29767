"""The search service: one front serving gRPC (``tfhash.serving.HashSearch``, see
``search.proto``, and the standard health service) and, optionally, REST/JSON
(:mod:`tfhash.serving.rest`) from one asyncio event loop, with a watcher that hot-swaps to newer
model/index pairs, request limits and graceful shutdown."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time

import grpc
from grpc_health.v1 import health_pb2
from tfhash.serving import search_pb2
from tfhash.serving.access import Access, ClientCredentials
from tfhash.serving.batching import Coalescer
from tfhash.serving.client import ModelClient
from tfhash.serving.encoders import InProcessEncoder, RemoteEncoder
from tfhash.serving.errors import (
    ServingError,
    deadline_exceeded,
    internal_error,
    invalid,
    unavailable,
)
from tfhash.serving.event_loop import new_event_loop
from tfhash.serving.grpc_server import LOOPBACK, SETTLE_SECONDS, add_port, grpc_address
from tfhash.serving.health import Health
from tfhash.serving.requests import (
    DEFAULT_LIMITS,
    Limits,
    Query,
    decode_whole,
    join_queries,
    query_from_proto,
)
from tfhash.serving.searcher import Neighbours, ServedPair, VersionedSearcher
from tfhash.serving.shared_status import SharedStatus, service_status

from tfhash.artifacts import join_labels, list_versions, model_version_dir

__all__ = ["SERVICE_NAME", "set_search_threads", "in_process_searcher", "remote_searcher", "SearchServer"]


logger = logging.getLogger(__name__)

SERVICE_NAME = "tfhash.serving.HashSearch"
HEALTH_NAME = "grpc.health.v1.Health"
#: Rows of one joined call (an exact scan of 64 queries costs little more than one of 1).
JOIN_ROWS = 64


def response_proto(pair: ServedPair, results: list[Neighbours]):
    response = search_pb2.SearchResponse(model_version=str(pair.version), index_kind=pair.index.format_tag, exact=pair.index.exact,
                                         refined=all(found.refined for found in results))  # fmt: skip
    for found in results:
        neighbours = response.results.add(ids=found.ids.tolist(), distances=found.distances.tolist())
        if found.items is not None:
            neighbours.paths.extend(item.path for item in found.items)
            neighbours.labels.extend(join_labels(item.labels) for item in found.items)
    return response


def set_search_threads(threads: int) -> None:
    """Threads of the index searches that this thread makes: FAISS's OpenMP threads (a setting of
    the calling thread) and the exact kernel's (a setting of the process)."""
    import faiss

    from tfhash.hamming import set_threads

    faiss.omp_set_num_threads(threads)
    set_threads(threads)


def _shared(err: BaseException) -> bool:
    """Errors of a joined call that every request of it gets (no pair, a store down, a version not served)."""
    return isinstance(err, ServingError) and err.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND)


def in_process_searcher(model_base_dir: str, index_base_dir: str, kind: str = "BFlat", limits: Limits = DEFAULT_LIMITS,
                        query_modality: str | None = None, items: dict | None = None):  # fmt: skip
    """Encode with the SavedModel versions under ``model_base_dir``, loaded in this process. For a
    cross-modal model, ``query_modality`` picks the queries' tower and ``kind`` names the index
    of the database modality (e.g. ``"BFlat-text"`` for image -> text). ``items``: the data's
    ``items.csv`` (:func:`tfhash.artifacts.read_items`) to name every answer."""

    def path(version: int) -> str:
        return model_version_dir(model_base_dir, version)

    return VersionedSearcher(index_base_dir, kind, lambda: list_versions(model_base_dir),
                             lambda v: InProcessEncoder(path(v), v, query_modality=query_modality), path, limits, items=items)  # fmt: skip


def remote_searcher(target: str, model_name: str, index_base_dir: str, kind: str = "BFlat", limits: Limits = DEFAULT_LIMITS,
                    model_base_dir: str | None = None, timeout: float = 10.0, query_modality: str | None = None,
                    items: dict | None = None, credentials: ClientCredentials | None = None):  # fmt: skip
    """Encode through TF Serving at ``target``; a version counts once TF Serving reports it
    AVAILABLE (keep the paired version loaded there: :mod:`tfhash.serving.deployment` pins the
    paired versions in ``models.config``). With ``model_base_dir`` (the folder TF Serving watches,
    if visible from here) the SavedModel fingerprint is checked against the index manifest too.
    ``credentials``: TLS and the token of a model server that asks for them."""
    credentials = credentials or ClientCredentials()
    channel = credentials.channel(target, [("grpc.max_receive_message_length", 64 << 20)])
    status_client = ModelClient(target, model_name, timeout=timeout, channel=channel, credentials=credentials)

    def available() -> list[int] | None:
        try:
            return [version for version, state, _ in status_client.status() if state == "AVAILABLE"]
        except ServingError as err:
            if err.code == grpc.StatusCode.NOT_FOUND:  # the model is not (or no longer) configured there
                return []
            logger.warning("TF Serving at %s cannot be asked: %s", target, err.message)
            return None

    def model_dir(version: int) -> str | None:
        return model_version_dir(model_base_dir, version) if model_base_dir else None

    return VersionedSearcher(index_base_dir, kind, available,
                             lambda v: RemoteEncoder(target, model_name, v, timeout, channel, query_modality, credentials),
                             model_dir, limits, items=items)  # fmt: skip


class SearchServer:
    """The gRPC (and optionally REST) front of a :class:`VersionedSearcher`, with the swap watcher
    (below). Constructing it binds and starts nothing; :meth:`start` binds (port 0: any free port;
    OSError when the address cannot be bound) and serves from an event loop thread of its own.

        searcher = in_process_searcher("runs/serving/m", "runs/indexes/m", "BFlat")
        server = SearchServer(searcher, port=8600, rest_port=8601).start()
        ...
        server.stop()

    A request's bytes are parsed once, on the loop, into a :class:`~tfhash.serving.requests.Query`
    (bytes that are no message of the method's type: INVALID_ARGUMENT) and checked against the limits;
    then both fronts hand it to one :class:`~tfhash.serving.batching.Coalescer`, which joins the
    searches of one kind that wait while a call runs into the next call (at most ``join_rows`` rows),
    made on its worker thread: one joined call in flight per process. More cores take more processes
    on one port (:mod:`tfhash.serving.processes`).

    Health: ``grpc.health.v1.Health/Check`` answers SERVING for "" and ``tfhash.serving.HashSearch``
    while a pair can answer (in every process of a multi-process service); NOT_SERVING before the
    first pair, whenever none can answer (the paired version withdrawn with no other pair, TF Serving
    unreachable) and from the start of a shutdown, which also ends every Watch stream. Deadlines: the
    caller's gRPC deadline bounds its wait and the encode call (remote TF Serving gets the time that
    is left). Errors: every client mistake is INVALID_ARGUMENT, NOT_FOUND (a pinned version not
    served) or RESOURCE_EXHAUSTED (a request over a size limit, too many concurrent RPCs); UNAVAILABLE
    while no pair is ready or while stopping; INTERNAL only for a server fault, which is logged.

    Stop (:meth:`SearchServer.stop`): NOT_SERVING at once; every RPC that reaches a handler from then
    on is refused UNAVAILABLE (retryable: never executed) except the health service's, REST answers
    503, the requests already inside finish for up to ``grace`` seconds, then the servers stop.

    Requests larger than ``max_message_bytes`` are refused with RESOURCE_EXHAUSTED, and RPCs
    beyond ``max_concurrent_rpcs`` the same way instead of queueing. ``rest_options`` go to
    :class:`tfhash.serving.rest.RestFront` (timeouts, limits). ``siblings``: this is one process of
    several on one port (:mod:`tfhash.serving.processes`): its status is published to them at
    every look, health, readiness and GetStatus report every process (ready only while all are),
    and a newer pair is served once every process holds it (all switch together). ``reuse_port``
    and ``rest_sockets`` join the ports the parent of those processes holds. ``search_threads``:
    the threads of each index search (FAISS's and the exact kernel's), set on the thread that
    makes the joined calls (FAISS's OpenMP setting holds for the thread that sets it only); None
    leaves them as they are. ``event_loop``: which loop serves (:func:`~tfhash.serving.event_loop.new_event_loop`).

    ``access``: TLS and the bearer token of both fronts (:class:`~tfhash.serving.access.Access`;
    the files are read here). A ``host`` other than loopback is refused without TLS and a token
    unless ``access.allow_insecure`` (ValueError, as for files that do not load).
    """

    def __init__(self, searcher: VersionedSearcher, host: str = LOOPBACK, port: int = 0, rest_port: int | None = None,
                 poll_seconds: float = 2.0, max_message_bytes: int = 8 << 20, max_concurrent_rpcs: int | None = 128,
                 rest_options: dict | None = None, siblings: SharedStatus | None = None, reuse_port: bool = False,
                 rest_sockets: list | None = None, join_rows: int = JOIN_ROWS, search_threads: int | None = None,
                 event_loop: str = "auto", access: Access | None = None):  # fmt: skip
        access = access or Access()
        access.check_bind(host)
        self.access = access.load()
        self.searcher, self.host, self.poll_seconds, self.siblings = searcher, host, float(poll_seconds), siblings
        self.port = int(port)  # the bound port once started
        # what start binds
        self._rest_port, self._rest_options, self._rest_sockets = rest_port, rest_options or {}, rest_sockets
        self._max_message_bytes, self._max_concurrent_rpcs, self._reuse_port = max_message_bytes, max_concurrent_rpcs, reuse_port
        self._event_loop = event_loop
        if siblings is not None:
            searcher.follow(siblings.agreed_version)
        self.health = Health(("", SERVICE_NAME))
        setup = None if search_threads is None else functools.partial(set_search_threads, search_threads)
        self.coalescer = Coalescer(self._answer_joined, join_queries, lambda q: q.join_key, lambda q: q.size,
                                   min(join_rows, searcher.limits.max_batch), _shared, "tfhash-search", setup)  # fmt: skip
        self._closing, self._inside = False, 0  # read and written on the loop only
        self._loop = self._loop_thread = None
        self.rest = None
        self._stop, self._serving = threading.Event(), False
        self._watcher = threading.Thread(target=self._watch, name="tfhash-search-watch", daemon=True)

    def _open(self) -> None:
        """Start the event loop's thread and bind the ports (BindError when one cannot be bound;
        then nothing is left running)."""
        self._loop = new_event_loop(self._event_loop)
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="tfhash-search-front", daemon=True)
        self._loop_thread.start()
        try:
            self._server, self.port = self._on_loop(self._bind(self.host, self.port, self._max_message_bytes,
                                                               self._max_concurrent_rpcs, self._reuse_port))  # fmt: skip
            if self._rest_port is not None or self._rest_sockets:
                from tfhash.serving.rest import RestFront

                self.rest = RestFront(self.search, self.host, self._rest_port or 0, max_body_bytes=self._max_message_bytes,
                                      sockets=self._rest_sockets, status=self.status, access=self.access, **self._rest_options)  # fmt: skip
        except BaseException:
            self._close_loop()
            raise

    def _on_loop(self, coroutine, timeout: float | None = 30.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def _close_loop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(10.0)
            if not self._loop_thread.is_alive():
                self._loop.close()
        self.coalescer.close()

    async def _bind(self, host, port, max_message_bytes, max_concurrent_rpcs, reuse_port):
        options = [("grpc.max_receive_message_length", int(max_message_bytes)), ("grpc.max_send_message_length", -1),
                   ("grpc.so_reuseport", int(reuse_port))]  # fmt: skip
        server = grpc.aio.server(options=options, maximum_concurrent_rpcs=max_concurrent_rpcs, interceptors=self.access.grpc_interceptors())
        unary = lambda behaviour, response: grpc.unary_unary_rpc_method_handler(behaviour, None, response.SerializeToString)  # noqa: E731
        server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler(SERVICE_NAME, {
                "Search": unary(self._search_rpc, search_pb2.SearchResponse),
                "GetStatus": unary(self._status_rpc, search_pb2.StatusResponse)}),
            grpc.method_handlers_generic_handler(HEALTH_NAME, {
                "Check": unary(self._check_rpc, health_pb2.HealthCheckResponse),
                "Watch": grpc.unary_stream_rpc_method_handler(self._watch_rpc, None, health_pb2.HealthCheckResponse.SerializeToString)}),
        ))  # fmt: skip
        return server, add_port(server, host, port, self.access.grpc_credentials)

    @property
    def address(self) -> str:
        return grpc_address(self.host, self.port)

    @property
    def rest_port(self) -> int | None:
        return None if self.rest is None else self.rest.port

    # --- requests --------------------------------------------------------------------------------

    def _answer_joined(self, query: Query, timeout: float | None) -> list[tuple[ServedPair, Neighbours]]:
        """On the coalescer's thread: one joined query's answers, a (pair, neighbours) per row."""
        pair, results = self.searcher.answer(query, timeout)
        return [(pair, found) for found in results]

    async def search(self, query: Query, timeout: float | None = None) -> tuple[ServedPair, list[Neighbours]]:
        """On the loop: the answer to a parsed query, through the coalescer; every front's path.

        Raises:
            ServingError: as :meth:`VersionedSearcher.search`; UNAVAILABLE while stopping;
                DEADLINE_EXCEEDED when ``timeout`` passed before the answer; INTERNAL (logged)
                for a server fault.
        """
        if self._closing:
            raise unavailable("the server is shutting down; retry on another replica")
        self._inside += 1
        try:
            self.searcher.check(query)
            found = await self.coalescer.submit(query, timeout)
        except ServingError:
            raise
        except TimeoutError as err:
            raise deadline_exceeded("the search did not finish before the deadline") from err
        except Exception as err:  # noqa: BLE001 - a server fault: logged, answered INTERNAL
            raise internal_error("search") from err
        finally:
            self._inside -= 1
        return found[0][0], [neighbours for _, neighbours in found]

    @staticmethod
    def _parsed(message_type, raw: bytes):
        """The request message of ``raw``; INVALID_ARGUMENT for bytes that are none (grpcio's own
        parsing would answer INTERNAL), bytes read only in part included."""
        try:
            return decode_whole(message_type.FromString, raw)
        except Exception as err:  # noqa: BLE001 - any decoding failure is the client's bytes
            raise invalid(f"the request bytes are not a valid {message_type.DESCRIPTOR.full_name} message") from err

    async def _search_rpc(self, raw: bytes, context):
        left = context.time_remaining()  # about 9e18 when the caller set no deadline
        try:
            query = query_from_proto(self._parsed(search_pb2.SearchRequest, raw))
            pair, results = await self.search(query, left if left is not None and left < threading.TIMEOUT_MAX else None)
        except ServingError as err:
            error = err
        else:
            return response_proto(pair, results)
        await context.abort(error.code, error.message)

    async def _status_rpc(self, raw: bytes, context):
        try:
            self._parsed(search_pb2.StatusRequest, raw)
            if self._closing:
                raise unavailable("the server is shutting down; retry on another replica")
            try:
                return search_pb2.StatusResponse(**self.status())
            except Exception as err:  # noqa: BLE001 - a server fault: logged, answered INTERNAL
                raise internal_error("GetStatus") from err
        except ServingError as err:
            error = err
        await context.abort(error.code, error.message)

    async def _check_rpc(self, raw: bytes, context):
        try:
            return health_pb2.HealthCheckResponse(status=self.health.status_of(self._parsed(health_pb2.HealthCheckRequest, raw).service))
        except ServingError as err:
            error = err
        await context.abort(error.code, error.message)

    async def _watch_rpc(self, raw: bytes, context):
        """The service's status now and at every change, until the service stops (then NOT_SERVING and the end)."""
        try:
            request = self._parsed(health_pb2.HealthCheckRequest, raw)
        except ServingError as err:
            await context.abort(err.code, err.message)
        loop, changes = asyncio.get_running_loop(), asyncio.Queue()

        def changed(response) -> None:  # on whichever thread set the status
            try:
                loop.call_soon_threadsafe(changes.put_nowait, response)
            except RuntimeError:  # the loop is closed: the stream is gone with it
                pass

        self.health.watch(request.service, changed)
        try:
            while (response := await changes.get()) is not None:
                yield response
        finally:
            self.health.forget(request.service, changed)

    # --- status and swaps ------------------------------------------------------------------------

    def status(self) -> dict:
        """The searcher's status, with every process's readiness and version (one process: this)."""
        own = self.searcher.status()
        service = service_status([own] if self.siblings is None else self.siblings.gather())
        return {**own, **service, "ready": own["ready"] and service["ready"]}

    def _refresh(self) -> None:
        try:
            self.searcher.refresh()
        except Exception:  # the watcher must survive anything a refresh meets
            logger.exception("looking for a newer model/index pair failed")
        self._publish()
        self.health.set_serving(self.status()["ready"])

    def _publish(self) -> None:
        """Tell the siblings what this process serves and holds (once it accepts requests), and
        switch the service to the newest version that every process holds."""
        if self.siblings is None or not self._serving:
            return
        try:
            self.siblings.publish(self.searcher.status(), self.searcher.held_versions())
            self.siblings.agree()
        except OSError:  # the slot goes stale (not ready) rather than the watcher dying
            logger.exception("publishing this process's status failed")

    def _heartbeat(self) -> None:
        """Publish every poll, apart from the looks (a look that loads a new pair may take longer
        than a status stays fresh, and the old pair still answers meanwhile), and follow the
        siblings' readiness in health."""
        while not self._stop.wait(self.poll_seconds):
            self._publish()
            self.health.set_serving(self.status()["ready"])  # the siblings' changes too

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self._refresh()

    def start(self) -> SearchServer:
        """Bind the ports, load the newest pair there is (the service starts NOT_SERVING if there
        is none yet and becomes ready when one appears), then serve.

        Raises:
            tfhash.serving.grpc_server.BindError: an address that cannot be bound (nothing is
                left running).
            RuntimeError: a server started before.
        """
        if self._loop is not None:
            raise RuntimeError("this search server was started before; make a new one")
        self._open()
        self._refresh()
        self._on_loop(self._server.start())
        if self.rest is not None:
            self._on_loop(self.rest.start())
        self._serving = True
        self._refresh()
        self._watcher.start()
        if self.siblings is not None:
            threading.Thread(target=self._heartbeat, name="tfhash-search-heartbeat", daemon=True).start()
        logger.info("listening on %s (ready: %s)", self.address, self.searcher.ready)
        return self

    def stop(self, grace: float = 5.0) -> None:
        """Report NOT_SERVING and end health streams, stop watching, refuse new requests at once
        (gRPC UNAVAILABLE, REST 503 or a refused connection) and let in-flight ones finish within
        ``grace`` seconds (both fronts drain at the same time); then stop the loop."""
        self._stop.set()
        self.health.shutdown()
        try:
            if self._loop is not None:
                self._on_loop(self._drain(float(grace)), timeout=grace + 30.0)
        finally:
            self._close_loop()

    async def _drain(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        self._closing = True
        if self.rest is not None:
            self.rest.begin_stop()
        while (self._inside or (self.rest is not None and self.rest.in_flight)) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        # calls gRPC has queued but not handed to a handler yet: let them reach the gate (UNAVAILABLE,
        # retryable) rather than be failed by the server's stop (CANCELLED)
        await asyncio.sleep(min(SETTLE_SECONDS, max(deadline - time.monotonic(), 0.0)))
        await self._server.stop(max(deadline - time.monotonic(), 0.0))
        if self.rest is not None:
            await self.rest.close()
