"""The serving benchmark's load generators (benchmarks/serving.py): the Python one and the compiled
one (benchmarks/loadgen.cc) drive a real search service over gRPC on loopback, count what it
answered, and stop with a clear error on a wrong answer or an unreachable service."""

from __future__ import annotations

import psutil
import pytest
from tfhash.serving.search_client import search_request
from tfhash.serving.search_service import SearchServer, in_process_searcher

from benchmarks.serving import K, grpc_cpp_missing, run_level
from tests.serving_fixtures import database, push_version

GENERATORS = ["python", pytest.param("cpp", marks=pytest.mark.skipif(grpc_cpp_missing(), reason="no g++ / pkg-config / libgrpc++-dev"))]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("load")
    vectors, ids = database()
    push_version(str(root / "models"), str(root / "indexes"), 1, 0, vectors, ids)
    server = SearchServer(in_process_searcher(str(root / "models"), str(root / "indexes"))).start()
    yield server, vectors
    server.stop(0)


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
