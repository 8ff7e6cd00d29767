"""The development model server's gRPC shell (thread pool, message-size and concurrency limits,
loopback bind by default, request bytes that do not decode answered INVALID_ARGUMENT, a drain on
stop) and the signal loop that every server's process runs (drains and exits). The search service
has its own front on gRPC's asyncio server (:mod:`tfhash.serving.search_service`), with the same
behaviour on stop.
"""

from __future__ import annotations

import faulthandler
import functools
import signal
import threading
import time
from concurrent import futures

import grpc
from tfhash.serving.access import ServerAccess
from tfhash.serving.requests import decode_whole

__all__ = ["LOOPBACK", "EXIT_SECONDS", "SETTLE_SECONDS", "grpc_address", "BindError", "add_port", "GrpcServer", "run_until_signal"]


LOOPBACK = "127.0.0.1"
#: Methods answered while stopping (a load balancer must see NOT_SERVING, not an error).
ALWAYS_ANSWERED = "/grpc.health.v1.Health/"
#: How long after its grace period a stopping service process may take to exit (:func:`run_until_signal`).
EXIT_SECONDS = 10.0
SETTLE_SECONDS = 0.2


class _Gate:
    """Counts the RPCs inside a handler; once closed, new ones are turned away."""

    def __init__(self):
        self._condition = threading.Condition()
        self._inside, self.closed = 0, False

    def enter(self) -> bool:
        with self._condition:
            if self.closed:
                return False
            self._inside += 1
            return True

    def leave(self) -> None:
        with self._condition:
            self._inside -= 1
            self._condition.notify_all()

    def close_and_wait(self, timeout: float) -> bool:
        """Close; True once no RPC is inside a handler, False if ``timeout`` passed first."""
        with self._condition:
            self.closed = True
            return self._condition.wait_for(lambda: self._inside == 0, timeout)


