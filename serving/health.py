"""The standard gRPC health service (``grpc.health.v1.Health``) for a fixed set of service names
that are all SERVING or all NOT_SERVING together.

``Watch`` streams hold no thread (grpcio's non-blocking stream callback) and :meth:`Health.shutdown`
ends them: it sends NOT_SERVING, then closes every open stream, so a watching load balancer sees
the shutdown at once and no stream holds the server's grace period open.
"""

from __future__ import annotations

import threading

from grpc_health.v1 import health_pb2, health_pb2_grpc
from tfhash.serving.errors import answers_errors, not_found, shown

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class Health(health_pb2_grpc.HealthServicer):
    """Health of ``services`` (``""`` is the whole server); starts NOT_SERVING."""

    def __init__(self, services=("",)):
        self._lock = threading.Lock()
        self._status = {name: NOT_SERVING for name in services}
        self._watchers: dict[str, set] = {name: set() for name in services}
        self._closed = False

    def set_serving(self, serving: bool) -> None:
        """Report every service SERVING or NOT_SERVING (ignored after :meth:`shutdown`)."""
        with self._lock:
            self._set_locked(SERVING if serving and not self._closed else NOT_SERVING)

    def _set_locked(self, status) -> None:
        # watchers get updates under the lock, in the order of the changes (as grpc_health does)
        for name, old in self._status.items():
            if old != status:
                self._status[name] = status
                for callback in self._watchers[name]:
                    callback(health_pb2.HealthCheckResponse(status=status))

    def shutdown(self) -> None:
        """NOT_SERVING for good; every open Watch stream gets it and is then closed."""
        with self._lock:
            self._closed = True
            self._set_locked(NOT_SERVING)
            callbacks = [cb for watchers in self._watchers.values() for cb in watchers]
            for watchers in self._watchers.values():
                watchers.clear()
        for callback in callbacks:
            callback(None)  # ends the stream with OK

    @answers_errors
    def Check(self, request, context):
        with self._lock:
            status = self._status.get(request.service)
        if status is None:
            raise not_found(f"unknown service {shown(request.service)}; known: {sorted(self._status)}")
        return health_pb2.HealthCheckResponse(status=status)

    def Watch(self, request, context, send_response_callback=None):
        service = request.service
        with self._lock:  # the first status before any later change reaches this stream
            status = self._status.get(service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            closed = self._closed or service not in self._watchers
            send_response_callback(health_pb2.HealthCheckResponse(status=status))
            if not closed:
                self._watchers[service].add(send_response_callback)
        if closed:  # shutting down, or a service this server will never have
            send_response_callback(None)
            return
        if not context.add_callback(lambda: self._forget(service, send_response_callback)):
            self._forget(service, send_response_callback)  # the call ended already

    Watch.experimental_non_blocking = True

    def _forget(self, service: str, callback) -> None:
        with self._lock:
            self._watchers[service].discard(callback)
