"""What the standard gRPC health service (``grpc.health.v1.Health``, answered by
:class:`tfhash.serving.search_service.SearchServer`) reports: a fixed set of service names that
are all SERVING or all NOT_SERVING together, and the Watch streams that follow them.

:meth:`Health.shutdown` ends the streams: it sends NOT_SERVING, then closes every open stream, so
a watching load balancer sees the shutdown at once and no stream holds the server's grace period
open.
"""

from __future__ import annotations

import threading

from grpc_health.v1 import health_pb2
from tfhash.serving.errors import not_found, quoted_value

__all__ = ["Health"]


SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class Health:
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

    def status_of(self, service: str):
        """The status of ``service`` (NOT_FOUND for one this server does not have)."""
        with self._lock:
            status = self._status.get(service)
        if status is None:
            raise not_found(f"unknown service {quoted_value(service)}; known: {sorted(self._status)}")
        return status

    def watch(self, service: str, callback) -> bool:
        """Send ``service``'s status to ``callback`` now and at every change, then ``None`` at the
        end; False (and ``None`` at once) when the stream ends now: shutting down, or a service
        this server will never have."""
        with self._lock:  # the first status before any later change reaches this stream
            status = self._status.get(service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            closed = self._closed or service not in self._watchers
            callback(health_pb2.HealthCheckResponse(status=status))
            if not closed:
                self._watchers[service].add(callback)
        if closed:
            callback(None)
        return not closed

    def forget(self, service: str, callback) -> None:
        """Stop sending ``service``'s changes to ``callback`` (its stream ended)."""
        with self._lock:
            self._watchers.get(service, set()).discard(callback)
