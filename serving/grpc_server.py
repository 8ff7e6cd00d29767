"""The gRPC server shell that the development model server and the search service share:
thread pool, message-size and concurrency limits, loopback bind by default, graceful stop."""

from __future__ import annotations

import signal
import threading
from concurrent import futures

import grpc

LOOPBACK = "127.0.0.1"


def build_server(host: str = LOOPBACK, port: int = 0, max_workers: int = 8, max_message_bytes: int = 16 << 20,
                 max_concurrent_rpcs: int | None = None) -> tuple[grpc.Server, int]:  # fmt: skip
    """An unstarted ``grpc.Server`` bound to ``host:port`` (port 0: any free port).

    Requests larger than ``max_message_bytes`` are refused by gRPC with RESOURCE_EXHAUSTED; with
    ``max_concurrent_rpcs`` set, RPCs beyond it are refused the same way instead of queueing.

    Returns:
        ``(server, bound_port)``.

    Raises:
        OSError: the address cannot be bound.
    """
    options = [
        ("grpc.max_receive_message_length", int(max_message_bytes)),
        ("grpc.max_send_message_length", int(max_message_bytes)),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=options,
                         maximum_concurrent_rpcs=max_concurrent_rpcs)  # fmt: skip
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as err:  # grpcio >= 1.50 raises instead of returning 0
        raise OSError(f"cannot bind {address}: {err}") from err
    if bound == 0:
        raise OSError(f"cannot bind {address}")
    return server, bound


def wait_for_termination(stop, signals=(signal.SIGINT, signal.SIGTERM)) -> None:
    """Block until SIGINT / SIGTERM, then call ``stop()`` (which drains in-flight requests)."""
    done = threading.Event()
    for sig in signals:
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    stop()
