"""``tfhash serve search --processes N``: several processes on one port, each a real CLI child
process over real gRPC and HTTP on loopback; and the mapped flat index they share."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time

import grpc
import numpy as np
import psutil
import pytest
from tfhash.serving import search_pb2, search_pb2_grpc
from tfhash.serving.errors import ServingError
from tfhash.serving.processes import start_command
from tfhash.serving.search_client import SearchClient
from tfhash.serving.shared_status import SharedStatus, common_version, withdraw

from tests.serving_fixtures import (
    cli_rest_port,
    database,
    push_version,
    reference,
    stop_cli,
    wait_for,
)
from tests.tiers import starts
from tfhash.index import index_factory, load_index
from tfhash.index.persistence import verify_files


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    root = tmp_path_factory.mktemp("processes")
    vectors, ids = database()
    model_dir, index_dir = push_version(str(root / "models"), str(root / "indexes"), 1, 0, vectors, ids)
    return {"root": root, "models": str(root / "models"), "indexes": str(root / "indexes"), "vectors": vectors, "ids": ids,
            "model_dir": model_dir, "index_dir": index_dir}  # fmt: skip


def serve(versions, *extra: str):
    """``tfhash serve search`` over the fixture's versions; returns (process, gRPC address, REST port)."""
    process, address = start_command(["serve", "search", "--model-base-dir", versions["models"], "--index-base-dir", versions["indexes"],
                                  "--port", "0", "--poll-seconds", "0.3", *extra], "search service on ")  # fmt: skip
    return process, address


def status(address: str, attempts: int = 5) -> search_pb2.StatusResponse:
    """GetStatus on a new connection, asked again (up to ``attempts`` times) when it is reset.

    Right after a process is killed, a connection the kernel had queued on its socket but that it
    never accepted is reset (UNAVAILABLE, "Connection reset by peer"); a client asks again, and the
    next connection goes to a living process. ``wait_for_ready`` covers only a refused connect."""
    for _ in range(attempts - 1):
        try:
            return _status_once(address)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
        time.sleep(0.1)
    return _status_once(address)


def _status_once(address: str) -> search_pb2.StatusResponse:
    with grpc.insecure_channel(address) as channel:
        return search_pb2_grpc.HashSearchStub(channel).GetStatus(search_pb2.StatusRequest(), timeout=10, wait_for_ready=True)


def children(process) -> list[psutil.Process]:
    return psutil.Process(process.pid).children()


@pytest.fixture(scope="module")
@starts("process")
def two_processes(versions):
    """``tfhash serve search --processes 2 --rest-port 0``, for the tests that only ask it; every
    serving process is gone once it stopped."""
    process, address = serve(versions, "--processes", "2", "--rest-port", "0")
    kids = children(process)
    yield process, address, kids
    stop_cli(process)
    assert not any(kid.is_running() and kid.status() != psutil.STATUS_ZOMBIE for kid in kids)


def test_processes_share_the_port_answer_alike_and_report_every_process(versions, two_processes):
    process, address, kids = two_processes
    assert len(kids) == 2
    port = int(address.rsplit(":", 1)[1])
    assert wait_for(lambda: status(address).processes_ready == 2)
    state = status(address)
    assert state.ready and state.processes == 2 and list(state.process_versions) == ["1", "1"]
    _, expected = reference(versions["model_dir"], versions["index_dir"], versions["vectors"][:4], 5)
    clients = [SearchClient(address, own_connection=True) for _ in range(16)]  # the kernel spreads connections
    try:
        for client in clients:
            answer = client.search(features=versions["vectors"][:4], k=5)
            assert answer.model_version == "1"
            np.testing.assert_array_equal(np.stack(answer.ids), expected.ids)
            # health follows the other processes within a poll (GetStatus reads them at once)
            assert wait_for(lambda c=client: c.health() == "SERVING", 10)

        def connections(kid):
            return sum(1 for c in kid.net_connections("tcp") if c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)

        assert all(connections(kid) > 0 for kid in kids)  # both processes accepted connections
    finally:
        for client in clients:
            client.close()


def get(port: int, path: str) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_rest_port_is_shared_and_reports_every_process(versions, two_processes):
    process, _, _ = two_processes
    port = cli_rest_port(process)
    assert wait_for(lambda: get(port, "/readyz")[0] == 200)
    for _ in range(8):  # a connection each: the children accept from the one listening socket
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("POST", "/v1/search", body=json.dumps({"features": versions["vectors"][:1].tolist(), "k": 3}),
                           headers={"Content-Type": "application/json"})  # fmt: skip
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["model_version"] == "1"
        connection.close()
    code, body = get(port, "/v1/status")
    assert code == 200 and body["processes"] == 2 and body["processes_ready"] == 2 and body["process_versions"] == ["1", "1"]


