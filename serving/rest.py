"""A small REST/JSON front of the search service (standard library HTTP server, one thread per
connection), answering from the same :class:`VersionedSearcher` as the gRPC service.

* ``POST /v1/search`` with a JSON body holding exactly one of ``examples`` (base64 serialized
  tf.Examples), ``features`` (nested lists, batch first), ``codes`` (nested lists of +-1) or
  ``packed_codes`` (base64, one string per query), plus ``k``, optional ``radius`` and
  ``model_version``. Answers ``{"model_version", "index_kind", "exact", "results": [{"ids",
  "distances"}]}``.
* ``GET /v1/status``; ``GET /healthz`` (alive); ``GET /readyz`` (200 once a pair is ready, else 503).

Errors answer ``{"error": {"code": "INVALID_ARGUMENT", "message": ...}}`` with the HTTP status of
:data:`tfhash.serving.errors.HTTP_STATUS`; a body over the size limit is 413.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from tfhash.serving.errors import ServingError, invalid
from tfhash.serving.searcher import Query, VersionedSearcher

logger = logging.getLogger(__name__)

QUERY_FIELDS = ("examples", "features", "codes", "packed_codes")


def _b64(values, field: str) -> list[bytes]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise invalid(f"{field} must be a list of base64 strings")
    try:
        return [base64.b64decode(v, validate=True) for v in values]
    except (binascii.Error, ValueError) as err:
        raise invalid(f"{field}: invalid base64 ({err})") from err


def _array(values, field: str, dtype) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError) as err:
        raise invalid(f"{field} must be a rectangular nested list of numbers ({err})") from err
    if array.ndim < 2:
        raise invalid(f"{field} must have a batch axis first (a list of queries)")
    return array


def query_from_json(body: dict) -> Query:
    given = [f for f in QUERY_FIELDS if f in body]
    if len(given) != 1:
        raise invalid(f"the body needs exactly one of {list(QUERY_FIELDS)}, got {given}")
    field = given[0]
    if field == "examples":
        return Query(examples=_b64(body[field], field))
    if field == "features":
        return Query(features=_array(body[field], field, np.float32))
    if field == "codes":
        return Query(codes=_array(body[field], field, np.float64))  # the searcher refuses values other than +-1
    rows = _b64(body[field], field)
    if len({len(r) for r in rows}) > 1:
        raise invalid("packed_codes must all have the same length")
    return Query(codes=np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), -1))


def _int_field(body: dict, name: str, default=None):
    value = body.get(name, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise invalid(f"{name} must be an integer, got {value!r}")
    return value


class RestFront:
    """HTTP server thread over ``searcher``; binds ``host:port`` (port 0: any free port)."""

    def __init__(self, searcher: VersionedSearcher, host: str, port: int, max_body_bytes: int = 8 << 20):
        front = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format, *args):  # noqa: A002 - the base class's signature
                logger.debug("rest: " + format, *args)

            def do_GET(self):
                front.handle_get(self)

            def do_POST(self):
                front.handle_post(self)

        self.searcher, self.max_body_bytes = searcher, int(max_body_bytes)
        self._http = ThreadingHTTPServer((host, port), Handler)
        self._http.daemon_threads = True
        self.host, self.port = host, self._http.server_address[1]
        self._thread = threading.Thread(target=self._http.serve_forever, name="tfhash-rest", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    @staticmethod
    def _send(handler, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _error(self, handler, err: ServingError) -> None:
        self._send(handler, err.http_status, {"error": {"code": err.code.name, "message": err.message}})

    def handle_get(self, handler) -> None:
        if handler.path == "/healthz":
            self._send(handler, 200, {"status": "alive"})
        elif handler.path == "/readyz":
            ready = self.searcher.active is not None
            self._send(handler, 200 if ready else 503, {"ready": ready})
        elif handler.path == "/v1/status":
            self._send(handler, 200, self.searcher.status())
        else:
            self._send(handler, 404, {"error": {"code": "NOT_FOUND", "message": f"no resource {handler.path}"}})

    def handle_post(self, handler) -> None:
        if handler.path != "/v1/search":
            self._send(handler, 404, {"error": {"code": "NOT_FOUND", "message": f"no resource {handler.path}"}})
            return
        try:
            length = int(handler.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0 or length > self.max_body_bytes:
            handler.close_connection = True
            self._send(handler, 413, {"error": {"code": "RESOURCE_EXHAUSTED",
                                                "message": f"the body must be 0..{self.max_body_bytes} bytes"}})  # fmt: skip
            return
        try:
            body = json.loads(handler.rfile.read(length) or b"null")
            if not isinstance(body, dict):
                raise invalid("the body must be a JSON object")
            pair, results = self.searcher.search(query_from_json(body), _int_field(body, "k", 10),
                                                 _int_field(body, "radius"), str(body.get("model_version", "")))  # fmt: skip
        except json.JSONDecodeError as err:
            self._error(handler, invalid(f"the body is not valid JSON ({err})"))
            return
        except ServingError as err:
            self._error(handler, err)
            return
        except Exception:  # a bug: answer 500 and keep serving
            logger.exception("REST search failed")
            self._send(handler, 500, {"error": {"code": "INTERNAL", "message": "internal error"}})
            return
        self._send(handler, 200, {
            "model_version": str(pair.version), "index_kind": pair.index.kind, "exact": pair.index.exact,
            "results": [{"ids": r.ids.tolist(), "distances": r.distances.tolist()} for r in results],
        })  # fmt: skip
