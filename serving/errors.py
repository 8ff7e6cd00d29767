"""One error type for the serving layer, carrying the gRPC status code the caller should see.

The gRPC servicers answer with ``code`` and ``message`` (:func:`answers_errors`); the REST front
answers the matching HTTP status. Anything that is not a :class:`ServingError` is a server fault:
it is logged with its traceback and answered INTERNAL / 500 without details.
"""

from __future__ import annotations

import functools
import logging

import grpc

__all__ = ["HTTP_STATUS", "MAX_MESSAGE", "quoted_value", "ServingError", "invalid", "not_found", "permission_denied", "unavailable", "deadline_exceeded", "too_large", "internal_error", "answers_errors"]


logger = logging.getLogger(__name__)

#: HTTP statuses of the REST front for each gRPC code (as the gRPC-JSON transcoding convention).
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
}


#: Longest error message sent back: client-chosen text quoted in it stays well under the
#: metadata limits of gRPC clients (a longer one would reach them as another error).
MAX_MESSAGE = 1000


def quoted_value(text: str, limit: int = 80) -> str:
    """A client-chosen string as quoted in an error message, cut to ``limit`` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


class ServingError(Exception):
    """A request that cannot be answered, with the status code that says why (the message is cut
    to :data:`MAX_MESSAGE` characters)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        message = message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)


def invalid(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.NOT_FOUND, message)


def permission_denied(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.PERMISSION_DENIED, message)


def unavailable(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.UNAVAILABLE, message)


def deadline_exceeded(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.DEADLINE_EXCEEDED, message)


def too_large(message: str) -> ServingError:
    """A request over a size or cost limit (RESOURCE_EXHAUSTED)."""
    return ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def internal_error(where: str) -> ServingError:
    """Log the exception being handled (a server fault) and return the INTERNAL answer for it."""
    logger.exception("%s failed", where)
    return ServingError(grpc.StatusCode.INTERNAL, "internal error (the server logged the cause)")


def answers_errors(method):
    """Decorate a gRPC servicer method: a :class:`ServingError` is answered with its code and
    message, any other exception is logged and answered INTERNAL (never grpcio's UNKNOWN)."""

    @functools.wraps(method)
    def wrapper(self, request, context, *args, **kwargs):
        try:
            return method(self, request, context, *args, **kwargs)
        except ServingError as err:
            error = err
        except Exception:  # noqa: BLE001 - a server fault: logged, answered INTERNAL
            error = internal_error(method.__qualname__)
        context.abort(error.code, error.message)

    return wrapper
