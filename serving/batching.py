"""The search service's one batching primitive: concurrent requests of one kind joined into one
call, with one call in flight per process."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

__all__ = ["Coalescer"]


@dataclass
class _Waiting:
    item: Any
    key: Hashable
    size: int
    deadline: float | None
    future: asyncio.Future

    def gone(self) -> bool:
        return self.future.done() or (self.deadline is not None and time.monotonic() >= self.deadline)


class Coalescer:
    """Joins the items submitted on one event loop into calls ``call(joined, timeout) -> answers``
    made on a worker thread, one at a time.

    A request submitted on the service's event loop waits in a queue. While no call runs, the next
    one starts at the end of the loop's current turn (so the requests that arrived in that turn join
    it) on the coalescer's worker thread; the event loop meanwhile goes on reading and parsing
    requests, which queue. When the call returns, the oldest waiting request and every other waiting
    request of the same key (the same form of query, k, radius and pinned version) that fits within
    ``max_rows`` rows make the next call. A lone request therefore runs at once, and under load the
    per-call cost (the model call, a pass over the database) is shared by the requests that queued
    while the previous call ran. A process answers one joined call at a time; more cores are used by
    more processes on one port (:mod:`tfhash.serving.processes`).

    A joined call that fails is retried request by request, so one request the pair refuses (codes
    of a wrong value, say) cannot fail the others that shared its call; an error that ``shared``
    accepts (the service is unavailable) is every request's at once. A request whose caller went away
    (its RPC cancelled, its deadline passed) is dropped before it is run.

    Args:
        call: answers a joined item with one answer per row, within ``timeout`` seconds (None:
            no deadline; the latest deadline of the requests joined).
        join: the items of one key as one item (a single item is passed through as it is).
        key: what must be equal for items to join.
        size: an item's rows.
        max_rows: the rows of a joined call (a single larger item runs alone).
        shared: the errors that every request of a failed call gets without a retry one by one.
        initializer: run once on the worker thread before its first call (per-thread settings,
            such as FAISS's OpenMP threads).
    """

    def __init__(self, call: Callable[[Any, float | None], Sequence], join: Callable[[list], Any],
                 key: Callable[[Any], Hashable], size: Callable[[Any], int] = len, max_rows: int = 64,
                 shared: Callable[[BaseException], bool] = lambda err: False, name: str = "tfhash-coalescer",
                 initializer: Callable[[], None] | None = None):  # fmt: skip
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self._call, self._join, self._key, self._size = call, join, key, size
        self.max_rows, self._shared = int(max_rows), shared
        self._queue: deque[_Waiting] = deque()
        self._running = False
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=initializer)
        self.calls = 0  # joined calls made (a retry one by one counts once)

    @property
    def waiting(self) -> int:
        """Requests queued and not yet taken into a call."""
        return len(self._queue)

    async def submit(self, item, timeout: float | None = None):
        """``item``'s answers (a list, one per row), from a call it may share with other items.

        Raises:
            Whatever the call raised for this item; ``asyncio.CancelledError`` when the caller is
            cancelled (the item is then not run, or its answer is dropped).
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        waiting = _Waiting(item, self._key(item), self._size(item), deadline, loop.create_future())
        self._queue.append(waiting)
        if not self._running:
            self._running = True
            loop.call_soon(self._next)  # after the handlers that are ready in this turn
        return await waiting.future

    def _take(self) -> list[_Waiting]:
        """The oldest live request and the queued ones of its key that fit beside it."""
        while self._queue and self._queue[0].gone():
            self._drop(self._queue.popleft())
        if not self._queue:
            return []
        first = self._queue.popleft()
        batch, rows, kept = [first], first.size, deque()
        while self._queue:
            candidate = self._queue.popleft()
            if candidate.gone():
                self._drop(candidate)
            elif candidate.key == first.key and rows + candidate.size <= self.max_rows:
                batch.append(candidate)
                rows += candidate.size
            else:
                kept.append(candidate)
        self._queue = kept
        return batch

    @staticmethod
    def _drop(waiting: _Waiting) -> None:
        if not waiting.future.done():
            waiting.future.set_exception(TimeoutError("the request's deadline passed before it was run"))

    def _next(self) -> None:
        batch = self._take()
        if not batch:
            self._running = False
            return
        self.calls += 1
        done = asyncio.get_running_loop().run_in_executor(self._worker, self._outcomes, batch)
        done.add_done_callback(lambda finished: self._answer(batch, finished))

    def _answer(self, batch: list[_Waiting], finished: asyncio.Future) -> None:
        if finished.cancelled():  # closed before the call ran
            outcomes = [RuntimeError("the service stopped before the request was run")] * len(batch)
        else:
            outcomes = finished.result() if finished.exception() is None else [finished.exception()] * len(batch)
        for waiting, outcome in zip(batch, outcomes, strict=True):
            if waiting.future.done():  # cancelled meanwhile
                continue
            if isinstance(outcome, BaseException):
                waiting.future.set_exception(outcome)
            else:
                waiting.future.set_result(outcome)
        self._next()

    def _outcomes(self, batch: list[_Waiting]) -> list:
        """On the worker thread: each request's answers, or the error it gets."""
        deadlines = [w.deadline for w in batch]
        timeout = None if None in deadlines else max(max(deadlines) - time.monotonic(), 0.0)
        try:
            answers = self._call(batch[0].item if len(batch) == 1 else self._join([w.item for w in batch]), timeout)
        except Exception as err:  # noqa: BLE001 - handed to the waiting request(s)
            if len(batch) == 1 or self._shared(err):
                return [err] * len(batch)
            return [outcome for waiting in batch for outcome in self._outcomes([waiting])]
        start, outcomes = 0, []
        for waiting in batch:
            outcomes.append(list(answers[start : start + waiting.size]))
            start += waiting.size
        return outcomes

    def close(self) -> None:
        """End the worker thread once its call (if any) returns."""
        self._worker.shutdown(wait=False, cancel_futures=True)