@pytest.mark.process
def test_a_dead_process_is_restarted_and_readiness_follows_it(versions):
    process, address = serve(versions, "--processes", "2")
    try:
        assert wait_for(lambda: status(address).processes_ready == 2)
        victim = children(process)[0]
        victim.kill()
        # the service reports the missing process at once (the parent withdraws its status) ...
        assert wait_for(lambda: status(address).processes_ready < 2, 10)
        state = status(address)
        assert not state.ready
        with SearchClient(address) as client:  # ... while the other process still answers
            assert client.search(features=versions["vectors"][:2], k=3).model_version == "1"
            # health follows at the next look (--poll-seconds)
            assert wait_for(lambda: client.health() == "NOT_SERVING" or status(address).processes_ready == 2, 10)
        # ... and is whole again once the restarted one serves
        assert wait_for(lambda: status(address).processes_ready == 2)
        assert victim.pid not in [kid.pid for kid in children(process)] and len(children(process)) == 2
        with SearchClient(address) as client:
            assert wait_for(lambda: client.health() == "SERVING", 10)
    finally:
        stop_cli(process)


@pytest.mark.process
def test_processes_that_keep_dying_stop_the_service_loudly(versions):
    process, _ = serve(versions, "--processes", "2")
    killed = set()
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:
        for kid in children(process):
            if kid.pid not in killed:
                killed.add(kid.pid)
                kid.kill()
        time.sleep(0.05)
    assert process.wait(30) == 1  # more than 5 exits within 60 s
    assert len(killed) >= 6


@pytest.mark.process
def test_hot_swap_moves_every_process_together_and_no_answer_mixes_versions(versions, tmp_path):
    import shutil
    import threading

    models, indexes = str(tmp_path / "models"), str(tmp_path / "indexes")
    shutil.copytree(versions["models"], models)
    shutil.copytree(versions["indexes"], indexes)
    process, address = start_command(["serve", "search", "--model-base-dir", models, "--index-base-dir", indexes, "--port", "0",
                                  "--poll-seconds", "0.3", "--processes", "2"], "search service on ")  # fmt: skip
    queries = versions["vectors"][:4]
    answers, failures, done = [], [], threading.Event()

    def client_loop() -> None:
        with SearchClient(address, own_connection=True) as client:  # the kernel spreads the connections over both
            while not done.is_set():
                try:
                    started = time.monotonic()
                    answer = client.search(features=queries, k=5)
                    answers.append((started, time.monotonic(), answer.model_version, np.stack(answer.ids)))
                except Exception as err:  # noqa: BLE001 - every failure is counted
                    failures.append(repr(err))

    threads = [threading.Thread(target=client_loop) for _ in range(8)]
    try:
        for thread in threads:
            thread.start()
        push_version(models, indexes, 2, 1, versions["vectors"], versions["ids"])
        assert wait_for(lambda: list(status(address).process_versions) == ["2", "2"], 60)
        assert wait_for(lambda: sum(answer[2] == "2" for answer in answers) >= 20, 30)  # the load goes on under version 2
        done.set()
        for thread in threads:
            thread.join(30)
        expected = {v: reference(os.path.join(models, v), os.path.join(indexes, v, "BFlat"), queries, 5)[1].ids for v in ("1", "2")}
        assert failures == []
        assert {version for _, _, version, _ in answers} == {"1", "2"}
        for _, _, version, ids in answers:  # each answer is wholly the version it names
            np.testing.assert_array_equal(ids, expected[version])
        # the service switches as one: once any answer named version 2, no request that started
        # later (on either process) was answered by version 1
        first_new = min(end for _, end, version, _ in answers if version == "2")
        assert [start for start, _, version, _ in answers if version == "1" and start > first_new] == []
        with SearchClient(address) as client:
            assert client.search(features=queries, k=5).model_version == "2"
    finally:
        done.set()
        stop_cli(process)


def test_common_version_is_the_newest_every_known_process_holds():
    assert common_version([[1, 2], [2], [1, 2]]) == 2
    assert common_version([[1], [1, 2]]) == 1  # one process has not loaded 2 yet
    assert common_version([[1, 2], None]) == 2  # a process whose status is unknown or stale is left out
    assert common_version([[1], [2]]) == 0 and common_version([None]) == 0 and common_version([]) == 0


def test_siblings_agree_through_one_shared_cell(tmp_path):
    first, second = (SharedStatus(str(tmp_path), slot, 2, poll_seconds=0.5) for slot in (0, 1))
    assert first.agreed_version() == 0 and second.agreed_version() == 0
    ready = {"ready": True, "model_version": "1"}
    first.publish(ready, [1, 2])
    second.publish(ready, [1])
    assert first.agree() == 1 and second.agreed_version() == 1
    second.publish(ready, [1, 2])
    assert second.agree() == 2 and first.agreed_version() == 2  # one cell, mapped by both
    first.publish(ready, [2])
    second.publish(ready, [3])  # nothing in common: the agreement stays
    assert first.agree() == 2
    withdraw(str(tmp_path), 1)  # a process that exited is left out
    assert first.agree() == 2


