"""Greedy micro-batching of concurrent model calls, for the in-process encoder.

One worker thread calls the model; requests that arrive while it is busy queue up and are taken
together (up to ``max_batch_size`` rows, same signature) by its next call, so nothing waits for a
timer: a lone request runs at once, and under load the per-call overhead (Python, graph dispatch)
is shared by many requests. TF Serving's ``--enable_batching`` does the same for the remote
encoder, so this is only used in process.

A batch that fails is retried request by request, so one malformed request cannot fail the others
that happened to share its batch.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class _Request:
    signature: str
    name: str
    values: np.ndarray
    done: threading.Event = field(default_factory=threading.Event)
    result: np.ndarray | None = None
    error: BaseException | None = None


class Batcher:
    """Coalesces ``call(signature, {name: values}) -> rows`` calls made from many threads."""

    def __init__(self, call: Callable[[str, dict], np.ndarray], max_batch_size: int = 128):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self._call, self.max_batch_size = call, int(max_batch_size)
        self._queue: deque[_Request] = deque()
        self._ready = threading.Condition()
        # the worker holds only a weak reference: when the encoder (and so the batcher) of a
        # swapped-out model version is dropped, the worker ends and the model can be freed
        self._worker = threading.Thread(target=_work, args=(weakref.ref(self), self._ready, self._queue),
                                        name="tfhash-encode-batcher", daemon=True)  # fmt: skip
        self._worker.start()

    def submit(self, signature: str, name: str, values: np.ndarray, timeout: float | None = None) -> np.ndarray:
        """Run ``values`` (batch first) through ``signature``; blocks until done.

        Raises:
            TimeoutError: not done within ``timeout`` seconds (the result is then discarded).
            Whatever the call raised for this request.
        """
        request = _Request(signature, name, values)
        with self._ready:
            self._queue.append(request)
            self._ready.notify()
        if not request.done.wait(timeout):
            raise TimeoutError("the encode call did not finish before the deadline")
        if request.error is not None:
            raise request.error
        return request.result

    def _take(self) -> list[_Request]:
        """The oldest request and the queued ones that fit beside it in one call."""
        with self._ready:
            first = self._queue.popleft()
            batch, rows, kept = [first], len(first.values), deque()
            while self._queue:
                candidate = self._queue.popleft()
                fits = rows + len(candidate.values) <= self.max_batch_size
                if fits and (candidate.signature, candidate.name) == (first.signature, first.name):
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
            output = self._call(first.signature, {first.name: values})
        except BaseException as err:  # noqa: BLE001 - handed to the waiting request(s)
            if len(batch) == 1:
                first.error = err
                first.done.set()
            else:
                for request in batch:  # find the request(s) that fail on their own
                    self._run([request])
            return
        start = 0
        for request in batch:
            request.result = output[start : start + len(request.values)]
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
        batcher._run(batcher._take())
        del batcher
