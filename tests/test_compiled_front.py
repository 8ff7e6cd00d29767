"""``tfhash serve search --front compiled``: the compiled front (serving/compiled_front.cc) before
real serving processes, each a real CLI process over real gRPC on loopback. Every caller gets
exactly what the service alone answers it, joined with other callers' rows or not, refused and
malformed requests included; the other calls and the health stream go through; a dead front is
restarted; SIGTERM ends the health stream with NOT_SERVING and answers what was sent."""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tfhash.serving import native, search_pb2
from tfhash.serving.search_client import search_request

from benchmarks.serving import SEARCH_METHOD
from tests.serving_fixtures import database, push_version, start_cli, stop_cli, wait_for

pytestmark = [pytest.mark.skipif(native.missing() is not None, reason=f"building the compiled front: {native.missing()}"),
              pytest.mark.process, pytest.mark.server]  # fmt: skip


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    root = tmp_path_factory.mktemp("compiled-front")
    vectors, ids = database()
    push_version(str(root / "models"), str(root / "indexes"), 1, 0, vectors, ids)
    return {"models": str(root / "models"), "indexes": str(root / "indexes"), "vectors": vectors}


def serve(versions, *extra: str):
    return start_cli(["serve", "search", "--model-base-dir", versions["models"], "--index-base-dir", versions["indexes"],
                      "--port", "0", "--poll-seconds", "0.3", *extra], "search service on ")  # fmt: skip


@pytest.fixture(scope="module")
def plain(versions):
    """The service on its own (the Python front): what every answer through the front must equal."""
    process, address = serve(versions)
    yield address
    stop_cli(process)


@pytest.fixture
def fronted(versions):
    process, address = serve(versions, "--front", "compiled")
    yield process, address
    if process.poll() is None:
        stop_cli(process)


def front_of(process) -> psutil.Process:
    (front,) = [p for p in psutil.Process(process.pid).children() if p.name().startswith("compiled_front")]
    return front


def _raw(address: str):
    """A channel to ``address`` and its Search call on bytes (answers parsed)."""
    channel = grpc.insecure_channel(address)
    return channel, _search(channel)


def _search(channel):
    return channel.unary_unary(SEARCH_METHOD, response_deserializer=search_pb2.SearchResponse.FromString)


def _outcome(call, request: bytes, timeout: float = 30.0):
    try:
        return "ok", call(request, timeout=timeout)
    except grpc.RpcError as err:
        return err.code(), err.details()


# protobuf reads a tag as a 32-bit varint of at most 5 bytes: field number 2**32 + 4 (4, k, if cut to 32 bits) holding 5,
# and k's tag written in 6 bytes, holding 5, are malformed
OUT_OF_RANGE_FIELD = bytes([0xA0, 0x80, 0x80, 0x80, 0x80, 0x01, 0x05])
OVERLONG_K = bytes([0xA0, 0x80, 0x80, 0x80, 0x80, 0x00, 0x05])


