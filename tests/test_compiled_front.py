"""The compiled fronts measured by the serving benchmark (benchmarks/compiled_front.cc), over gRPC on
loopback. ``serve`` (``--fronts compiled``) answers packed-code searches exactly as the library's
flat index does (ids, distances, ties in insertion order, several rows, codes wider than 64 bits)
and refuses what it does not serve with a clear status instead of a wrong answer. ``coalesce``
(``--fronts compiled-coalescing``), before a real search service, answers every caller exactly as
the service answers it alone, joined with other callers' rows or not, refused requests included."""

from __future__ import annotations

import re

import grpc
import numpy as np
import pytest
from tfhash.serving import search_pb2
from tfhash.serving.search_client import search_request

from benchmarks.serving import (
    SEARCH_METHOD,
    check_answers,
    grpc_cpp_missing,
    start_coalescing_front,
    start_compiled_front,
)
from tfhash.index import index_factory

pytestmark = pytest.mark.skipif(grpc_cpp_missing(), reason="no g++ / pkg-config / libgrpc++-dev")


def _front(tmp_path, bits: int, count: int, seed: int, kind: str = "BFlat"):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, (count, bits // 8), dtype=np.uint8)
    codes[count // 2 :: 7] = codes[3]  # exact ties with an early item, and one another
    codes[:, : bits // 16] &= 0x0F  # nearby codes: many equal distances
    index = index_factory(bits, kind)
    index.add(codes, ids=rng.permutation(10 * count)[:count])  # external ids in no order
    directory = str(tmp_path / "1" / kind)
    index.save(directory, model_version="1")
    return index, codes, directory


@pytest.fixture
def served(tmp_path):
    fronts, channels = [], []

    def start(bits: int, count: int, seed: int = 0):
        index, codes, directory = _front(tmp_path / str(len(fronts)), bits, count, seed)
        (process,), address = start_compiled_front(directory)
        fronts.append(process)
        channel, call = _search(address)
        channels.append(channel)
        return index, codes, address, call

    yield start
    for channel in channels:
        channel.close()
    for process in fronts:
        process.terminate()
        assert process.wait(30) == 0  # SIGTERM stops it cleanly


def _search(address: str):
    channel = grpc.insecure_channel(address)
    return channel, channel.unary_unary(SEARCH_METHOD, request_serializer=search_pb2.SearchRequest.SerializeToString,
                                         response_deserializer=search_pb2.SearchResponse.FromString)  # fmt: skip


@pytest.mark.parametrize(("bits", "count"), [(64, 5000), (128, 3001), (256, 700), (512, 1500)])
def test_it_answers_as_the_library_flat_index(served, bits, count):
    index, codes, _, call = served(bits, count, seed=bits)
    rng = np.random.default_rng(1)
    queries = np.concatenate([codes[[3, 10, count - 1]], rng.integers(0, 256, (5, bits // 8), dtype=np.uint8)])
    for k in (1, 10, 64, min(count, 1000)):  # 1000: the limit the front shares with the service
        want = index.search(queries, k)
        found = call(search_request(codes=queries, k=k), timeout=30)  # several rows in one request
        assert found.model_version == "1" and found.index_kind == index.format_tag and found.exact
        assert len(found.results) == len(queries)
        for row, neighbours in enumerate(found.results):
            np.testing.assert_array_equal(neighbours.ids, want.ids[row])
            np.testing.assert_array_equal(neighbours.distances, want.distances[row])


def test_distances_of_256_bits_and_more_are_exact(served):
    index, codes, _, call = served(512, 50)
    far = np.bitwise_not(codes[7])  # 512 bits from codes[7]
    for k in (1, 50):
        want = index.search(far[None], k)
        found = call(search_request(codes=far[None], k=k), timeout=30).results[0]
        np.testing.assert_array_equal(found.ids, want.ids[0])
        np.testing.assert_array_equal(found.distances, want.distances[0])
    assert found.distances[-1] == 512


def test_the_benchmark_checks_a_front_against_the_library(served):
    index, codes, address, _ = served(64, 2000)
    requests = [search_request(codes=code[None], k=10).SerializeToString() for code in codes[:20]]
    check_answers(address, requests, index.search(codes[:20], 10))
    wrong = index.search(codes[1:21], 10)  # each request checked against another row's answer
    with pytest.raises(RuntimeError, match="answered request 0 with ids"):
        check_answers(address, requests, wrong)


@pytest.mark.parametrize(
    ("request_of", "code", "words"),
    [
        (lambda codes: search_request(codes=codes[:1], k=0), grpc.StatusCode.INVALID_ARGUMENT, "k must be in"),
        (lambda codes: search_request(codes=codes[:1], k=len(codes) + 1), grpc.StatusCode.INVALID_ARGUMENT, "k must be in"),
        (lambda codes: search_request(codes=np.repeat(codes[:1], 257, axis=0), k=3), grpc.StatusCode.INVALID_ARGUMENT, "1 to 256 rows"),
        (lambda codes: search_request(codes=np.zeros((1, 16), np.uint8), k=3), grpc.StatusCode.INVALID_ARGUMENT, "128; the index holds 64"),
        (lambda codes: search_pb2.SearchRequest(codes=search_pb2.Codes(bits=64, packed=b"\x01" * 12), k=3), grpc.StatusCode.INVALID_ARGUMENT,
         "rows of 8 bytes"),  # fmt: skip
        (lambda codes: search_request(codes=codes[:1], k=3, model_version="2"), grpc.StatusCode.NOT_FOUND, "version 2"),
        (lambda codes: search_request(features=np.zeros((1, 4), np.float32), k=3), grpc.StatusCode.UNIMPLEMENTED, "packed codes"),
        (lambda codes: search_request(codes=codes[:1], k=3, radius=4), grpc.StatusCode.UNIMPLEMENTED, "packed codes"),
        (lambda codes: search_pb2.SearchRequest(k=3), grpc.StatusCode.UNIMPLEMENTED, "packed codes"),
    ],
)
def test_it_refuses_what_it_does_not_serve(served, request_of, code, words):
    _, codes, _, call = served(64, 100)
    with pytest.raises(grpc.RpcError) as refused:
        call(request_of(codes), timeout=30)
    assert refused.value.code() == code and words in refused.value.details()


# protobuf reads a tag as a 32-bit varint of at most 5 bytes: field number 2**32 + 4 (4, k, if cut to 32 bits) holding 5,
# and k's tag written in 6 bytes, holding 5, are malformed
OUT_OF_RANGE_FIELD = bytes([0xA0, 0x80, 0x80, 0x80, 0x80, 0x01, 0x05])
OVERLONG_K = bytes([0xA0, 0x80, 0x80, 0x80, 0x80, 0x00, 0x05])


# a truncated varint, sub-message and length; a sub-message's length written in 6 bytes; the two above
@pytest.mark.parametrize("raw", [b"\xff\xff\xff", b"\x1a\x05\x08", b"\x22\x01", b"\x1a\x86\x80\x80\x80\x00\x08\x40",
                                 OUT_OF_RANGE_FIELD, OVERLONG_K])  # fmt: skip
def test_malformed_bytes_are_refused(served, raw):
    _, _, address, _ = served(64, 100)
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as refused:
        channel.unary_unary(SEARCH_METHOD)(raw, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_other_methods_are_unimplemented(served):
    _, _, address, _ = served(64, 100)
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as refused:
        channel.unary_unary("/tfhash.serving.HashSearch/GetStatus")(b"", timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_it_serves_exact_binary_indexes_only(tmp_path):
    _, _, directory = _front(tmp_path, 64, 2000, 0, kind="BIVF16")
    with pytest.raises(ValueError, match="exact binary"):
        start_compiled_front(directory)


# ---- the coalescing front, before a real search service ----


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from tfhash.serving.search_service import SearchServer, in_process_searcher

    from tests.serving_fixtures import database, push_version

    root = tmp_path_factory.mktemp("coalescing")
    vectors, _ = database()
    push_version(str(root / "models"), str(root / "indexes"), 1, 0, *database())
    server = SearchServer(in_process_searcher(str(root / "models"), str(root / "indexes"))).start()
    yield server, vectors
    server.stop(0)


@pytest.fixture
def coalescing(service):
    server, vectors = service
    (front,), address = start_coalescing_front(server.address, processes=1)
    yield server, vectors, address, front
    if front.poll() is None:
        front.terminate()
        front.wait(30)


def _raw(address: str):
    """A channel to ``address`` and its Search call on bytes (answers parsed)."""
    channel = grpc.insecure_channel(address)
    return channel, channel.unary_unary(SEARCH_METHOD, response_deserializer=search_pb2.SearchResponse.FromString)


def _outcome(call, request: bytes):
    try:
        return "ok", call(request, timeout=30)
    except grpc.RpcError as err:
        return err.code(), err.details()


def _mix(vectors) -> list[bytes]:
    """Search requests in every joinable form, and some that are not joinable or are refused."""
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
        elif i % 10 == 6:
            request = search_request(codes=codes[:1], k=5, model_version="7")  # a version not served
        elif i % 3 == 0:
            request = search_request(codes=codes[i % 40 : i % 40 + 1 + i % 2], k=4 + i % 2)
        else:
            request = search_request(features=vectors[i % 200 : i % 200 + 1 + i % 3], k=5)
        raw = request.SerializeToString()
        if i % 30 in (15, 25):  # codes without k, and a k = 5 that the service refuses as malformed: never joined
            raw = search_request(codes=codes[i % 40 : i % 40 + 1], k=0).SerializeToString() + (OUT_OF_RANGE_FIELD if i % 30 == 15 else OVERLONG_K)
        requests.append(raw)
    return requests


def test_joined_searches_answer_each_caller_as_the_service_does(coalescing):
    from concurrent.futures import ThreadPoolExecutor

    server, vectors, address, front = coalescing
    requests = _mix(vectors)
    direct_channel, direct = _raw(server.address)
    front_channel, through = _raw(address)
    with direct_channel, front_channel:
        want = [_outcome(direct, request) for request in requests]
        with ThreadPoolExecutor(24) as pool:
            got = list(pool.map(lambda request: _outcome(through, request), requests))
    for request, (want_code, want_answer), (code, answer) in zip(requests, want, got, strict=True):
        assert code == want_code, request
        assert answer == want_answer  # the same messages: model version, every row's ids and distances, or the same error
    assert 150 < sum(code == "ok" for code, _ in got) < 300  # both kinds of outcome are there
    front.terminate()
    assert front.wait(30) == 0
    front.drain.join(30)
    summary = "".join(front.log)
    joined, calls, resent = (int(x) for x in re.search(r"(\d+) of them joined into (\d+) calls, (\d+) resent", summary).groups())
    assert calls > 0 and joined > calls, summary  # some calls carried several callers' rows
    assert resent > 0, summary  # and a joined call holding a refused request was resent one by one


def test_other_calls_pass_through(coalescing):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    server, vectors, address, _ = coalescing
    with grpc.insecure_channel(address) as channel, grpc.insecure_channel(server.address) as direct:
        status = channel.unary_unary("/tfhash.serving.HashSearch/GetStatus", response_deserializer=search_pb2.StatusResponse.FromString)
        want = direct.unary_unary("/tfhash.serving.HashSearch/GetStatus", response_deserializer=search_pb2.StatusResponse.FromString)
        assert status(search_pb2.StatusRequest().SerializeToString(), timeout=30) == want(b"", timeout=30)
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=30).status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as refused:
            next(iter(health.Watch(health_pb2.HealthCheckRequest(), timeout=30)))
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        through = channel.unary_unary(SEARCH_METHOD, response_deserializer=search_pb2.SearchResponse.FromString)
        search = direct.unary_unary(SEARCH_METHOD, response_deserializer=search_pb2.SearchResponse.FromString)
        padded = search_request(features=vectors[:1], k=3).SerializeToString() + b"\xfa\x3f" + _varint(5 << 20) + bytes(5 << 20)
        for request in (search_request(examples=[b"not an example"], k=3), search_pb2.SearchRequest(k=3),
                        search_request(codes=np.ones((1, 16), np.int8), k=3)):  # fmt: skip
            assert _outcome(through, request.SerializeToString()) == _outcome(search, request.SerializeToString())
        # 5 MB (an unknown field): above gRPC's default 4 MB, within the service's limit; the front passes it on
        assert _outcome(through, padded) == _outcome(search, padded)
        assert _outcome(through, padded)[0] == "ok"


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))
