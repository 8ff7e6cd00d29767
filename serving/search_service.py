"""The search service over gRPC (``tfhash.serving.HashSearch``, see ``search.proto``), with the
standard gRPC health service, an optional REST/JSON front, a watcher that hot-swaps to newer
model/index pairs, request limits and graceful shutdown.

    searcher = in_process_searcher("runs/serving/m", "runs/indexes/m", "BFlat")
    server = SearchServer(searcher, port=8600, rest_port=8601).start()
    ...
    server.stop()

Health: ``grpc.health.v1.Health/Check`` answers SERVING for "" and ``tfhash.serving.HashSearch``
while a pair can answer (in every process of a multi-process service); NOT_SERVING before the first pair, whenever none can answer (the paired
version withdrawn with no other pair, TF Serving unreachable) and from the start of a shutdown,
which also ends every Watch stream. Deadlines: the caller's gRPC deadline bounds the encode call
(remote TF Serving gets the time that is left; without a deadline, its client's default). Errors: every client mistake is INVALID_ARGUMENT,
NOT_FOUND (a pinned version not served) or RESOURCE_EXHAUSTED (a request over a size limit, too
many concurrent RPCs); UNAVAILABLE while no pair is ready or while stopping; INTERNAL only for a
server fault, which is logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2_grpc
from tfhash.serving import search_pb2, search_pb2_grpc
from tfhash.serving.client import ModelClient
from tfhash.serving.encoders import InProcessEncoder, RemoteEncoder
from tfhash.serving.errors import ServingError, answers_errors
from tfhash.serving.grpc_server import LOOPBACK, GrpcServer
from tfhash.serving.health import Health
from tfhash.serving.requests import DEFAULT_LIMITS, Limits, query_from_proto
from tfhash.serving.searcher import Neighbours, ServedPair, VersionedSearcher
from tfhash.serving.siblings import Siblings, service_status
from tfhash.serving.versions import list_versions

from tfhash.artifacts import join_labels, model_version_dir

logger = logging.getLogger(__name__)

SERVICE_NAME = "tfhash.serving.HashSearch"


def response_proto(pair: ServedPair, results: list[Neighbours]):
    response = search_pb2.SearchResponse(model_version=str(pair.version), index_kind=pair.index.format_tag, exact=pair.index.exact)
    for found in results:
        neighbours = response.results.add(ids=found.ids.tolist(), distances=found.distances.tolist())
        if found.items is not None:
            neighbours.paths.extend(item.path for item in found.items)
            neighbours.labels.extend(join_labels(item.labels) for item in found.items)
    return response


class HashSearchServicer(search_pb2_grpc.HashSearchServicer):
    def __init__(self, searcher: VersionedSearcher, status: Callable[[], dict]):
        self.searcher, self.status = searcher, status

    @answers_errors
    def Search(self, request, context):
        left = context.time_remaining()  # about 9e18 when the caller set no deadline
        timeout = left if left is not None and left < threading.TIMEOUT_MAX else None
        pair, results = self.searcher.search(query_from_proto(request), timeout)
        return response_proto(pair, results)

    @answers_errors
    def GetStatus(self, request, context):
        return search_pb2.StatusResponse(**self.status())


def in_process_searcher(model_base_dir: str, index_base_dir: str, kind: str = "BFlat", limits: Limits = DEFAULT_LIMITS,
                        encode_batch_size: int = 128, query_modality: str | None = None, items: dict | None = None,
                        search_batch_size: int = 1):  # fmt: skip
    """Encode with the SavedModel versions under ``model_base_dir``, loaded in this process;
    concurrent encode calls are batched up to ``encode_batch_size`` rows, concurrent searches up to
    ``search_batch_size`` queries (1: no batching). For a
    cross-modal model, ``query_modality`` picks the queries' tower and ``kind`` names the index
    of the database modality (e.g. ``"BFlat-text"`` for image -> text). ``items``: the data's
    ``items.csv`` (:func:`tfhash.artifacts.read_items`) to name every answer."""

    def path(version: int) -> str:
        return model_version_dir(model_base_dir, version)

    return VersionedSearcher(index_base_dir, kind, lambda: list_versions(model_base_dir),
                             lambda v: InProcessEncoder(path(v), v, max_batch_size=encode_batch_size, query_modality=query_modality),
                             path, limits, items=items, search_batch_size=search_batch_size)  # fmt: skip


def remote_searcher(target: str, model_name: str, index_base_dir: str, kind: str = "BFlat", limits: Limits = DEFAULT_LIMITS,
                    model_base_dir: str | None = None, timeout: float = 10.0, query_modality: str | None = None,
                    items: dict | None = None, search_batch_size: int = 1):  # fmt: skip
    """Encode through TF Serving at ``target``; a version counts once TF Serving reports it
    AVAILABLE (keep the paired version loaded there: :mod:`tfhash.serving.deployment` pins the
    paired versions in ``models.config``). With ``model_base_dir`` (the folder TF Serving watches,
    if visible from here) the SavedModel fingerprint is checked against the index manifest too."""
    channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)])
    status_client = ModelClient(target, model_name, timeout=timeout, channel=channel)

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

    return VersionedSearcher(index_base_dir, kind, available, lambda v: RemoteEncoder(target, model_name, v, timeout, channel, query_modality),
                             model_dir, limits, items=items, search_batch_size=search_batch_size)  # fmt: skip


class SearchServer:
    """gRPC (and optionally REST) front of a :class:`VersionedSearcher`, with the swap watcher.

    ``rest_options`` go to :class:`tfhash.serving.rest.RestFront` (timeouts, workers).
    ``siblings``: this is one process of several on one port (:mod:`tfhash.serving.processes`):
    its status is published to them at every look, health, readiness and GetStatus report
    every process (ready only while all are), and a newer pair is served once every process
    holds it (all switch together). ``reuse_port`` and ``rest_sockets`` join the ports
    the parent of those processes holds.
    """

    def __init__(self, searcher: VersionedSearcher, host: str = LOOPBACK, port: int = 0, rest_port: int | None = None,
                 poll_seconds: float = 2.0, max_workers: int = 8, max_message_bytes: int = 8 << 20,
                 max_concurrent_rpcs: int | None = 128, rest_options: dict | None = None, siblings: Siblings | None = None,
                 reuse_port: bool = False, rest_sockets: list | None = None):  # fmt: skip
        self.searcher, self.host, self.poll_seconds, self.siblings = searcher, host, float(poll_seconds), siblings
        if siblings is not None:
            searcher.follow(siblings.agreed_version)
        self._grpc = GrpcServer(host, port, max_workers, max_message_bytes, max_concurrent_rpcs, reuse_port)
        self.port = self._grpc.port
        search_pb2_grpc.add_HashSearchServicer_to_server(HashSearchServicer(searcher, self.status), self._grpc.server)
        self.health = Health(("", SERVICE_NAME))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._grpc.server)
        self.rest = None
        if rest_port is not None or rest_sockets:
            from tfhash.serving.rest import RestFront

            self.rest = RestFront(searcher, host, rest_port or 0, max_body_bytes=max_message_bytes, sockets=rest_sockets,
                                  status=self.status, **(rest_options or {}))  # fmt: skip
        self._stop, self._serving = threading.Event(), False
        self._watcher = threading.Thread(target=self._watch, name="tfhash-search-watch", daemon=True)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def rest_port(self) -> int | None:
        return None if self.rest is None else self.rest.port

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
        """Load the newest pair there is (the service starts NOT_SERVING if there is none yet and
        becomes ready when one appears), then serve."""
        self._refresh()
        self._grpc.start()
        if self.rest is not None:
            self.rest.start()
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
        ``grace`` seconds (both fronts drain at the same time)."""
        self._stop.set()
        self.health.shutdown()
        rest = None
        if self.rest is not None:
            rest = threading.Thread(target=self.rest.stop, args=(grace,), name="tfhash-rest-stop")
            rest.start()
        self._grpc.stop(grace)
        if rest is not None:
            rest.join()
