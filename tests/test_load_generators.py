"""The serving benchmark's load generators (benchmarks/serving.py): the Python one and the compiled
one (benchmarks/loadgen.cc) drive a real search service over gRPC on loopback, count what it
answered, and stop with a clear error on a wrong answer or an unreachable service."""

from __future__ import annotations

import numpy as np
import psutil
import pytest
from tfhash.serving.search_client import search_request
from tfhash.serving.search_service import SearchServer, in_process_searcher

from benchmarks import native
from benchmarks.serving import K, check_answers, run_level
from tests.serving_fixtures import database, push_version
from tfhash.index import load_index

pytestmark = [pytest.mark.server, pytest.mark.process]  # a search service in this process; the generators' own processes
GENERATORS = ["python", pytest.param("cpp", marks=pytest.mark.skipif(native.missing() is not None, reason=f"{native.missing()}"))]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("load")
    vectors, ids = database()
    push_version(str(root / "models"), str(root / "indexes"), 1, 0, vectors, ids)
    server = SearchServer(in_process_searcher(str(root / "models"), str(root / "indexes"))).start()
    server.index_dir = str(root / "indexes" / "1" / "BFlat")
    yield server, vectors
    server.stop(0)


def test_the_benchmark_checks_answers_against_the_library(service):
    server, _ = service
    index = load_index(server.index_dir)
    codes = np.random.default_rng(0).integers(0, 256, (20, index.bits // 8), dtype=np.uint8)
    requests = [search_request(codes=code[None], k=K).SerializeToString() for code in codes]
    check_answers(server.address, requests, index.search(codes, K))
    wrong = index.search(codes[::-1], K)  # each request checked against another row's answer
    with pytest.raises(RuntimeError, match="answered request 0 with ids"):
        check_answers(server.address, requests, wrong)


@pytest.mark.parametrize("generator", GENERATORS)
def test_a_load_generator_counts_real_answers(service, generator):
    server, vectors = service
    requests = [search_request(features=vectors[i : i + 1], k=K).SerializeToString() for i in range(20)]
    row = run_level(server.address, 3, 0.5, requests, processes=2, generator=generator)
    assert row["load_generator"] == generator and row["clients"] == 3 and row["errors"] == 0
    assert row["requests"] > 0 and row["qps"] == pytest.approx(row["requests"] / 0.5)
    assert 0 < row["p50_ms"] <= row["p99_ms"]


@pytest.mark.parametrize("generator", GENERATORS)
def test_the_connections_are_counted_on_the_server_side(service, generator):
    server, vectors = service  # served by this process: the generators' own ends are not counted
    requests = [search_request(features=vectors[:1], k=K).SerializeToString()]
    row = run_level(server.address, 3, 0.5, requests, server=psutil.Process(), generator=generator)
    assert row["connections"] == "3" and row["server_cpu_ms_per_request"] > 0 and row["requests"] > 0


@pytest.mark.parametrize("generator", GENERATORS)
def test_a_load_generator_refuses_wrong_answers(service, generator):
    server, vectors = service
    requests = [search_request(features=vectors[:1], k=K - 1).SerializeToString()]  # answers of K - 1 ids, not K
    with pytest.raises(RuntimeError, match="unexpected answer"):
        run_level(server.address, 2, 0.2, requests, generator=generator)


@pytest.mark.parametrize("generator", GENERATORS)
def test_a_load_generator_fails_loudly_without_a_service(service, generator):
    _, vectors = service
    requests = [search_request(features=vectors[:1], k=K).SerializeToString()]
    with pytest.raises(RuntimeError, match="failed to start|load process failed"):
        run_level("localhost:1", 2, 0.2, requests, generator=generator)
