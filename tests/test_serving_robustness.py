"""Serving under hostile input and real deployments, on loopback: a bounded fuzz of
every front with an expected answer per request, hot swaps under load with broken and
non-atomically copied versions (in process and through the model server), the model server
withdrawing the paired version, SIGTERM under load, slow HTTP clients, the exported signature's
own input checks under ``saved_model_cli``, and the request checks themselves."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tfhash.serving.deployment import models_config, write_deployment
from tfhash.serving.errors import ServingError
from tfhash.serving.grpc_server import EXIT_SECONDS
from tfhash.serving.model_server import DevModelServer, tensor_value
from tfhash.serving.requests import (
    check_examples,
    json_numbers,
    json_object,
    require_complete_parse,
)
from tfhash.serving.search_client import SearchClient
from tfhash.serving.versions import Retries, tree_stamp

from tests.serving_fixtures import (
    DIM,
    database,
    export_version,
    graph_mode_outputs,
    vector_example,
    wait_for,
)
from tests.serving_fuzz import FAULTS, search_cases
from tests.serving_robustness import (
    copy_non_atomically,
    hot_swap_trial,
    largest_request,
    serving_stack,
    sigterm_trial,
)
from tests.serving_robustness import fuzz as run_fuzz
from tests.tiers import starts

POLL = 0.25


@pytest.fixture(scope="module")
@starts("server")
def stack(tmp_path_factory):
    with serving_stack(str(tmp_path_factory.mktemp("stack")), poll=POLL) as (target, servers):
        yield target, servers


def test_fuzz_every_front_answers_as_expected(stack):
    target, servers = stack
    tally = run_fuzz(target, 1500, seed=0, allowed_root=servers["models"])
    summary = tally.summary()
    assert summary["failures"] == {}, summary["failure_examples"][:10]
    labels = {key.split("/")[0] for key in summary["per_category"]}
    assert labels == {"in_process", "remote", "health", "rest", "rest-raw", "model-server"}
    assert all(f"in_process/{name}" in summary["per_category"] for name in search_cases(None, target))
    outcomes = {code for value in summary["per_category"].values() for code in value["outcomes"]}
    assert {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "PERMISSION_DENIED", "http-200", "http-400", "http-413",
            "http-415", "closed"} <= outcomes and not outcomes & FAULTS  # fmt: skip
    with SearchClient(target.search["in_process"]) as client:  # and the service still answers
        assert client.health() == "SERVING" and len(client.search(features=target.vectors[:1], k=3).ids[0]) == 3


@pytest.mark.process
@pytest.mark.server
def test_fuzz_through_two_processes_on_one_port(tmp_path):
    """Both search services as two serving processes on one port each (``--processes 2``, every
    request joined with the others of its kind that wait): the fuzz finds no failure."""
    with serving_stack(str(tmp_path), poll=POLL, processes=2) as (target, servers):
        summary = run_fuzz(target, 1500, seed=1, allowed_root=servers["models"]).summary()
    assert summary["failures"] == {}, summary["failure_examples"][:10]
    outcomes = {code for key, value in summary["per_category"].items() if key.split("/")[0] in ("in_process", "remote")
                for code in value["outcomes"]}  # fmt: skip
    assert {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED"} <= outcomes and not outcomes & FAULTS


def test_fuzz_oracle_sees_a_lenient_server():
    """The oracle is not vacuous: an answer of OK to a bad request, a fault and a hang are failures."""
    from tests.serving_fuzz import INVALID, OK, Tally

    tally = Tally()
    tally.record("x", "bad", INVALID, "OK")
    tally.record("x", "bad", INVALID, "INTERNAL")
    tally.record("x", "valid", OK, "INVALID_ARGUMENT")
    tally.record("x", "bad", INVALID, "hang")
    tally.record("x", "bad", INVALID, "NOT_FOUND")
    tally.record("x", "bad", INVALID, "INVALID_ARGUMENT")
    assert tally.failures == {"bad input answered OK": 1, "fault": 1, "valid request refused": 1, "hang": 1, "unexpected code": 1}


def test_search_status_names_no_paths(stack):
    target, _ = stack
    for address in target.search.values():
        with SearchClient(address) as client:
            status = client.status()
        assert status.ready and status.index_path == "1/BFlat" and "/" not in status.encoder


@pytest.mark.parametrize("mode, processes", [("in_process", 1), ("remote", 1), ("in_process", 2)])
@pytest.mark.process
@pytest.mark.server
def test_hot_swap_under_load_with_broken_and_non_atomic_pushes(tmp_path, mode, processes):
    """Broken versions 2 and 3 never disturb version 1; version 4, copied file by file, is served
    once complete and never before, and no valid request fails; also with two serving processes,
    which switch together. (How soon after the copy version 4 answers, in polls, is measured by
    ``python -m tests.serving_robustness``, not asserted here.)"""
    result = hot_swap_trial(str(tmp_path), mode, poll=POLL, processes=processes)
    assert result["failed"] == 0, result["failures"]
    assert result["stayed_on_1_while_broken"] and result["versions_answering"] == ["1", "4"]
    assert not result["flapped_back"] and result["inconsistent_answers"] == 0 and result["versions_differ"]
    assert result["v4_served_after_copy_s"] >= 0, result


@pytest.mark.server
def test_model_server_loads_a_version_copied_file_by_file(tmp_path):
    """A version whose saved_model.pb lands before its variables fails to load while they are
    incomplete (not fatal), and is loaded at a later poll once they are whole (TF Serving's latest
    policy here)."""
    staging, base = str(tmp_path / "staging"), str(tmp_path / "models")
    export_version(staging, 1, 0)
    export_version(base, 1, 0)
    server = DevModelServer(models_config([_latest(base)]), poll_seconds=0.2).start()
    try:
        export_version(staging, 2, 3)
        copy_non_atomically([(os.path.join(staging, "2"), os.path.join(base, "2"))], 0.5)
        assert wait_for(lambda: _available(server) == [2], 60)
    finally:
        server.stop(0)


def _latest(base: str):
    from tfhash.serving.deployment import model_config

    return model_config("vectors", base, num_versions=1)


def _available(server: DevModelServer) -> list[int]:
    from tensorflow_serving.apis import get_model_status_pb2, model_pb2

    try:
        return [s.version for s in server.registry.statuses(model_pb2.ModelSpec(name="vectors"))
                if s.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE]  # fmt: skip
    except ServingError:
        return []


@pytest.mark.server
def test_withdrawn_version_reports_not_serving_and_recovers(tmp_path):
    """The operator drops the paired version from models.config: the remote search service reports
    NOT_SERVING (health and GetStatus) instead of failing while it claims to serve; when the version
    comes back, the same pair serves again."""
    with serving_stack(str(tmp_path), poll=POLL) as (target, servers):
        config = servers["config"]
        pinned = open(config).read()
        with open(config + ".new", "w") as handle:
            handle.write(pinned.replace("versions: 1", "versions: 99"))
        os.replace(config + ".new", config)
        with SearchClient(target.search["remote"]) as client:
            assert wait_for(lambda: client.health() == "NOT_SERVING", 10)
            assert not client.status().ready
            with pytest.raises(ServingError) as err:
                client.search(features=target.vectors[:1], k=3)
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
            write_deployment(servers["models"], "vectors", os.path.dirname(config), index_base_dir=servers["indexes"])
            assert wait_for(lambda: client.health() == "SERVING", 10)
            assert client.search(features=target.vectors[:1], k=3).model_version == "1"


@pytest.mark.parametrize("kind, processes", [("search", 1), ("model", 1), ("search", 2)])
@pytest.mark.process
def test_sigterm_under_load_drains_and_exits(tmp_path, kind, processes):
    result = sigterm_trial(str(tmp_path), kind, grace=10.0, processes=processes)
    # exit code 0: drained and exited before the timer of run_until_signal (grace + EXIT_SECONDS,
    # exit code 1) fired; the interpreter's own exit takes seconds past the drain, more on busy cores
    assert result["exit_code"] == 0 and result["exit_after_s"] <= result["grace_s"] + EXIT_SECONDS, result
    assert result["answered_before"] > 0 and result["failed_before"] == 0
    assert set(result["in_flight_refused"]) <= {"UNAVAILABLE"}  # in flight: answered, or refused before it ran
    assert result["started_after_signal"] > 0 and result["answered_after_signal"] == 0
    assert result["health_stream_ended"] in (True, None)


STUCK_AT_EXIT = """
import threading
from tfhash.serving.grpc_server import run_until_signal

