"""Python client of the tfhash search service.

    with SearchClient("localhost:8600") as client:
        answer = client.search(examples=[record], k=10)
        answer.model_version, answer.ids[0], answer.distances[0]
        answer.paths[0], answer.labels[0]  # when the service was started with the data's items.csv

A query image of your own becomes a record with :func:`tfhash.data.user.image_query`.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tfhash.serving import search_pb2, search_pb2_grpc
from tfhash.serving.access import ClientCredentials
from tfhash.serving.channel import ChannelClient
from tfhash.serving.search_service import SERVICE_NAME

from tfhash.artifacts import split_labels

__all__ = ["SearchClient", "SearchAnswer", "search_request"]


@dataclass
class SearchAnswer:
    model_version: str
    index_kind: str
    exact: bool
    ids: list[np.ndarray]  # one int64 array per query, nearest first
    distances: list[np.ndarray]
    paths: list[list[str]]  # each neighbour's file (empty lists when the service has no items.csv)
    labels: list[list[list[str]]]  # each neighbour's class names
    refined: bool = False  # ordered by the second stage (the index's embeddings), not by distance alone


def search_request(examples=None, features=None, codes=None, k: int = 10, radius: int | None = None,
                   model_version: str = "", refine: bool = True) -> search_pb2.SearchRequest:  # fmt: skip
    """A ``SearchRequest`` from exactly one of serialized ``examples``, raw ``features`` (batch
    first) or ``codes`` (packed uint8 (n, K/8) or +-1 (n, K))."""
    if sum(x is not None for x in (examples, features, codes)) != 1:
        raise ValueError("pass exactly one of examples, features or codes")
    request = search_pb2.SearchRequest(k=k, model_version=str(model_version))
    if not refine:
        request.refine = False
    if radius is not None:
        request.radius = radius
    if examples is not None:
        request.examples.serialized.extend(list(examples))
    elif features is not None:
        array = np.asarray(features, dtype=np.float32)
        request.features.shape.extend(array.shape)
        request.features.values.extend(array.ravel().tolist())
    else:
        array = np.asarray(codes)
        if array.ndim != 2:
            raise ValueError(f"codes must be 2-D (queries x bits), got shape {array.shape}")
        if array.dtype == np.uint8:
            request.codes.bits = array.shape[1] * 8
            request.codes.packed = np.ascontiguousarray(array).tobytes()
        else:
            request.codes.bits = array.shape[1]
            request.codes.signs.values.extend(array.astype(np.int64).ravel().tolist())
    return request


class SearchClient(ChannelClient):
    """gRPC client of ``tfhash.serving.HashSearch``; errors raise
    :class:`~tfhash.serving.errors.ServingError`.

    ``own_connection``: open a connection of this client's own. By default gRPC lets the channels
    of one process to one address share a connection, and a service of several processes
    (``--processes``) spreads connections, not requests, over its processes.

    ``credentials``: for a service started with TLS or a token (docs/serving.md, "Beyond loopback")::

        SearchClient("search.example:8600", credentials=ClientCredentials(ca_file="ca.pem", token_file="token"))
    """

    def __init__(self, target: str, timeout: float = 10.0, channel: grpc.Channel | None = None, own_connection: bool = False,
                 credentials: ClientCredentials | None = None):  # fmt: skip
        super().__init__(target, timeout, channel, options=[("grpc.use_local_subchannel_pool", 1)] if own_connection else (),
                         credentials=credentials)  # fmt: skip
        self._stub = search_pb2_grpc.HashSearchStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def search(self, examples=None, features=None, codes=None, k: int = 10, radius: int | None = None,
               model_version: str = "", timeout: float | None = None, *, refine: bool = True) -> SearchAnswer:  # fmt: skip
        """The ``k`` nearest items of every query, nearest first.

        Args:
            examples: serialized ``tf.Example`` records, one per query, as the served model takes
                them (:func:`tfhash.data.user.image_query` makes one of a photo).
            features: raw feature vectors ``(n, d)``, batch first, for a model with a features
                signature.
            codes: codes already computed: packed ``uint8`` ``(n, K/8)`` or +-1 ``(n, K)``; searched
                as they are (pin ``model_version`` to be sure they came from the serving model).
            k: answers per query: 1 to the service's limit (1000 unless it was started with
                another) and at most the index's size; others are refused.
            radius: keep only the answers within this Hamming distance.
            model_version: the model version the answer must come from (empty: the one serving);
                a version the service does not serve is refused (NOT_FOUND).
            timeout: seconds for the call (default the client's).
            refine: (keyword only) order the Hamming candidates by the items' embeddings where the
                served index stores them (the answer's ``refined`` says whether it did); False:
                Hamming order.

        Pass exactly one of ``examples``, ``features`` and ``codes``.

        Returns:
            :class:`SearchAnswer`: the answering model version and index kind, whether the search
            was exact, and per query the ids, distances, and the item paths and classes when the
            service has its items.

        Raises:
            ValueError: not exactly one kind of query, or codes that are not 2-D.
            tfhash.serving.errors.ServingError: the service refused the request (its status and
                message) or could not be reached.
        """
        response = self._call(self._stub.Search, search_request(examples, features, codes, k, radius, model_version, refine), timeout)
        return SearchAnswer(response.model_version, response.index_kind, response.exact,
                            [np.asarray(r.ids, dtype=np.int64) for r in response.results],
                            [np.asarray(r.distances, dtype=np.float32) for r in response.results],
                            [list(r.paths) for r in response.results],
                            [[list(split_labels(names)) for names in r.labels] for r in response.results],
                            response.refined)  # fmt: skip

    def status(self, timeout: float | None = None) -> search_pb2.StatusResponse:
        """The service's state: the model version and index kinds it serves."""
        return self._call(self._stub.GetStatus, search_pb2.StatusRequest(), timeout)

    def health(self, service: str = SERVICE_NAME, timeout: float | None = None) -> str:
        """``SERVING`` or ``NOT_SERVING`` (gRPC health checking protocol)."""
        response = self._call(self._health.Check, health_pb2.HealthCheckRequest(service=service), timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
