"""REST/JSON of the search service, on Tornado's HTTP server, served from the service's event loop
and answered through the same path as gRPC (:meth:`tfhash.serving.search_service.SearchServer.search`)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable

import tornado.httpserver
import tornado.netutil
import tornado.web
from tfhash.serving.access import ServerAccess
from tfhash.serving.errors import ServingError, internal_error, permission_denied
from tfhash.serving.grpc_server import BindError
from tfhash.serving.page import ItemImages, is_loopback_host, page_html
from tfhash.serving.requests import Query, json_object, query_from_json
from tfhash.serving.searcher import Neighbours, ServedPair

__all__ = ["PARSED_ON_THE_LOOP", "CHUNKED_DISCARD", "bind_sockets", "RestFront"]


logger = logging.getLogger(__name__)

#: Bodies up to this size are parsed on the event loop (well under a millisecond); larger ones on a thread.
PARSED_ON_THE_LOOP = 64 << 10

#: A chunked body over the limit is read on (dropped) up to this many times the limit and answered 413
#: when it ends, so that a client that reads the answer only after sending it all finds it.
CHUNKED_DISCARD = 4


def bind_sockets(host: str, port: int) -> list:
    """The listening sockets of ``host:port`` (0: any free port) for the HTTP server.

    Raises:
        BindError: naming the address.
    """
    try:
        return tornado.netutil.bind_sockets(port, address=host)
    except OSError as err:
        raise BindError(f"cannot bind {host}:{port} for REST: {err}") from err


def result_json(found: Neighbours) -> dict:
    """One query's neighbours: ids and distances, and each one's path and class names when the
    service knows its items."""
    result = {"ids": found.ids.tolist(), "distances": found.distances.tolist()}
    if found.items is not None:
        result["paths"] = [item.path for item in found.items]
        result["labels"] = [list(item.labels) for item in found.items]
    return result


def _error(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


#: ``charset`` parameter of a JSON Content-Type, for the charsets other than UTF-8 that are refused.
_CHARSET = re.compile(r""";\s*charset\s*=\s*"?([^";\s]*)"?""", re.IGNORECASE)


class _Handler(tornado.web.RequestHandler):
    front: RestFront

    def initialize(self, front: RestFront) -> None:
        self.front = front

    def prepare(self) -> None:
        """What every route refuses: a missing or wrong token (401, before anything else), a long
        target (414), large headers (431), query parameters (400)."""
        request, front = self.request, self.front
        refusal = front.access.rest_refusal(request.path, request.headers.get("Authorization"))
        if refusal is not None:
            self.set_header("WWW-Authenticate", 'Bearer realm="tfhash"')
            self.answer(401, _error("UNAUTHENTICATED", refusal))
            return
        header_bytes = len(request.method) + len(request.uri) + len(request.version) + sum(
            len(name) + len(value) + 4 for name, value in request.headers.get_all())  # fmt: skip
        if len(request.uri) > front.max_uri_bytes:
            self.answer(414, _error("INVALID_ARGUMENT", f"the request target is {len(request.uri)} bytes, over the limit of {front.max_uri_bytes}"))
        elif header_bytes > front.max_header_bytes:
            self.answer(431, _error("INVALID_ARGUMENT", f"the request line and headers are {header_bytes} bytes, over the limit of {front.max_header_bytes}"))
        elif request.query_arguments:
            names = sorted(request.query_arguments)
            self.answer(400, _error("INVALID_ARGUMENT", f"unknown query parameter {names[0][:60]!r}: {request.path} takes none "
                                                        "(model_version, k and radius go in the JSON body of POST /v1/search)"))  # fmt: skip

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")

    def answer(self, status: int, payload: dict):
        self.set_status(status)
        return self.finish(json.dumps(payload))

    def write_error(self, status_code: int, **kwargs) -> None:
        """Tornado's own refusals (405, a route that does not exist) in the service's error form."""
        code = {404: "NOT_FOUND", 405: "INVALID_ARGUMENT"}.get(status_code, "INTERNAL" if status_code >= 500 else "INVALID_ARGUMENT")
        self.finish(json.dumps(_error(code, f"{self.request.method} {self.request.path}: {self._reason}")))


class _NotFound(_Handler):
    def prepare(self) -> None:
        super().prepare()
        if not self._finished:
            raise tornado.web.HTTPError(404, reason="no such resource")


class _Get(_Handler):
    def get(self) -> None:
        path = self.request.path
        if path == "/healthz":
            self.answer(200, {"status": "alive"})
        elif path == "/readyz":
            ready = self.front.status()["ready"] and not self.front.stopping
            self.answer(200 if ready else 503, {"ready": ready})
        else:
            self.answer(200, self.front.status())