class _Handlers(grpc.ServerInterceptor):
    """Wraps every unary-request handler (all that tfhash, TF Serving's API and the health service
    define): the request bytes are decoded here instead of in grpcio, so that bytes that are no
    message of the method's type get INVALID_ARGUMENT (grpcio itself answers INTERNAL "Exception
    deserializing request!"), bytes the parser reads only in part included
    (:func:`tfhash.serving.requests.decode_whole`); and the handler passes the stop gate. With a
    token (:class:`~tfhash.serving.access.ServerAccess`), a call without it is refused
    UNAUTHENTICATED before its bytes are read."""

    def __init__(self, gate: _Gate, access: ServerAccess):
        self.gate, self.access = gate, access

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        decode, method, gate = handler.request_deserializer, handler_call_details.method, self.gate
        gated = not method.startswith(ALWAYS_ANSWERED)

        def parsed(raw, context):
            try:
                return decode_whole(decode, raw)
            except Exception:  # noqa: BLE001 - any decoding failure is the client's bytes
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request bytes are not a valid request message of {method}")

        def passed(behaviour, raw, context, *args, **kwargs):
            refusal = self.access.grpc_refusal(method, context.invocation_metadata())
            if refusal is not None:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, refusal)
            if gated and not gate.enter():
                context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down; retry on another replica")
            try:
                return behaviour(parsed(raw, context), context, *args, **kwargs)
            finally:
                if gated:
                    gate.leave()

        behaviour = handler.unary_stream if handler.response_streaming else handler.unary_unary
        wrapped = functools.wraps(behaviour)(functools.partial(passed, behaviour))
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(wrapped, None, handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(wrapped, None, handler.response_serializer)


def grpc_address(host: str, port: int) -> str:
    """``host:port`` as gRPC takes and prints it (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class BindError(OSError):
    """An address a server cannot bind (a port in use, a host not of this machine): raised by the
    servers' ``start`` (and the development model server's constructor), nothing left running."""


def add_port(server, host: str, port: int, credentials: grpc.ServerCredentials | None = None) -> int:
    """Add the port ``host:port`` (0: any free port) to gRPC ``server`` (sync or aio), TLS with
    ``credentials`` (:class:`tfhash.serving.access.ServerAccess`), else plaintext; returns the bound port.

    Raises:
        BindError: naming the address.
    """
    address = grpc_address(host, port)
    try:
        bound = server.add_insecure_port(address) if credentials is None else server.add_secure_port(address, credentials)
    except RuntimeError as err:  # grpcio >= 1.50 raises instead of returning 0
        raise BindError(f"cannot bind {address}: {err}") from err
    if bound == 0:
        raise BindError(f"cannot bind {address}")
    return bound


class GrpcServer:
    """A ``grpc.Server`` bound to ``host:port`` now (port 0: any free port; :class:`BindError` when
    the address cannot be bound), served after :meth:`start`; add servicers to :attr:`server`.

    Requests larger than ``max_message_bytes`` are refused by gRPC with RESOURCE_EXHAUSTED; with
    ``max_concurrent_rpcs`` set, RPCs beyond it are refused the same way instead of queueing.
    Responses are not limited here (the services bound them by their request limits).

    ``reuse_port``: join a port that the caller's parent holds for its own processes
    (:mod:`tfhash.serving.processes`); off by default, so that a port in use is an error.
    ``access``: TLS and the token (:class:`~tfhash.serving.access.ServerAccess`; default plaintext, none).
    """

    def __init__(self, host: str = LOOPBACK, port: int = 0, max_workers: int = 8, max_message_bytes: int = 16 << 20,
                 max_concurrent_rpcs: int | None = None, reuse_port: bool = False, access: ServerAccess | None = None):  # fmt: skip
        access = access or ServerAccess()
        options = [
            ("grpc.max_receive_message_length", int(max_message_bytes)),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", int(reuse_port)),
        ]
        self._gate = _Gate()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=options,
                                  interceptors=[_Handlers(self._gate, access)], maximum_concurrent_rpcs=max_concurrent_rpcs)  # fmt: skip
        self.port = add_port(self.server, host, port, access.grpc_credentials)

    def start(self) -> None:
        self.server.start()

    def stop(self, grace: float) -> None:
        """Refuse new RPCs (UNAVAILABLE), let those inside a handler finish within ``grace``
        seconds, then stop the server (cancelling what still runs).

        From the call on, every RPC that reaches a handler is refused UNAVAILABLE (retryable: it was
        never executed) except the health service's; calls gRPC had queued are given
        :data:`SETTLE_SECONDS` to reach the gate before the gRPC server stops. A call that arrives in
        that last instant is failed by gRPC itself (UNAVAILABLE or CANCELLED); none of them was executed.
        """
        deadline = time.monotonic() + grace
        self._gate.close_and_wait(grace)
        # calls gRPC has queued but not handed to a handler yet: let them reach the gate (UNAVAILABLE,
        # retryable) rather than be failed by the server's stop (CANCELLED)
        time.sleep(min(SETTLE_SECONDS, max(deadline - time.monotonic(), 0.0)))
        self.server.stop(max(deadline - time.monotonic(), 0.0)).wait()


def run_until_signal(server, grace: float, signals=(signal.SIGINT, signal.SIGTERM), on_started=None,
                     exit_within: float | None = None) -> None:  # fmt: skip
    """Start ``server`` (anything with ``start()`` and ``stop(grace)``), call ``on_started(server)``,
    block until one of ``signals`` arrives (or the server's own ``failed`` event is set, if it has
    one), then ``server.stop(grace)``.

    The handlers are installed before the server starts, and the main thread waits in 0.2 s slices:
    a signal delivered to one of gRPC's threads is then still handled within 0.2 s (a wait without
    timeout would never return to Python, and the handler would never run).

    ``exit_within`` (for a process that exits once this returns, such as the CLI's services): when
    the stop begins, arm a timer outside Python's interpreter lock that, ``grace + exit_within``
    seconds later, prints every thread's stack to stderr and ends the process with exit code 1.
    It still fires when a thread blocks the interpreter's exit, where no Python code runs any more.
    With the CLI's :data:`EXIT_SECONDS`, SIGTERM or SIGINT therefore always ends the service: the
    process exits 0 after the stop, or 1 when it has not exited in time.
    """
    stopping, failed = threading.Event(), getattr(server, "failed", threading.Event())
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in signals}
    try:
        server.start()
        try:
            if on_started is not None:
                on_started(server)
            while not stopping.wait(0.2) and not failed.is_set():
                pass
        finally:  # also when on_started fails: a started server is always stopped
            if exit_within is not None:
                faulthandler.dump_traceback_later(grace + exit_within, exit=True)
            server.stop(grace)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