def _mix(vectors) -> list[bytes]:
    """Search requests in every joinable form, and some that are not joinable, malformed or refused."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, (40, 2), dtype=np.uint8)  # the fixture's 16-bit codes
    nan = vectors[:1].copy()
    nan[0, 3] = np.nan
    requests = []
    for i in range(300):
        if i % 10 == 9:
            request = search_request(features=nan, k=5)  # refused by the service, joined or not
        elif i % 10 == 8:
            request = search_request(codes=codes[i % 40 : i % 40 + 1], k=5, radius=6)
        elif i % 10 == 7:
            request = search_request(features=vectors[i % 200 : i % 200 + 2], k=5, model_version="1")  # pinned
        elif i % 10 == 6 or 100 <= i < 140:  # a version not served: a burst of them is joined, refused, resent one by one
            request = search_request(codes=codes[:1], k=5, model_version="7")
        elif i % 3 == 0:
            request = search_request(codes=codes[i % 40 : i % 40 + 1 + i % 2], k=4 + i % 2)
        else:
            request = search_request(features=vectors[i % 200 : i % 200 + 1 + i % 3], k=5)
        raw = request.SerializeToString()
        if i % 30 in (15, 25):  # codes without k, and a k = 5 that the service refuses as malformed: never joined
            raw = search_request(codes=codes[i % 40 : i % 40 + 1], k=0).SerializeToString() + (OUT_OF_RANGE_FIELD if i % 30 == 15 else OVERLONG_K)
        if i % 50 == 49:  # truncated bytes
            raw = raw[:-3]
        requests.append(raw)
    return requests


def test_joined_searches_answer_each_caller_as_the_service_does(versions, plain, fronted):
    process, address = fronted
    requests = _mix(versions["vectors"])
    direct_channel, direct = _raw(plain)
    front_channel, through = _raw(address)
    with direct_channel, front_channel:
        want = [_outcome(direct, request) for request in requests]
        with ThreadPoolExecutor(24) as pool:
            got = list(pool.map(lambda request: _outcome(through, request), requests))
    for request, (want_code, want_answer), (code, answer) in zip(requests, want, got, strict=True):
        assert code == want_code, request
        assert answer == want_answer  # the same messages: model version, every row's ids and distances, or the same error
    assert 150 < sum(code == "ok" for code, _ in got) < 300  # both kinds of outcome are there
    stop_cli(process)
    log = "".join(process.log)
    joined, calls, resent = (int(x) for x in re.search(r"(\d+) of them joined into (\d+) calls, (\d+) resent", log).groups())
    assert calls > 0 and joined > calls, log  # some calls carried several callers' rows
    assert resent > 0, log  # and a joined call holding a refused request was resent one by one


def test_joining_keeps_the_services_batch_limit(versions):
    process, address = serve(versions, "--front", "compiled", "--max-batch", "2")
    vectors = versions["vectors"]
    requests = [search_request(features=vectors[i : i + 1], k=5).SerializeToString() for i in range(200)]
    channel, through = _raw(address)
    with channel, ThreadPoolExecutor(24) as pool:
        assert set(pool.map(lambda request: _outcome(through, request)[0], requests)) == {"ok"}
    stop_cli(process)
    log = "".join(process.log)
    joined, calls, resent = (int(x) for x in re.search(r"(\d+) of them joined into (\d+) calls, (\d+) resent", log).groups())
    assert joined == 2 * calls and resent == 0, log  # pairs, never more: the service refused none


def _status(channel):
    return channel.unary_unary("/tfhash.serving.HashSearch/GetStatus", response_deserializer=search_pb2.StatusResponse.FromString)


def test_other_calls_go_through(versions, plain, fronted):
    _, address = fronted
    vectors = versions["vectors"]
    with grpc.insecure_channel(address) as channel, grpc.insecure_channel(plain) as direct:
        status, want = _status(channel)(b"", timeout=30), _status(direct)(b"", timeout=30)
        assert (status.ready, list(status.process_versions), status.processes) == (want.ready, list(want.process_versions), 1)
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=30).status == health_pb2.HealthCheckResponse.SERVING
        stream = health.Watch(health_pb2.HealthCheckRequest(), timeout=30)
        assert next(iter(stream)).status == health_pb2.HealthCheckResponse.SERVING  # the service's own stream, relayed
        stream.cancel()
        with pytest.raises(grpc.RpcError) as refused:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=30)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        through, search = _search(channel), _search(direct)
        padded = search_request(features=vectors[:1], k=3).SerializeToString() + b"\xfa\x3f" + _varint(5 << 20) + bytes(5 << 20)
        too_large = search_request(features=vectors[:1], k=3).SerializeToString() + b"\xfa\x3f" + _varint(9 << 20) + bytes(9 << 20)
        for request in (search_request(examples=[b"not an example"], k=3), search_pb2.SearchRequest(k=3),
                        search_request(codes=np.ones((1, 16), np.int8), k=3)):  # fmt: skip
            assert _outcome(through, request.SerializeToString()) == _outcome(search, request.SerializeToString())
        # 5 MB (an unknown field): above gRPC's default 4 MB, within the service's 8 MB; 9 MB: refused alike
        assert _outcome(through, padded) == _outcome(search, padded) and _outcome(through, padded)[0] == "ok"
        assert _outcome(through, too_large)[0] == _outcome(search, too_large)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.RpcError) as refused:
            channel.unary_unary("/tfhash.serving.HashSearch/NoSuchMethod")(b"", timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


class SlowService:
    """A stand-in for the serving processes behind a front started by hand, where the real ones
    answer too fast to hold a call: Search answers after ``delay`` seconds, each row's one id the
    row's first feature, and records each call's rows and the time its caller left it; the
    standard health service says SERVING."""

    def __init__(self, delay: float):
        from concurrent.futures import ThreadPoolExecutor

        from grpc_health.v1 import health

        self.delay, self.calls = delay, []
        self.server = grpc.server(ThreadPoolExecutor(8))
        handler = grpc.method_handlers_generic_handler("tfhash.serving.HashSearch", {"Search": grpc.unary_unary_rpc_method_handler(self.search)})
        self.server.add_generic_rpc_handlers((handler,))
        self.health = health.HealthServicer()
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def search(self, raw: bytes, context) -> bytes:
        request = search_pb2.SearchRequest.FromString(raw)
        firsts = np.asarray(request.features.values, np.float32).reshape(list(request.features.shape))[:, 0]
        self.calls.append((firsts.astype(int).tolist(), context.time_remaining()))
        time.sleep(self.delay)
        return search_pb2.SearchResponse(model_version="1", results=[search_pb2.Neighbors(ids=[int(f)]) for f in firsts]).SerializeToString()


@pytest.fixture
def by_hand():
    """The compiled front started by hand before a :class:`SlowService` (1 request in flight)."""
    from tfhash.serving.processes import FRONT_READY, FRONT_START_SECONDS, read_until, reserve_port

    backend = SlowService(delay=2.0)
    public = reserve_port("127.0.0.1", 0)
    address = f"127.0.0.1:{public.getsockname()[1]}"
    binary = native.build(os.path.join(native.HERE, "compiled_front.cc"))
    front = subprocess.Popen([binary, address, backend.address, "1", "64", "1", "256", str(8 << 20), "10", "0"], stderr=subprocess.PIPE, text=True)
    log, started = read_until(front, FRONT_READY, FRONT_START_SECONDS)
    assert started, f"the front did not start: {''.join(log)}"
    yield backend, address, front
    if front.poll() is None:
        front.kill()
    front.wait(30)
    backend.server.stop(0)
    public.close()


def _features(first: float) -> bytes:
    vector = np.zeros((1, 4), np.float32)
    vector[0, 0] = first
    return search_request(features=vector, k=5).SerializeToString()


def test_callers_keep_their_deadlines_and_a_late_one_is_never_sent(by_hand):
    backend, address, front = by_hand
    channel, through = _raw(address)
    with channel, ThreadPoolExecutor(4) as pool:
        first = pool.submit(_outcome, through, _features(1), 10.0)  # holds the one request in flight for 2 s
        assert wait_for(lambda: backend.calls, 5)
        short = pool.submit(_outcome, through, _features(3), 6.0)
        late = pool.submit(_outcome, through, _features(2), 0.4)  # its deadline passes while it waits (between the others)
        long = pool.submit(_outcome, through, _features(4), 10.0)
        assert first.result()[0] == "ok" and [r.ids[0] for r in first.result()[1].results] == [1]
        assert late.result()[0] == grpc.StatusCode.DEADLINE_EXCEEDED
        for outcome, own in ((short.result(), 3), (long.result(), 4)):  # joined, each with its own row
            assert outcome[0] == "ok" and [r.ids[0] for r in outcome[1].results] == [own]
    rows = [sorted(call[0]) for call in backend.calls]
    assert rows == [[1], [3, 4]]  # the late request never reached the service
    assert 7.0 < backend.calls[1][1] <= 10.0  # the joined request carried its latest caller's deadline (short's: < 4.5)
    front.terminate()
    assert front.wait(30) == 0
    assert "1 never sent" in front.stderr.read()


def test_health_while_the_front_drains(by_hand):
    backend, address, front = by_hand
    name = health_pb2.HealthCheckResponse.ServingStatus.Name
    channel, through = _raw(address)
    with channel, ThreadPoolExecutor(2) as pool:
        health = health_pb2_grpc.HealthStub(channel)
        before = health.Watch(health_pb2.HealthCheckRequest(), timeout=30)
        assert name(next(before).status) == "SERVING"
        held = pool.submit(_outcome, through, _features(7), 10.0)  # holds the drain open for about 2 s
        assert wait_for(lambda: backend.calls, 5)
        front.send_signal(signal.SIGTERM)
        assert wait_for(lambda: name(health.Check(health_pb2.HealthCheckRequest(), timeout=5).status) == "NOT_SERVING", 1)
        with pytest.raises(grpc.RpcError) as unknown:  # another name: the service's own answer
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert [name(r.status) for r in health.Watch(health_pb2.HealthCheckRequest(), timeout=5)] == ["NOT_SERVING"]  # then OK
        assert [name(r.status) for r in before] == ["NOT_SERVING"]  # the open stream said it too, then ended OK
        assert _outcome(through, _features(8), 5.0)[0] == grpc.StatusCode.UNAVAILABLE  # new searches are refused
        assert held.result()[0] == "ok"  # what it held was answered
    assert front.wait(30) == 0 and [call[0] for call in backend.calls] == [[7]]


def test_a_dead_front_or_process_is_restarted_and_shares_the_work(versions):
    process, address = serve(versions, "--front", "compiled", "--processes", "2")
    try:
        front = front_of(process)
        front.kill()
        front.wait(30)
        channel, through = _raw(address)
        request = search_request(features=versions["vectors"][:2], k=5).SerializeToString()
        with channel:
            assert wait_for(lambda: _outcome(through, request)[0] == "ok", 30)
            assert front_of(process).pid != front.pid and "the compiled front" in "".join(process.log)
            kids = serving_processes(process)
            kids[0].kill()  # a serving process: the other answers meanwhile (a call it could not take goes to the other)
            kids[0].wait(30)
            with ThreadPoolExecutor(8) as pool:
                def answered_by_both() -> bool:
                    assert set(pool.map(lambda _: _outcome(through, request)[0], range(64))) == {"ok"}
                    return all(_front_connections(kid) > 0 for kid in serving_processes(process))

                answered_by_both()  # the other process answers meanwhile
                # restarted on its own port, it gets its share again once the front has reconnected
                # (a backoff of 0.1-1 s, so it may take a few rounds of load after the process serves)
                assert wait_for(lambda: _status(channel)(b"", timeout=10).processes_ready == 2, 120)
                assert wait_for(answered_by_both, 30)
        stop_cli(process)
    finally:
        if process.poll() is None:
            process.kill()


def serving_processes(process) -> list[psutil.Process]:
    return [p for p in psutil.Process(process.pid).children() if not p.name().startswith("compiled_front")]


def _front_connections(kid: psutil.Process) -> int:
    """The front's connections that ``kid`` accepted (a serving process with in-process encoding
    opens none of its own)."""
    try:
        return sum(1 for c in kid.net_connections("tcp") if c.status == psutil.CONN_ESTABLISHED)
    except psutil.Error:
        return 0


def test_sigterm_ends_the_health_stream_and_answers_what_was_sent(versions, fronted):
    process, address = fronted
    request = search_request(features=versions["vectors"][:4], k=5).SerializeToString()
    statuses, outcomes, stop = [], [], threading.Event()

    def watch():
        with grpc.insecure_channel(address) as channel:
            for response in health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=60):
                statuses.append(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))
            statuses.append("ended OK")

    def load():
        channel, through = _raw(address)
        with channel:
            while not stop.is_set():
                started = time.monotonic()
                outcomes.append((started, _outcome(through, request)[0], time.monotonic()))

    threads = [threading.Thread(target=watch), *(threading.Thread(target=load) for _ in range(8))]
    for thread in threads:
        thread.start()
    assert wait_for(lambda: len(outcomes) > 50 and statuses, 30)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    stop.set()
    for thread in threads:
        thread.join(30)
    assert statuses[0] == "SERVING" and statuses[-2:] == ["NOT_SERVING", "ended OK"]
    before = [code for started, code, _ in outcomes if started < signalled]  # answered, those in flight at the signal too
    after = collections.Counter(code for started, code, _ in outcomes if started >= signalled)
    assert set(before) == {"ok"}
    # then refused UNAVAILABLE (retryable), as the service refuses while it drains; a few that race the
    # server's final stop are CANCELLED, as with the Python front; never a wrong answer, never another error
    assert set(after) <= {"ok", grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
    assert after[grpc.StatusCode.UNAVAILABLE] > 10 * after[grpc.StatusCode.CANCELLED]


def test_without_a_compiler_the_front_fails_with_what_to_install(versions, tmp_path):
    env = {**os.environ, "PATH": str(tmp_path), "TFHASH_CACHE_DIR": str(tmp_path / "cache"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-m", "tfhash.cli", "serve", "search", "--model-base-dir", versions["models"],
                           "--index-base-dir", versions["indexes"], "--port", "0", "--front", "compiled"],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode != 0 and "g++" in done.stderr and "apt-get install g++ pkg-config libgrpc++-dev" in done.stderr