def test_a_following_searcher_serves_a_newer_pair_only_once_agreed(versions, tmp_path):
    import shutil

    from tfhash.serving.search_service import in_process_searcher

    models, indexes = str(tmp_path / "models"), str(tmp_path / "indexes")
    shutil.copytree(versions["models"], models)
    shutil.copytree(versions["indexes"], indexes)
    agreed = {"version": 0}
    searcher = in_process_searcher(models, indexes)
    searcher.follow(lambda: agreed["version"])
    assert searcher.refresh() and searcher.pair_for().version == 1  # nothing served yet: the first pair serves at once
    push_version(models, indexes, 2, 1, versions["vectors"], versions["ids"])
    assert searcher.refresh() and searcher.held_versions() == [1, 2]
    assert searcher.pair_for().version == 1 and searcher.status()["model_version"] == "1"  # waits for the service
    with pytest.raises(ServingError):
        searcher.pair_for("2")
    agreed["version"] = 2
    assert searcher.pair_for("2").version == 2 and searcher.held_versions() == [2]
    # a withdrawn version is left at once, agreement or not
    push_version(models, indexes, 3, 2, versions["vectors"], versions["ids"])
    assert searcher.refresh() and searcher.held_versions() == [2, 3]
    shutil.rmtree(os.path.join(models, "2"))
    assert searcher.refresh() and searcher.pair_for().version == 3 and searcher.held_versions() == [3]


@pytest.mark.process
def test_a_port_in_use_is_refused_either_way(versions, two_processes):
    single, address = serve(versions)
    try:
        taken = address.rsplit(":", 1)[1]
        refused = subprocess.run([sys.executable, "-m", "tfhash.cli", "serve", "search", "--model-base-dir", versions["models"],
                                  "--index-base-dir", versions["indexes"], "--port", taken, "--processes", "2"],
                                 capture_output=True, text=True, timeout=120)  # fmt: skip
        assert refused.returncode == 1 and "Address already in use" in refused.stderr
    finally:
        stop_cli(single)
    taken = two_processes[1].rsplit(":", 1)[1]  # a port that several processes share
    refused = subprocess.run([sys.executable, "-m", "tfhash.cli", "serve", "search", "--model-base-dir", versions["models"],
                              "--index-base-dir", versions["indexes"], "--port", taken],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 1 and "cannot bind" in refused.stderr
    with pytest.raises(OSError):  # nor may any other socket bind it
        socket.create_server(("127.0.0.1", int(taken)))


@pytest.mark.process
def test_processes_need_a_numeric_address(versions):
    result = subprocess.run([sys.executable, "-m", "tfhash.cli", "serve", "search", "--model-base-dir", versions["models"],
                             "--index-base-dir", versions["indexes"], "--host", "localhost", "--processes", "2"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0 and "numeric bind address" in result.stderr


def test_a_mapped_flat_index_answers_alike_shares_its_files_and_copies_on_change(tmp_path):
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, (500, 8), dtype=np.uint8)
    index = index_factory(64, "BFlat")
    index.add(codes)
    path = str(tmp_path / "flat")
    index.save(path, model_version="1")
    mapped, loaded = load_index(path, mapped=True), load_index(path)
    assert isinstance(mapped._rows, np.memmap) and not isinstance(loaded._rows, np.memmap)
    queries = codes[:20] ^ 1
    for k in (1, 10):
        a, b = mapped.search(queries, k), loaded.search(queries, k)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.distances, b.distances)
    mapped.remove(mapped.ids()[:5])
    mapped.add(codes[:3])
    assert mapped.ntotal == 498
    verify_files(path, json.load(open(os.path.join(path, "manifest.json"))))  # the files did not change
    assert load_index(path, mapped=True).ntotal == 500
    for kind in ("BIVF4", "BMultiHash2"):  # types that copy on load take the flag and answer as before
        other = index_factory(64, kind)
        other.add(codes)
        other.save(str(tmp_path / kind), model_version="1")
        np.testing.assert_array_equal(load_index(str(tmp_path / kind), mapped=True).search(queries, 5).ids,
                                      load_index(str(tmp_path / kind)).search(queries, 5).ids)  # fmt: skip


def test_a_flat_index_whose_files_disagree_with_its_manifest_is_refused(tmp_path):
    from tfhash.index import IndexFormatError

    index = index_factory(64, "BFlat")
    index.add(np.zeros((4, 8), np.uint8))
    path = str(tmp_path / "flat")
    index.save(path, model_version="1")
    manifest = json.load(open(os.path.join(path, "manifest.json")))
    manifest["bits"] = 32  # a manifest edited by hand (checksums cover the data files only)
    with pytest.raises(IndexFormatError, match="uint8"):
        type(index).read_files(path, manifest)