class Server:  # its stop leaves a thread that never ends: the interpreter cannot exit by itself
    def start(self):
        print("started", flush=True)
    def stop(self, grace):
        threading.Thread(target=threading.Event().wait).start()

run_until_signal(Server(), grace=0.5, exit_within=1.0)
"""


@pytest.mark.process
def test_a_process_that_cannot_exit_after_sigterm_is_ended_with_every_stack():
    process = subprocess.Popen([sys.executable, "-c", STUCK_AT_EXIT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "started"
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert 1.5 <= time.monotonic() - signalled < 30  # grace + exit_within, then ended
    assert "Timeout" in err and err.count("Thread 0x") >= 2 and "in _shutdown" in err  # every thread's stack: exit waits on one


def test_slow_http_clients_hold_no_threads_and_are_cut_off(stack):
    target, _ = stack
    before = threading.active_count()
    sockets = []
    for _ in range(50):
        sock = socket.create_connection(("127.0.0.1", target.rest_port))
        sock.sendall(b"POST /v1/search HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        sockets.append(sock)
    body = json.dumps({"features": target.vectors[:1].tolist(), "k": 3}).encode()
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", target.rest_port, timeout=5)
    connection.request("POST", "/v1/search", body=body, headers={"Content-Type": "application/json"})
    assert connection.getresponse().status == 200  # others are served meanwhile
    assert threading.active_count() <= before + 1
    for sock in sockets:
        sock.settimeout(target.rest_timeout + 30)  # the server closes each after its body timeout
        assert sock.recv(100) == b""
        sock.close()


@pytest.mark.process
def test_saved_model_cli_refuses_nan_and_out_of_range(tmp_path):
    """The exported signatures check their inputs themselves, so TF Serving refuses what tfhash
    refuses: ``saved_model_cli`` (TF Serving's loader, as a command) answers a good input and
    refuses a NaN; every other bad input is refused by the same graph-mode loader in this process
    (:func:`tests.serving_fixtures.graph_mode_outputs`)."""
    path = export_version(str(tmp_path), 1, 0)
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}

    def run(signature: str, name: str, value: np.ndarray):
        np.save(tmp_path / "input.npy", value, allow_pickle=value.dtype == object)  # our own file: serialized examples as objects
        return subprocess.run([cli, "run", "--dir", path, "--tag_set", "serve", "--signature_def", signature, "--inputs",
                               f"{name}={tmp_path / 'input.npy'}"], capture_output=True, text=True, env=env, timeout=300)  # fmt: skip

    good = run("encode_features", "features", np.zeros((1, DIM), np.float32))
    assert good.returncode == 0 and "packed_codes" in good.stdout, good.stderr[-500:]
    refused = run("encode_features", "features", np.full((1, DIM), np.nan, np.float32))
    assert refused.returncode != 0 and "InvalidArgument" in refused.stderr, refused.stderr[-500:]
    for signature, name, value in [
        ("encode_features", "features", np.full((1, DIM), -np.inf, np.float32)),
        ("encode_features", "features", np.full((1, DIM), 1e30, np.float32)),
        ("serving_default", "examples", np.array([vector_example([float("nan")] * DIM)], dtype=object)),
        ("serving_default", "examples", np.array([vector_example([1e30] * DIM)], dtype=object)),
    ]:
        with pytest.raises(tf.errors.InvalidArgumentError):
            graph_mode_outputs(path, signature, {name: value})
    assert graph_mode_outputs(path, "serving_default", {"examples": np.array([vector_example([0.5] * DIM)], dtype=object)}).shape == (1, 2)


def test_retries_follow_file_changes_and_back_off(tmp_path):
    clock = [0.0]
    retries = Retries(first_delay=1.0, max_delay=4.0, clock=lambda: clock[0])
    (tmp_path / "a").write_bytes(b"x")
    stamp = tree_stamp(str(tmp_path))
    assert retries.due(7, stamp)
    retries.failed(7, stamp, "boom")
    assert not retries.due(7, stamp) and retries.errors() == {7: "boom"}
    (tmp_path / "b").write_bytes(b"y")  # the copy went on: retried at once
    assert retries.due(7, tree_stamp(str(tmp_path)))
    for delay in (1.0, 2.0, 4.0, 4.0):  # unchanged files: 1, 2, 4, then capped
        clock[0] += delay - 0.01
        assert not retries.due(7, stamp)
        clock[0] += 0.01
        assert retries.due(7, stamp)
        retries.failed(7, stamp, "boom")
    retries.succeeded(7)
    assert retries.errors() == {}
    assert tree_stamp(str(tmp_path / "missing")) == ()


def test_request_checks():
    good = vector_example([0.5] * DIM)
    assert check_examples([good]) == [good]
    for bad in [good[:-1], good + b"\x0c", good + b"\x00junk", b"\x00garbage"]:
        with pytest.raises(ServingError, match="not a serialized tf.Example"):
            check_examples([bad])
    with pytest.raises(ServingError, match="NaN or infinite"):
        check_examples([vector_example([float("inf")] * DIM)])
    with pytest.raises(DecodeError):
        require_complete_parse(tensor_pb2.TensorProto, tensor_pb2.TensorProto(dtype=1).SerializeToString() + b"\x0c")
    assert json_numbers([[1, 2.5]], "f", np.float32).shape == (1, 2)
    for value in ([[1, "2"]], [[True, 1]], [[1], [1, 2]], [1.0, 2.0], [[[[[[[[[[1.0]]]]]]]]]], {"a": 1}, [[None]]):
        with pytest.raises(ServingError):
            json_numbers(value, "f", np.float32)
    for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"k": ' + b"9" * 5000 + b"}", b'{"k": "\xff"}', b'{"k": NaN}', b'{"x": 1}', b"[]"):
        with pytest.raises(ServingError) as err:
            json_object(raw)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_model_server_tensor_checks_before_allocation():
    import tensorflow as tf

    spec = tf.TensorSpec([None, DIM], tf.float32)

    def proto(shape, **values):
        message = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, **values)
        message.tensor_shape.CopyFrom(tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=s) for s in shape]))
        return message

    assert tensor_value(proto([2, DIM], tensor_content=np.ones((2, DIM), np.float32).tobytes()), spec, "x", 1 << 20).shape == (2, DIM)
    cases = {
        "short form": (proto([50_000, DIM], float_val=[0.5]), grpc.StatusCode.INVALID_ARGUMENT),
        "over the limit": (proto([10**9, DIM], float_val=[0.5]), grpc.StatusCode.RESOURCE_EXHAUSTED),
        "overflowing shape": (proto([2**40, DIM], float_val=[0.5]), grpc.StatusCode.RESOURCE_EXHAUSTED),
        "unknown dtype": (tensor_pb2.TensorProto(dtype=999), grpc.StatusCode.INVALID_ARGUMENT),
        "negative dimension": (proto([-1, DIM], float_val=[0.5]), grpc.StatusCode.INVALID_ARGUMENT),
        "content cut short": (proto([1, DIM], tensor_content=b"\x00" * (4 * DIM - 2)), grpc.StatusCode.INVALID_ARGUMENT),
    }
    for name, (message, code) in cases.items():
        with pytest.raises(ServingError) as err:
            tensor_value(message, spec, "x", 8 << 20)
        assert err.value.code == code, name


def test_deployment_pins_only_versions_that_pair(tmp_path):
    """A pushed model that does not load, or whose index fails its checksum, is not pinned, so TF
    Serving never unloads the served pair for it."""
    from tests.serving_fixtures import push_version
    from tests.serving_robustness import push_broken_versions

    models, indexes = str(tmp_path / "models"), str(tmp_path / "indexes")
    vectors, ids = database()
    push_version(models, indexes, 1, 0, vectors, ids)
    push_broken_versions(models, indexes, vectors, ids)
    export_version(models, 5, 4)  # a model without an index
    assert write_deployment(models, "vectors", str(tmp_path / "tfs"), index_base_dir=indexes)["versions"] == [1]
    shutil.rmtree(os.path.join(models, "5"))
    push_version(models, indexes, 6, 4, vectors, ids)
    summary = write_deployment(models, "vectors", str(tmp_path / "tfs"), index_base_dir=indexes)
    assert summary["versions"] == [1, 6] and summary["version_labels"] == {"stable": 6}


def test_search_without_a_deadline(stack):
    """A caller that sets no deadline (grpcio then reports about 9e18 s left) is answered."""
    from tfhash.serving import search_pb2_grpc
    from tfhash.serving.search_client import search_request

    target, _ = stack
    for address in target.search.values():
        with grpc.insecure_channel(address) as channel:
            stub = search_pb2_grpc.HashSearchStub(channel)
            for request in (search_request(features=target.vectors[:2], k=3), search_request(examples=[vector_example(target.vectors[0])], k=3)):
                answer = stub.Search.future(request).result(timeout=30)  # no deadline on the call itself
                assert answer.model_version == "1" and all(len(r.ids) == 3 for r in answer.results)


def test_reload_to_another_base_path_serves_the_new_folder(tmp_path):
    """A model whose base_path changes is served from the new folder, not from versions loaded
    from the old one."""
    from tensorflow_serving.apis import model_pb2
    from tfhash.serving.deployment import model_config
    from tfhash.serving.model_server import ModelRegistry

    old, new = str(tmp_path / "old"), str(tmp_path / "new")
    export_version(old, 1, 0)
    export_version(new, 1, 5)
    registry = ModelRegistry(models_config([model_config("vectors", old, num_versions=1)]))
    registry.poll()
    assert registry.resolve(model_pb2.ModelSpec(name="vectors")).path == os.path.join(old, "1")
    registry.reload_config(models_config([model_config("vectors", new, num_versions=1)]))
    assert registry.resolve(model_pb2.ModelSpec(name="vectors")).path == os.path.join(new, "1")


def test_error_messages_are_bounded():
    from tfhash.serving.errors import MAX_MESSAGE, invalid

    assert len(invalid("x" * 100_000).message) == MAX_MESSAGE
    from tests.serving_fuzz import example

    with pytest.raises(ServingError) as err:  # a 50 kB feature name is quoted cut short
        check_examples([example([float("nan")] * DIM, "f" * 50_000)])
    assert len(err.value.message) < 200


def test_refusals_by_the_signature_say_what_failed(stack):
    """The exported signature's own checks reach the caller as the check's message, not as
    TensorFlow's "Detected at node ... defined at" header."""
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
    from tfhash.serving.client import ModelClient

    target, _ = stack
    far = np.full((1, DIM), 1e30, np.float32)
    for address in target.search.values():
        with SearchClient(address) as client, pytest.raises(ServingError) as err:
            client.search(features=far, k=3)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "holds values outside [-1e+06, 1e+06]" in err.value.message
    with ModelClient(target.model_server, "vectors") as client, pytest.raises(ServingError) as err:
        client.encode_features(far)
    assert "holds values outside" in err.value.message
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "vectors", "encode_features"
    request.inputs["features"].CopyFrom(tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT, float_val=[float("nan")] * DIM,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=s) for s in (1, DIM)])))  # fmt: skip
    with grpc.insecure_channel(target.model_server) as channel, pytest.raises(grpc.RpcError) as err:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "holds NaN or infinite values" in err.value.details()


def test_largest_request_measures_the_service_search_both_ways():
    rows = largest_request(3000, queries=16, k=50)
    assert [row["way"] for row in rows] == ["k nearest, then radius (now)", "range search, then k (before)"]
    assert all(row["results"] > 0 and row["seconds"] >= 0 for row in rows)
    assert rows[0]["results"] <= 16 * 50  # the radius filters the k nearest, it never widens the search
