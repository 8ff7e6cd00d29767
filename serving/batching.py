"""Greedy micro-batching of concurrent calls: the in-process encoder's model calls and the search
service's index searches.

A worker thread (or ``workers`` of them) makes the calls; requests that arrive while they are busy
queue up and are taken together (up to ``max_batch_size`` rows, same key: the signature and input
of a model call, the k of a search) by the next call, so nothing waits for a timer: a lone request
runs at once, and under load the per-call overhead (Python, graph dispatch, a pass over the
database) is shared by many requests. TF Serving's ``--enable_batching`` does the same for the remote encoder.

A batch that fails is retried request by request, so one malformed request cannot fail the others
that happened to share its batch; except for the ``shared_errors`` types (a store that is down),
which every request of the batch gets at once. A request whose caller stopped waiting (its
timeout) and that is still queued is dropped, not run.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class _Request:
    key: Hashable
    values: np.ndarray
    done: threading.Event = field(default_factory=threading.Event)
    result: np.ndarray | tuple | None = None
    error: BaseException | None = None
    abandoned: bool = False


def _rows(output, start: int, stop: int):
    """Rows ``start:stop`` of a call's output: an array, or a tuple of arrays with one row per input row."""
    if isinstance(output, tuple):
        return tuple(part[start:stop] for part in output)
    return output[start:stop]


class Batcher:
    """Coalesces ``call(key, values) -> rows`` calls made from many threads: ``values`` are rows
    (batch first) and the answer has one row per input row (an array, or a tuple of arrays)."""

    def __init__(self, call: Callable[[Hashable, np.ndarray], np.ndarray | tuple], max_batch_size: int = 128,
                 name: str = "tfhash-batcher", shared_errors: tuple[type[BaseException], ...] = (), workers: int = 1):  # fmt: skip
        if max_batch_size < 1 or workers < 1:
            raise ValueError(f"max_batch_size and workers must be >= 1, got {max_batch_size} and {workers}")
        self._call, self.max_batch_size, self.shared_errors = call, int(max_batch_size), tuple(shared_errors)
        self._queue: deque[_Request] = deque()
        self._ready = threading.Condition()
        # the workers hold only a weak reference: when the encoder or the served pair (and so the
        # batcher) of a swapped-out version is dropped, they end and the model or index can be freed
        self._workers = [threading.Thread(target=_work, args=(weakref.ref(self), self._ready, self._queue),
                                          name=f"{name}-{i}", daemon=True) for i in range(workers)]  # fmt: skip
        for worker in self._workers:
            worker.start()

    def submit(self, key: Hashable, values: np.ndarray, timeout: float | None = None) -> np.ndarray | tuple:
        """``call(key, values)``, possibly together with other requests of the same key; blocks
        until done.

        Raises:
            TimeoutError: not done within ``timeout`` seconds (the result is then discarded).
            Whatever the call raised for this request.
        """
        request = _Request(key, values)
        with self._ready:
            self._queue.append(request)
            self._ready.notify()
        if not request.done.wait(timeout):
            request.abandoned = True  # still queued: never run; running: its answer is dropped
            raise TimeoutError("the call did not finish before the deadline")
        if request.error is not None:
            error, request.error = request.error, None  # the request no longer holds the traceback
            raise error
        return request.result

    def _take(self) -> list[_Request]:
        """The oldest request and the queued ones that fit beside it in one call (none when every
        queued request was abandoned)."""
        with self._ready:
            while self._queue and self._queue[0].abandoned:
                self._queue.popleft()
            if not self._queue:
                return []
            first = self._queue.popleft()
            batch, rows, kept = [first], len(first.values), deque()
            while self._queue:
                candidate = self._queue.popleft()
                if candidate.abandoned:
                    continue
                fits = rows + len(candidate.values) <= self.max_batch_size
                if fits and candidate.key == first.key:
                    batch.append(candidate)
                    rows += len(candidate.values)
                else:
                    kept.append(candidate)
            self._queue.extendleft(reversed(kept))
        return batch

    def _run(self, batch: list[_Request]) -> None:
        first = batch[0]
        try:
            values = first.values if len(batch) == 1 else np.concatenate([r.values for r in batch])
            output = self._call(first.key, values)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting request(s)
            if len(batch) == 1 or isinstance(err, self.shared_errors):
                for request in batch:
                    request.error = err
                    request.done.set()
            else:
                for request in batch:  # find the request(s) that fail on their own
                    self._run([request])
            return
        start = 0
        for request in batch:
            request.result = _rows(output, start, start + len(request.values))
            start += len(request.values)
            request.done.set()


def _work(ref, ready: threading.Condition, queue: deque) -> None:
    while True:
        with ready:
            while not queue:
                if ref() is None:
                    return
                ready.wait(1.0)
        batcher = ref()
        if batcher is None:
            return
        batch = batcher._take()  # empty when another worker took them first, or all were abandoned
        if batch:
            batcher._run(batch)
        del batcher, batch
