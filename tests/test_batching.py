"""Greedy micro-batching: concurrent calls are merged, answers go back to the right caller, a bad
request fails alone, and the worker ends when its batcher is dropped."""

from __future__ import annotations

import functools
import gc
import threading
import time

import numpy as np
import pytest
from tfhash.serving.batching import Batcher

from tests.serving_fixtures import queued_behind


def test_concurrent_calls_are_batched_and_answered_in_order():
    calls = []

    def double(key, values):
        calls.append(len(values))
        time.sleep(0.01)  # keep the worker busy so that requests queue up
        return values * 2

    batcher = Batcher(double, max_batch_size=64)
    results = {}

    def client(i):
        values = np.full((1 + i % 3, 2), float(i))
        results[i] = (values, batcher.submit("sig", values))

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

    def call(key, values):
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
            outcomes[name] = batcher.submit("sig", values)
        except ValueError as err:
            outcomes[name] = err

    others = [("a", np.ones((1, 1))), ("bad", np.full((1, 1), np.nan)), ("b", np.full((2, 1), 3.0))]
    # the worker is busy with the first: the next three queue into one batch
    queued_behind(lambda: client("first", np.zeros((1, 1))), started, release,
                  [functools.partial(client, name, values) for name, values in others], lambda: len(batcher._queue) == 3)  # fmt: skip
    assert isinstance(outcomes["bad"], ValueError)
    np.testing.assert_array_equal(outcomes["a"], [[2.0]])
    np.testing.assert_array_equal(outcomes["b"], [[4.0], [4.0]])


def test_timeout_and_worker_ends_with_its_batcher():
    release = threading.Event()
    batcher = Batcher(lambda key, values: (release.wait(10), values)[1])  # a call that outlasts its caller's timeout
    with pytest.raises(TimeoutError):
        batcher.submit("sig", np.zeros((1, 1)), timeout=0.01)
    release.set()
    workers = batcher._workers
    del batcher
    gc.collect()
    for worker in workers:
        worker.join(5)
        assert not worker.is_alive()
    with pytest.raises(ValueError):
        Batcher(lambda s, i: None, max_batch_size=0)
    with pytest.raises(ValueError):
        Batcher(lambda s, i: None, workers=0)


def test_requests_of_another_key_never_share_a_call_and_tuple_answers_are_split():
    started, release, calls = threading.Event(), threading.Event(), []

    def search(k, rows):
        if not started.is_set():
            started.set()
            release.wait(5)
        calls.append((k, len(rows)))
        return rows[:, :1] * k, rows.sum(axis=1)

    batcher = Batcher(search)
    answers = {}

    def client(name, k, rows):
        answers[name] = batcher.submit(k, rows)

    queued_behind(lambda: client("first", 1, np.ones((1, 2))), started, release,
                  [functools.partial(client, name, k, np.full((n, 2), float(n))) for name, k, n in
                   [("a", 10, 1), ("b", 20, 2), ("c", 10, 3)]], lambda: len(batcher._queue) == 3)  # fmt: skip
    assert sorted(calls) == [(1, 1), (10, 4), (20, 2)]  # a and c together, b alone
    for name, k, n in [("a", 10, 1), ("b", 20, 2), ("c", 10, 3)]:
        column, sums = answers[name]
        np.testing.assert_array_equal(column, np.full((n, 1), float(n * k)))
        np.testing.assert_array_equal(sums, np.full(n, 2.0 * n))


class StoreDown(Exception):
    pass


def test_shared_errors_reach_the_whole_batch_at_once_and_abandoned_requests_never_run():
    started, release, calls = threading.Event(), threading.Event(), []

    def call(key, values):
        calls.append(len(values))
        if not started.is_set():
            started.set()
            release.wait(5)
            return values
        raise StoreDown("the store is down")

    batcher = Batcher(call, shared_errors=(StoreDown,))
    outcomes = {}

    def client(name, timeout=None):
        try:
            outcomes[name] = batcher.submit("k", np.zeros((1, 1)), timeout)
        except (StoreDown, TimeoutError) as err:
            outcomes[name] = err

    queued_behind(lambda: client("first"), started, release, [functools.partial(client, n) for n in "abc"] +
                  [functools.partial(client, "gone", 0.05)], lambda: len(batcher._queue) == 4 and "gone" in outcomes)  # fmt: skip
    assert calls == [1, 3]  # a, b and c in one call, not retried one by one; "gone" never ran
    assert all(isinstance(outcomes[n], StoreDown) for n in "abc") and isinstance(outcomes["gone"], TimeoutError)


def test_the_asyncio_measurements_loop_batcher_joins_one_turn_and_splits_back():
    import asyncio

    from benchmarks.asyncio_front import LoopBatcher

    calls = []

    def call(key, rows):
        calls.append((key, rows.copy()))
        if key == "bad":
            raise ValueError("refused")
        return [int(r) * 10 for r in rows[:, 0]]

    async def main():
        batcher = LoopBatcher(call, max_rows=4)
        jobs = [batcher.submit("a", np.array([[1], [2]])), batcher.submit("a", np.array([[3]])), batcher.submit("b", np.array([[4]])),
                batcher.submit("a", np.array([[5], [6]])), batcher.submit("bad", np.array([[7]]))]  # fmt: skip
        return await asyncio.gather(*jobs, return_exceptions=True)

    out = asyncio.run(main())
    assert out[:4] == [[10, 20], [30], [40], [50, 60]] and isinstance(out[4], ValueError)
    # one turn: "a" in two calls (4 rows at most), "b" and "bad" in one each
    assert [(key, rows[:, 0].tolist()) for key, rows in calls] == [("a", [1, 2, 3]), ("a", [5, 6]), ("b", [4]), ("bad", [7])]
