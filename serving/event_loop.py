"""The event loop a service's front serves from: uvloop (libuv's loop) where it is installed,
else the standard library's; uvloop serves a request with less of the loop's CPU
(``benchmarks/results/serving_one_front.md``)."""

from __future__ import annotations

import asyncio

__all__ = ["EVENT_LOOPS", "new_event_loop"]


#: The loops to choose from: "uvloop", "asyncio" or "auto" (uvloop where it is installed).
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def new_event_loop(kind: str = "auto") -> asyncio.AbstractEventLoop:
    """A new event loop of ``kind`` (:data:`EVENT_LOOPS`). Raises ValueError for another name or
    for "uvloop" where it is not installed (the serving extra installs it on Linux and macOS)."""
    if kind not in EVENT_LOOPS:
        raise ValueError(f"event loop {kind!r} is none of {', '.join(EVENT_LOOPS)}")
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError as err:
            if kind == "uvloop":
                raise ValueError(
                    "event loop 'uvloop' is not installed: pip install uvloop (or choose 'asyncio')"
                ) from err
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()
