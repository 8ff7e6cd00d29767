"""Greedy micro-batching: concurrent calls are merged, answers go back to the right caller, a bad
request fails alone, and the worker ends when its batcher is dropped."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
from tfhash.serving.batching import Batcher


def test_concurrent_calls_are_batched_and_answered_in_order():
    calls = []

    def double(signature, inputs):
        ((values,),) = [inputs.values()]
        calls.append(len(values))
        time.sleep(0.01)  # keep the worker busy so that requests queue up
        return values * 2

    batcher = Batcher(double, max_batch_size=64)
    results = {}

    def client(i):
        values = np.full((1 + i % 3, 2), float(i))
        results[i] = (values, batcher.submit("sig", "x", values))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for values, doubled in results.values():
        np.testing.assert_array_equal(doubled, values * 2)
    assert sum(calls) == sum(len(v) for v, _ in results.values()) and len(calls) < 40 and max(calls) <= 64


def test_a_failing_request_fails_alone():
    started, release = threading.Event(), threading.Event()

    def call(signature, inputs):
        ((values,),) = [inputs.values()]
        if not started.is_set():
            started.set()
            release.wait(5)
        if np.isnan(values).any():
            raise ValueError("bad row")
        return values + 1

    batcher = Batcher(call)
    outcomes = {}

    def client(name, values):
        try:
            outcomes[name] = batcher.submit("sig", "x", values)
        except ValueError as err:
            outcomes[name] = err

    first = threading.Thread(target=client, args=("first", np.zeros((1, 1))))
    first.start()
    started.wait(5)  # the worker is busy: the next three queue into one batch
    others = [threading.Thread(target=client, args=(n, v)) for n, v in
              [("a", np.ones((1, 1))), ("bad", np.full((1, 1), np.nan)), ("b", np.full((2, 1), 3.0))]]  # fmt: skip
    for thread in others:
        thread.start()
    time.sleep(0.2)
    release.set()
    for thread in [first, *others]:
        thread.join(5)
    assert isinstance(outcomes["bad"], ValueError)
    np.testing.assert_array_equal(outcomes["a"], [[2.0]])
    np.testing.assert_array_equal(outcomes["b"], [[4.0], [4.0]])


def test_timeout_and_worker_ends_with_its_batcher():
    batcher = Batcher(lambda s, inputs: (time.sleep(0.5), next(iter(inputs.values())))[1])
    with pytest.raises(TimeoutError):
        batcher.submit("sig", "x", np.zeros((1, 1)), timeout=0.01)
    worker = batcher._worker
    del batcher
    gc.collect()
    worker.join(5)
    assert not worker.is_alive()
    with pytest.raises(ValueError):
        Batcher(lambda s, i: None, max_batch_size=0)