@tornado.web.stream_request_body
class _Search(_Handler):
    def initialize(self, front: RestFront, parse: Callable[[bytes], Query] | None = None) -> None:
        super().initialize(front)
        self.parse = parse  # the body -> its query (None: POST /v1/search's JSON)

    def prepare(self) -> None:
        self._chunks: list[bytes] = []
        self._received = 0  # the body's bytes so far
        self._reserved = 0  # bytes reserved for this request's body
        super().prepare()
        if self.parse is not None and not self._finished:
            _refuse_foreign_host(self)
        if self.request.method != "POST" and not self._finished:
            return  # Tornado answers 405
        front, headers = self.front, self.request.headers
        content_type = headers.get("Content-Type", "")
        media = content_type.split(";")[0].strip().lower()
        charset = _CHARSET.search(content_type)
        charset = charset.group(1).lower() if charset else "utf-8"
        declared = headers.get("Content-Length", "")
        # ASCII digits only ("²".isdigit() is true); Tornado refuses malformed framing itself (400)
        declared = int(declared) if re.fullmatch(r"[0-9]{1,19}", declared) else None
        if self._finished:
            pass  # refused by _Handler.prepare
        elif front.stopping:
            self.answer(503, _error("UNAVAILABLE", "the service is shutting down"))
        elif declared is not None and declared > front.max_body_bytes:
            self.answer(413, _error("RESOURCE_EXHAUSTED", f"the body must be at most {front.max_body_bytes} bytes, the request declares {declared}"))
        elif media != "application/json":
            self.answer(415, _error("INVALID_ARGUMENT", f"POST {self.request.path} takes Content-Type application/json, got {media[:60] or 'none'!r}"))
        elif charset not in ("utf-8", "utf8"):
            self.answer(415, _error("INVALID_ARGUMENT", f"POST {self.request.path} takes JSON in UTF-8 (RFC 8259), the request declares charset {charset[:40]!r}"))
        else:  # reserve the body's bytes (a chunked body: the limit) before any is read
            reserve = declared if declared is not None else front.max_body_bytes
            if front.reserved + reserve > front.body_budget:
                self.answer(429, _error("RESOURCE_EXHAUSTED", "too many request bodies are being received or searched; retry later"))
            else:
                front.reserved += reserve
                self._reserved = reserve
                if declared is None:  # chunked: the body's length is known once it passes the limit (data_received)
                    self.request.connection.set_max_body_size(CHUNKED_DISCARD * front.max_body_bytes)
        if self._finished:  # answered from the headers; Tornado closes the connection once the answer is written
            self.request.connection.set_max_body_size(max(declared or 0, front.max_body_bytes))
            self.request.connection.set_body_timeout(1.0)

    def _release(self) -> None:
        self.front.reserved -= self._reserved
        self._reserved = 0

    def on_finish(self) -> None:
        self._release()

    def on_connection_close(self) -> None:
        self._release()
        super().on_connection_close()

    def data_received(self, chunk: bytes) -> None:
        if self._finished:
            return
        self._received += len(chunk)
        if self._received > self.front.max_body_bytes:  # a chunked body (a declared length over the limit was refused in prepare)
            # dropped and answered 413 once it ends: answering now would make Tornado close the
            # connection under a client still sending, which then reads a reset instead of the answer
            self._chunks = []
            self._release()
        else:
            self._chunks.append(chunk)

    async def post(self) -> None:
        if self._finished:  # answered from its headers
            return
        limit = self.front.max_body_bytes
        if self._received > limit:
            self.answer(413, _error("RESOURCE_EXHAUSTED", f"the body must be at most {limit} bytes; this chunked body is longer"))
            return
        front = self.front
        front.in_flight += 1
        try:
            status, payload = await front.answer(b"".join(self._chunks), self.parse)
        finally:
            front.in_flight -= 1
        await self.answer(status, payload)


def _refuse_foreign_host(handler: _Handler) -> None:
    """The page's routes of a loopback-bound service answer requests that name loopback in their
    ``Host`` (403 otherwise): a web page of another site cannot reach them through a name of its
    own that resolves to 127.0.0.1."""
    if handler.front.loopback and not is_loopback_host(handler.request.headers.get("Host", "")):
        err = permission_denied("this service binds loopback: its page answers requests for localhost only")
        handler.answer(err.http_status, _error(err.code.name, err.message))


