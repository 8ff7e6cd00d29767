"""The search service's coalescer: requests that wait while a call runs are joined by key into the
next call (one call in flight), answers go back to the right caller in order, a bad request fails
alone, a shared error reaches the whole call, and a request whose caller went away never runs."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from tfhash.serving.batching import Coalescer

KEY = lambda item: item[0]  # noqa: E731 - items are (key, rows)
SIZE = lambda item: len(item[1])  # noqa: E731


def join(items):
    return items[0][0], np.concatenate([rows for _, rows in items])


def held_coalescer(answer, **options):
    """A coalescer whose first call waits for ``release`` (so that the rest queue behind it); the
    calls' (key, rows) are recorded."""
    calls, started, release = [], threading.Event(), threading.Event()

    def call(item, timeout):
        calls.append((item[0], len(item[1])))
        started.set()
        release.wait(10)
        return answer(item)

    return Coalescer(call, join, KEY, SIZE, **options), calls, started, release


async def submit_behind_first(coalescer, started, release, first, rest):
    """Submit ``first``, wait until its call runs, submit ``rest`` (they queue), then release; every
    outcome (answers or the error), in order."""

    async def outcome(item):
        try:
            return await coalescer.submit(item)
        except Exception as err:  # noqa: BLE001 - the outcome under test
            return err

    head = asyncio.ensure_future(outcome(first))
    while not started.is_set():
        await asyncio.sleep(0.005)
    tasks = [asyncio.ensure_future(outcome(item)) for item in rest]
    while coalescer.waiting < len(rest):
        await asyncio.sleep(0.005)
    release.set()
    return await asyncio.gather(head, *tasks)


def test_waiting_requests_join_by_key_and_get_their_own_rows_back():
    coalescer, calls, started, release = held_coalescer(lambda item: list(item[1] * 2), max_rows=8)
    first = ("a", np.array([100.0]))
    rest = [("a" if i % 3 else "b", np.arange(i, i + 1 + i % 2, dtype=float)) for i in range(12)]
    outcomes = asyncio.run(submit_behind_first(coalescer, started, release, first, rest))
    assert outcomes[0] == [200.0]
    for (_, rows), got in zip(rest, outcomes[1:], strict=True):
        assert got == list(rows * 2)
    assert calls[0] == ("a", 1) and sum(n for _, n in calls) == 1 + sum(len(r) for _, r in rest)
    assert all(n <= 8 for _, n in calls) and len(calls) < 1 + len(rest)
    assert all(len({key for key, _ in calls[i : i + 1]}) == 1 for i in range(len(calls)))  # a call holds one key
    assert coalescer.calls == len(calls)
    coalescer.close()


def test_a_failing_request_fails_alone_and_a_shared_error_reaches_the_whole_call():
    class Down(Exception):
        pass

    def answer(item):
        key, rows = item
        if key == "down":
            raise Down("the store is down")
        if np.any(rows < 0):
            raise ValueError(f"negative rows in {rows.tolist()}")
        return list(rows)

    coalescer, calls, started, release = held_coalescer(answer, shared=lambda err: isinstance(err, Down))
    rest = [("k", np.array([1.0])), ("k", np.array([-1.0])), ("k", np.array([2.0])), ("down", np.array([1.0])), ("down", np.array([2.0]))]
    outcomes = asyncio.run(submit_behind_first(coalescer, started, release, ("k", np.array([0.0])), rest))
    assert outcomes[1] == [1.0] and outcomes[3] == [2.0]
    assert isinstance(outcomes[2], ValueError) and "[-1.0]" in str(outcomes[2])
    assert isinstance(outcomes[4], Down) and outcomes[4] is outcomes[5]
    assert calls.count(("down", 2)) == 1 and ("down", 1) not in calls  # no retry one by one for a shared error
    assert calls.count(("k", 3)) == 1 and calls.count(("k", 1)) == 4  # the first, then the failed call one by one
    coalescer.close()


def test_a_request_whose_caller_went_away_is_never_run():
    coalescer, calls, started, release = held_coalescer(lambda item: list(item[1]))

    async def scenario():
        first = asyncio.ensure_future(coalescer.submit(("a", np.zeros(1))))
        while not started.is_set():
            await asyncio.sleep(0.005)
        cancelled = asyncio.ensure_future(coalescer.submit(("b", np.zeros(2))))
        expired = asyncio.ensure_future(coalescer.submit(("c", np.zeros(3)), timeout=0.01))
        kept = asyncio.ensure_future(coalescer.submit(("d", np.ones(1))))
        await asyncio.sleep(0.05)
        cancelled.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        with pytest.raises(TimeoutError):
            await expired
        return await first, await kept

    assert asyncio.run(scenario()) == ([0.0], [1.0])
    assert [key for key, _ in calls] == ["a", "d"]
    coalescer.close()


def test_the_initializer_runs_once_on_the_thread_that_makes_the_calls():
    threads = []
    coalescer = Coalescer(lambda item, timeout: threads.append(("call", threading.get_ident())) or list(item[1]), join, KEY, SIZE,
                          initializer=lambda: threads.append(("setup", threading.get_ident())))  # fmt: skip

    async def twice():
        return [await coalescer.submit(("a", np.array([float(i)]))) for i in range(2)]

    assert asyncio.run(twice()) == [[0.0], [1.0]]
    assert [kind for kind, _ in threads] == ["setup", "call", "call"] and len({ident for _, ident in threads}) == 1
    assert threads[0][1] != threading.get_ident()
    coalescer.close()


def test_a_lone_request_runs_at_once_and_bad_settings_are_refused():
    coalescer = Coalescer(lambda item, timeout: list(item[1]), join, KEY, SIZE)
    assert asyncio.run(coalescer.submit(("a", np.array([5.0])))) == [5.0] and coalescer.calls == 1
    coalescer.close()
    with pytest.raises(ValueError, match="max_rows must be >= 1"):
        Coalescer(lambda item, timeout: [], join, KEY, SIZE, max_rows=0)
