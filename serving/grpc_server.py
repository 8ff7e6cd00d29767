"""The gRPC server shell that the development model server and the search service share: thread
pool, message-size and concurrency limits, loopback bind by default, request bytes that do not
decode answered INVALID_ARGUMENT, and a signal loop that drains and exits.

Shutdown (:func:`run_until_signal`): on SIGTERM or SIGINT the server's ``stop(grace)`` runs at
once, whichever thread the signal reached (the main thread waits in short slices so that Python
runs its handler); ``stop`` refuses new RPCs with UNAVAILABLE, lets in-flight ones finish for up
to ``grace`` seconds and cancels the rest; the process then exits 0.
"""

from __future__ import annotations

import functools
import signal
import threading
from concurrent import futures

import grpc
from tfhash.serving.requests import check_whole

LOOPBACK = "127.0.0.1"


class RefuseUndecodable(grpc.ServerInterceptor):
    """Decode request messages inside the handler instead of in grpcio, so that bytes that are no
    message of the method's type get INVALID_ARGUMENT (grpcio itself answers INTERNAL
    "Exception deserializing request!"), bytes the parser reads only in part included
    (:func:`tfhash.serving.requests.check_whole`). Applies to unary-request methods, which are all
    that tfhash, TF Serving's API and the health service define."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        decode, method = handler.request_deserializer, handler_call_details.method

        def parsed(raw, context):
            try:
                message = decode(raw)
                check_whole(type(message), raw)
                return message
            except Exception:  # noqa: BLE001 - any decoding failure is the client's bytes
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request bytes are not a valid request message of {method}")

        if handler.response_streaming:
            behaviour = handler.unary_stream

            @functools.wraps(behaviour)
            def unary_stream(raw, context, *args, **kwargs):
                return behaviour(parsed(raw, context), context, *args, **kwargs)

            return grpc.unary_stream_rpc_method_handler(unary_stream, None, handler.response_serializer)
        behaviour = handler.unary_unary

        @functools.wraps(behaviour)
        def unary_unary(raw, context):
            return behaviour(parsed(raw, context), context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, None, handler.response_serializer)


def build_server(host: str = LOOPBACK, port: int = 0, max_workers: int = 8, max_message_bytes: int = 16 << 20,
                 max_concurrent_rpcs: int | None = None) -> tuple[grpc.Server, int]:  # fmt: skip
    """An unstarted ``grpc.Server`` bound to ``host:port`` (port 0: any free port).

    Requests larger than ``max_message_bytes`` are refused by gRPC with RESOURCE_EXHAUSTED; with
    ``max_concurrent_rpcs`` set, RPCs beyond it are refused the same way instead of queueing.
    Responses are not limited here (the services bound them by their request limits).

    Returns:
        ``(server, bound_port)``.

    Raises:
        OSError: the address cannot be bound.
    """
    options = [
        ("grpc.max_receive_message_length", int(max_message_bytes)),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=options,
                         interceptors=[RefuseUndecodable()], maximum_concurrent_rpcs=max_concurrent_rpcs)  # fmt: skip
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as err:  # grpcio >= 1.50 raises instead of returning 0
        raise OSError(f"cannot bind {address}: {err}") from err
    if bound == 0:
        raise OSError(f"cannot bind {address}")
    return server, bound


def run_until_signal(server, grace: float, signals=(signal.SIGINT, signal.SIGTERM), on_started=None) -> None:
    """Start ``server`` (anything with ``start()`` and ``stop(grace)``), call ``on_started(server)``,
    block until one of ``signals`` arrives, then ``server.stop(grace)``.

    The handlers are installed before the server starts, and the main thread waits in 0.2 s slices:
    a signal delivered to one of gRPC's threads is then still handled within 0.2 s (a wait without
    timeout would never return to Python, and the handler would never run).
    """
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in signals}
    try:
        server.start()
        if on_started is not None:
            on_started(server)
        while not stopping.wait(0.2):
            pass
        server.stop(grace)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