class _Page(_Handler):
    """``GET /`` (the page), ``GET /v1/items/<id>`` (an item's file and classes) and
    ``GET /v1/items/<id>/image`` (its image file)."""

    def prepare(self) -> None:
        super().prepare()
        if not self._finished:
            _refuse_foreign_host(self)

    def get(self, item_id: str | None = None, image: str | None = None) -> None:
        images = self.front.images
        if item_id is None:
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.set_header("Content-Security-Policy", "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
                                                       "script-src 'self' 'unsafe-inline'; frame-ancestors 'none'")  # fmt: skip
            self.finish(page_html())
            return
        try:
            if image:
                data, kind = images.read(int(item_id))
                self.set_header("Content-Type", kind)
                self.set_header("Cache-Control", "private, max-age=60")
                self.finish(data)
            else:
                self.answer(200, images.describe(int(item_id)))
        except ServingError as err:
            self.answer(err.http_status, _error(err.code.name, err.message))


class RestFront:
    """The HTTP server of a search service: binds ``host:port`` now (port 0: any free port; an
    address that cannot be bound raises :class:`~tfhash.serving.grpc_server.BindError`), serves on the running event loop after
    :meth:`start`.

    * ``POST /v1/search`` with ``Content-Type: application/json`` and a JSON object holding exactly
      one of ``examples`` (base64 serialized tf.Examples), ``features`` (nested lists, batch first),
      ``codes`` (nested lists of +-1) or ``packed_codes`` (base64, one string per query), plus ``k``,
      optional ``radius`` and ``model_version`` (:mod:`tfhash.serving.requests`). Answers
      ``{"model_version", "index_kind", "exact", "results": [{"ids", "distances"}]}``; a service started
      with the data's ``items.csv`` adds ``"paths"`` and ``"labels"`` (a list of class names) to each result.
    * ``GET /v1/status``; ``GET /healthz`` (alive); ``GET /readyz`` (200 once a pair can answer, in
      every process of the service, else 503).

    Errors answer ``{"error": {"code": "INVALID_ARGUMENT", "message": ...}}`` with the HTTP status of
    :data:`tfhash.serving.errors.HTTP_STATUS`, and: 414 for a target over ``max_uri_bytes``, 431 for
    headers over ``max_header_bytes`` (beyond four times that, Tornado's parser closes the connection
    without a status), 400 for any query parameter (no route takes one: ``model_version`` belongs in
    the body, and a parameter silently ignored would let a client believe it pinned a version), 415 for
    a POST that is not ``application/json`` or declares a charset other than UTF-8 (JSON's, RFC 8259),
    413 for a declared body over ``max_body_bytes`` (answered from the
    headers, before any body byte is read, and the connection closed) and for a chunked body that
    passes that limit (the rest of it is read and dropped, and answered once it ends, up to
    :data:`CHUNKED_DISCARD` times the limit, so that a client that reads its answer only after
    sending finds it; beyond, Tornado answers 400 and closes the connection), 429 when the bodies of the requests accepted and not yet
    answered would exceed ``max_concurrent * max_body_bytes`` bytes (each reserves its declared
    length, a chunked one the limit), 503 while shutting down.

    Slow or broken clients: the event loop reads and writes every connection (an open socket holds no
    thread), the request line and headers must arrive within ``header_timeout`` seconds (also the
    keep-alive idle limit) and the body within ``body_timeout`` seconds, else the connection is
    closed; malformed HTTP (a TLS handshake, garbage) gets 400 and a closed connection from Tornado's
    parser. A search is bounded by ``search_timeout`` seconds.

    The search page (:mod:`tfhash.serving.page`): ``GET /`` serves it; ``GET /v1/items/<id>`` and
    ``GET /v1/items/<id>/image`` answer an item's classes and image file, and ``POST /v1/search-image``
    (``{"image": base64 of an image file, "k", "model_version"}``) searches with an image, as
    ``/v1/search`` answers; only with ``images`` (:class:`~tfhash.serving.page.ItemImages`), 404 without. When the
    service binds loopback, these routes answer only requests whose ``Host`` is loopback (403).

    ``search``: the service's path from a parsed query to its answer; ``status``: what
    ``/v1/status`` and ``/readyz`` report; ``sockets``: listening sockets to accept from instead of
    binding (a service's processes share the one their parent opened); ``access``: HTTPS with its
    SSL context, and its token, checked first on every route but :data:`~tfhash.serving.access.OPEN_REST_PATHS`
    (401 with ``WWW-Authenticate: Bearer``).
    """

    def __init__(self, search: Callable[[Query, float], Awaitable[tuple[ServedPair, list[Neighbours]]]], host: str, port: int,
                 status: Callable[[], dict], max_body_bytes: int = 8 << 20, max_concurrent: int = 64, header_timeout: float = 10.0,
                 body_timeout: float = 10.0, max_header_bytes: int = 64 << 10, search_timeout: float = 30.0,
                 max_uri_bytes: int = 8 << 10, sockets: list | None = None, images: ItemImages | None = None,
                 access: ServerAccess | None = None):  # fmt: skip
        self.search, self.status, self.images = search, status, images
        self.access = access or ServerAccess()
        self.max_body_bytes, self.max_concurrent = int(max_body_bytes), int(max_concurrent)
        self.max_header_bytes, self.max_uri_bytes = int(max_header_bytes), int(max_uri_bytes)
        self.search_timeout = float(search_timeout)
        # read and written on the event loop only: body bytes reserved by the POSTs accepted and
        # not finished, searches running, shutting down
        self.reserved, self.in_flight, self.stopping = 0, 0, False
        self.body_budget = self.max_concurrent * self.max_body_bytes
        self._sockets = sockets or bind_sockets(host, port)
        self.host, self.port = host, self._sockets[0].getsockname()[1]
        self.loopback = is_loopback_host(host)
        # Tornado reads headers up to 4x the limit, so that the handler can answer 431 (and 414)
        self._server_options = dict(max_header_size=4 * self.max_header_bytes, idle_connection_timeout=float(header_timeout),
                                    body_timeout=float(body_timeout), max_body_size=self.max_body_bytes,
                                    ssl_options=self.access.ssl_context)  # fmt: skip
        self._http: tornado.httpserver.HTTPServer | None = None

    def _application(self) -> tornado.web.Application:
        routes = [(path, _Get, {"front": self}) for path in ("/healthz", "/readyz", "/v1/status")]
        routes.append(("/v1/search", _Search, {"front": self}))
        if self.images is not None:  # the page's routes
            routes += [("/", _Page, {"front": self}), (r"/v1/items/(-?[0-9]{1,19})(/image)?", _Page, {"front": self}),
                       ("/v1/search-image", _Search, {"front": self, "parse": self.images.upload_query})]
        return tornado.web.Application(routes, default_handler_class=_NotFound, default_handler_args={"front": self},
                                       log_function=lambda handler: logger.debug("rest: %d %s", handler.get_status(), handler._request_summary()))  # fmt: skip

    async def start(self) -> None:
        """Accept on the running loop."""
        self._http = tornado.httpserver.HTTPServer(self._application(), **self._server_options)
        self._http.add_sockets(self._sockets)

    async def answer(self, raw: bytes, parse: Callable[[bytes], Query] | None = None) -> tuple[int, dict]:
        """One search body's answer: (HTTP status, JSON payload). ``parse``: the body -> its query
        (default: ``POST /v1/search``'s JSON). A body over :data:`PARSED_ON_THE_LOOP` bytes is
        parsed on a worker thread, so that it never holds up the event loop (and with it every
        other request of the process) for long."""
        parse = parse or (lambda body: query_from_json(json_object(body)))
        try:
            if len(raw) <= PARSED_ON_THE_LOOP:
                query = parse(raw)
            else:
                query = await asyncio.get_running_loop().run_in_executor(None, parse, raw)
            pair, results = await self.search(query, self.search_timeout)
        except ServingError as err:
            return err.http_status, _error(err.code.name, err.message)
        except Exception:  # noqa: BLE001 - a server fault: logged, answered 500
            err = internal_error("REST search")
            return err.http_status, _error(err.code.name, err.message)
        return 200, {
            "model_version": str(pair.version), "index_kind": pair.index.format_tag, "exact": pair.index.exact,
            "refined": all(r.refined for r in results), "results": [result_json(r) for r in results],
        }  # fmt: skip

    def begin_stop(self) -> None:
        """Stop accepting (new connections are refused), answer 503 to requests that still arrive on
        open connections; the searches running go on (:attr:`in_flight`)."""
        self.stopping = True
        if self._http is not None:
            self._http.stop()
        else:  # never started: only the bound sockets to release
            for sock in self._sockets:
                sock.close()

    async def close(self) -> None:
        """Close every connection (after :meth:`begin_stop` and the drain)."""
        if self._http is None:
            return
        try:
            await asyncio.wait_for(self._http.close_all_connections(), 2.0)
        except asyncio.TimeoutError:
            logger.warning("REST connections did not close within 2 s")
