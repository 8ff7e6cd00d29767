"""What the gRPC clients share: a channel they own (or borrow), a default deadline, the
credentials every call carries (:class:`~tfhash.serving.access.ClientCredentials`), and gRPC
errors turned into :class:`~tfhash.serving.errors.ServingError` with the same status code."""

from __future__ import annotations

import grpc
from tfhash.serving.access import ClientCredentials
from tfhash.serving.errors import ServingError

__all__ = ["ChannelClient"]


class ChannelClient:
    """Base of the tfhash gRPC clients; a context manager that closes the channel it opened.

    ``credentials``: TLS and the bearer token of a service that asks for them (the channel is made
    with them unless ``channel`` is given; the token goes with every call either way).
    """

    def __init__(self, target: str, timeout: float = 10.0, channel: grpc.Channel | None = None, options=(),
                 credentials: ClientCredentials | None = None):  # fmt: skip
        self.target, self.timeout = target, float(timeout)
        credentials = credentials or ClientCredentials()
        self._metadata = credentials.metadata()
        self._own_channel = channel is None
        self._channel = channel or credentials.channel(target, options)

    def _call(self, method, request, timeout: float | None = None):
        """``method(request)`` with the deadline ``timeout`` (default: the client's)."""
        try:
            return method(request, timeout=self.timeout if timeout is None else timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise ServingError(err.code(), err.details() or str(err.code())) from err

    def close(self) -> None:
        if self._own_channel:
            self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
