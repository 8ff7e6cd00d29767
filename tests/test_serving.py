"""Serving over real gRPC on loopback: deployment artifacts, the development model server and its
client, the search service (in process and through the model server), bad input, version locking,
REST front, shutdown and the CLI (the fuzz, hot swap under load and the other hostile-deployment
scenarios: test_serving_robustness.py)."""

from __future__ import annotations

import base64
import functools
import gc
import http.client
import inspect
import json
import logging
import os
import shutil
import socket
import sys
import threading
import time

import grpc
import numpy as np
import psutil
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2
from tfhash.serving import search_pb2, search_pb2_grpc
from tfhash.serving import searcher as searcher_module
from tfhash.serving.client import ModelClient
from tfhash.serving.deployment import (
    model_config,
    models_config,
    read_models_config,
    write_deployment,
)
from tfhash.serving.errors import ServingError
from tfhash.serving.event_loop import EVENT_LOOPS, new_event_loop
from tfhash.serving.model_server import DevModelServer
from tfhash.serving.processes import start_command
from tfhash.serving.requests import Limits
from tfhash.serving.rest import CHUNKED_DISCARD, PARSED_ON_THE_LOOP
from tfhash.serving.search_client import SearchClient, search_request
from tfhash.serving.search_service import SearchServer, in_process_searcher, remote_searcher

from tests.serving_fixtures import (
    BITS,
    DIM,
    build_index,
    database,
    export_version,
    push_version,
    queued_behind,
    reference,
    stop_cli,
    vector_example,
    wait_for,
)
from tests.tiers import starts
from tfhash.index import load_embeddings, load_index, refined_search

MODEL = "vectors"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Version 1 of a model and its index, and the database it indexes."""
    root = tmp_path_factory.mktemp("serving")
    vectors, ids = database()
    push_version(str(root / "models"), str(root / "indexes"), 1, 0, vectors, ids)
    return {"models": str(root / "models"), "indexes": str(root / "indexes"), "vectors": vectors, "ids": ids,
            "root": root}  # fmt: skip


@pytest.fixture()
@starts("server")
def model_server(artifacts):
    server = DevModelServer(models_config([model_config(MODEL, artifacts["models"])]), poll_seconds=0.2).start()
    yield server
    server.stop(0)


@pytest.fixture(params=[("in_process", "uvloop"), ("remote", "asyncio")], ids=["in_process-uvloop", "remote-asyncio"])
@starts("server")
def search_server(request, artifacts, model_server):
    encoder, event_loop = request.param
    if encoder == "in_process":
        searcher = in_process_searcher(artifacts["models"], artifacts["indexes"], limits=Limits(max_batch=64, max_k=1000))
    else:
        searcher = remote_searcher(model_server.address, MODEL, artifacts["indexes"], limits=Limits(max_batch=64, max_k=1000),
                                   model_base_dir=artifacts["models"])  # fmt: skip
    server = SearchServer(searcher, rest_port=0, max_message_bytes=1 << 20, event_loop=event_loop).start()
    assert type(server._loop).__module__.startswith(event_loop)  # every test of the service runs on both loops
    yield server
    server.stop(0)


def test_the_event_loop_is_uvloop_where_installed_and_a_bad_choice_is_named(monkeypatch):
    loops = {kind: new_event_loop(kind) for kind in EVENT_LOOPS}
    try:
        assert type(loops["auto"]) is type(loops["uvloop"]) and type(loops["uvloop"]).__module__.startswith("uvloop")
        assert type(loops["asyncio"]).__module__.startswith("asyncio")
    finally:
        for loop in loops.values():
            loop.close()
    with pytest.raises(ValueError, match=r"^event loop 'tokio' is none of auto, uvloop, asyncio$"):
        new_event_loop("tokio")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as where uvloop is not installed: auto falls back
    fallback = new_event_loop("auto")
    fallback.close()
    assert type(fallback).__module__.startswith("asyncio")
    with pytest.raises(ValueError, match=r"^event loop 'uvloop' is not installed: pip install uvloop \(or choose 'asyncio'\)$"):
        new_event_loop("uvloop")


def test_deployment_artifacts(artifacts, tmp_path):
    summary = write_deployment(artifacts["models"], MODEL, str(tmp_path / "tfs"), index_base_dir=artifacts["indexes"])
    assert summary["versions"] == [1] and summary["warmup_records"] == {"1": True}
    container = read_models_config(str(tmp_path / "tfs" / "models.config")).model_config_list.config[0]
    assert container.base_path == f"/models/{MODEL}" and container.model_platform == "tensorflow"
    assert list(container.model_version_policy.specific.versions) == [1] and dict(container.version_labels) == {"stable": 1}
    with pytest.raises(ValueError, match="with a published index"):  # a version is pinned only with its index
        write_deployment(artifacts["models"], MODEL, str(tmp_path / "out"), index_base_dir=str(tmp_path / "no-indexes"))
    local = read_models_config(str(tmp_path / "tfs" / "models.local.config")).model_config_list.config[0]
    assert local.base_path == os.path.abspath(artifacts["models"])
    batching = (tmp_path / "tfs" / "batching_parameters.txt").read_text()
    assert "max_batch_size { value: 128 }" in batching and "batch_timeout_micros { value: 2000 }" in batching
    assert 'path: "/monitoring/prometheus/metrics"' in (tmp_path / "tfs" / "monitoring.config").read_text()
    run_script = (tmp_path / "tfs" / "docker-run.sh").read_text()
    assert "tensorflow/serving:2.16.1" in run_script and "--batching_parameters_file=/config/batching_parameters.txt" in run_script
    assert f"/models/{MODEL}:ro" in (tmp_path / "tfs" / "docker-compose.yml").read_text()
    with pytest.raises(ValueError, match="no SavedModel version"):
        write_deployment(str(tmp_path / "empty"), MODEL, str(tmp_path / "out"))
    (tmp_path / "bad.config").write_text("model_config_list { config { nme: 'x' } }")
    with pytest.raises(ValueError, match="cannot read the model server config"):
        read_models_config(str(tmp_path / "bad.config"))


def test_model_server_encodes_like_the_saved_model(artifacts, model_server):
    vectors = artifacts["vectors"][:5]
    direct = tf.saved_model.load(os.path.join(artifacts["models"], "1")).signatures["encode_features"](features=tf.constant(vectors))
    with ModelClient(model_server.address, MODEL, version=1) as client:
        by_features = client.encode_features(vectors)
        by_examples = client.encode_examples([vector_example(v) for v in vectors])
        assert by_features.model_version == 1 and client.status() == [(1, "AVAILABLE", "")]
        assert set(client.signatures()) == {"serving_default", "encode_features"}
    np.testing.assert_allclose(by_features.codes, direct["codes"].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(by_features.packed_codes, direct["packed_codes"].numpy())
    np.testing.assert_array_equal(by_examples.packed_codes, by_features.packed_codes)
    np.testing.assert_array_equal(by_features.binary_codes, np.where(by_features.codes >= 0, 1, -1))
    with ModelClient(model_server.address, MODEL, version=7) as client, pytest.raises(ServingError) as err:
        client.encode_features(vectors)
    assert err.value.code == grpc.StatusCode.NOT_FOUND
    with ModelClient(model_server.address, "nope") as client, pytest.raises(ServingError) as err:
        client.status()
    assert err.value.code == grpc.StatusCode.NOT_FOUND
    with ModelClient(model_server.address, MODEL) as client, pytest.raises(ServingError, match="NaN"):
        client.encode_features(np.full((1, DIM), np.nan))


@pytest.mark.parametrize(
    "inputs, signature, message",
    [
        ({"wrong": tf.make_tensor_proto(np.zeros((1, DIM), np.float32))}, "encode_features", "missing"),
        ({"features": tf.make_tensor_proto(np.zeros((1, DIM), np.float64))}, "encode_features", "expects float32"),
        ({"features": tf.make_tensor_proto(np.zeros((1, 5), np.float32))}, "encode_features", "shape"),
        ({"examples": tf.make_tensor_proto([b"not an example"])}, "serving_default", "parse"),
        ({"examples": tf.make_tensor_proto([b""])}, "nope", "signature"),
    ],
)
def test_model_server_refuses_bad_predict_requests(model_server, inputs, signature, message):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(model_server.address))
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = MODEL, signature
    for name, proto in inputs.items():
        request.inputs[name].CopyFrom(proto)
    with pytest.raises(grpc.RpcError) as err:
        stub.Predict(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in err.value.details().lower()
    metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["everything"])
    metadata.model_spec.name = MODEL
    with pytest.raises(grpc.RpcError) as err:
        stub.GetModelMetadata(metadata, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.server
def test_model_server_follows_versions_labels_and_reports_broken_ones(artifacts, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tfhash.serving.model_server")
    base = tmp_path / "models"
    shutil.copytree(os.path.join(artifacts["models"], "1"), base / "1")
    config = models_config([model_config(MODEL, str(base), num_versions=2, labels={"stable": 1})])
    server = DevModelServer(config, poll_seconds=0.1).start()

    def available(client):
        return [v for v, state, _ in client.status() if state == "AVAILABLE"]

    def until(client, versions):
        wait_for(lambda: available(client) == versions, 30)
        return available(client)

    try:
        with ModelClient(server.address, MODEL, version_label="stable") as stable, ModelClient(server.address, MODEL) as newest:
            assert stable.encode_features(artifacts["vectors"][:1]).model_version == 1
            shutil.copytree(base / "1", base / "2")
            assert until(newest, [1, 2]) == [1, 2]
            assert newest.encode_features(artifacts["vectors"][:1]).model_version == 2
            (base / "3").mkdir()
            (base / "3" / "saved_model.pb").write_bytes(b"corrupt")
            shutil.copytree(base / "1", base / "4")
            assert until(newest, [4]) == [4]  # latest 2 = {3, 4}; 3 does not load
            states = {v: (state, error) for v, state, error in newest.status()}
            assert states[3][0] == "END" and states[3][1]  # reported with its error, not fatal
            assert newest.encode_features(artifacts["vectors"][:1]).model_version == 4
            with pytest.raises(ServingError) as err:
                stable.encode_features(artifacts["vectors"][:1])  # version 1 left the policy
            assert err.value.code == grpc.StatusCode.NOT_FOUND
    finally:
        server.stop(0)
    logged = caplog.text  # the operator sees each version come and go
    for line in ("loaded version 1 from", "loaded version 2 from", "loaded version 4 from", "unloaded version 1", "unloaded version 2"):
        assert f"model {MODEL}: {line}" in logged, line


def test_search_equals_the_library_search(artifacts, search_server):
    vectors = artifacts["vectors"][:20]
    packed, expected = reference(os.path.join(artifacts["models"], "1"), os.path.join(artifacts["indexes"], "1", "BFlat"), vectors, 10)
    with SearchClient(search_server.address) as client:
        assert client.health() == "SERVING" and client.status().model_version == "1"
        answers = [
            client.search(features=vectors, k=10),
            client.search(examples=[vector_example(v) for v in vectors], k=10),
            client.search(codes=packed, k=10),
            client.search(codes=np.unpackbits(packed, axis=1).astype(np.int8) * 2 - 1, k=10, model_version="1"),
        ]
        for answer in answers:
            assert answer.model_version == "1" and answer.exact and answer.index_kind == "binary-flat"
            np.testing.assert_array_equal(np.stack(answer.ids), expected.ids)
            np.testing.assert_array_equal(np.stack(answer.distances), expected.distances)
        within = client.search(features=vectors, k=50, radius=2)
    index = load_index(os.path.join(artifacts["indexes"], "1", "BFlat"))
    for found, ball in zip(within.ids, index.range_search(packed, 2), strict=True):
        np.testing.assert_array_equal(found, ball.ids[:50])


@pytest.mark.server
def test_an_index_with_embeddings_answers_encoded_queries_by_the_second_stage(artifacts, tmp_path):
    """Every database item searched by its own features comes first (gRPC, REST); the answer is
    the library's refined search; refine=false, and queries given as codes, answer in Hamming
    order; a bad refine is refused. ``refine`` came after ``timeout``, keyword only, so a caller
    passing ``timeout`` by position still does."""
    parameters = inspect.signature(SearchClient.search).parameters
    assert list(parameters).index("timeout") == 7 and parameters["refine"].kind is inspect.Parameter.KEYWORD_ONLY
    vectors, ids = artifacts["vectors"], artifacts["ids"]
    model_dir = os.path.join(artifacts["models"], "1")
    build_index(model_dir, str(tmp_path), 1, vectors, ids, embeddings=True)
    searcher = in_process_searcher(artifacts["models"], str(tmp_path), limits=Limits(max_batch=64, max_k=1000))
    server = SearchServer(searcher, rest_port=0).start()
    index_path = os.path.join(str(tmp_path), "1", "BFlat")
    index, stored = load_index(index_path), load_embeddings(index_path)
    outputs = tf.saved_model.load(model_dir).signatures["encode_features"](features=tf.constant(vectors))
    packed, continuous = outputs["packed_codes"].numpy(), outputs["codes"].numpy()
    try:
        with SearchClient(server.address) as client:
            assert client.status().embeddings
            hamming_first = []
            for start in range(0, len(vectors), 50):
                rows = slice(start, start + 50)
                answer = client.search(features=vectors[rows], k=5)
                assert answer.refined and [found[0] for found in answer.ids] == ids[rows].tolist()
                expected = refined_search(index, stored, continuous[rows], 5)
                np.testing.assert_array_equal(np.stack(answer.ids), expected.ids)
                np.testing.assert_array_equal(np.stack(answer.distances), expected.distances)
                plain = client.search(features=vectors[rows], k=5, refine=False)
                by_codes = client.search(codes=packed[rows], k=5)
                assert not plain.refined and not by_codes.refined
                np.testing.assert_array_equal(np.stack(plain.ids), index.search(packed[rows], 5).ids)
                np.testing.assert_array_equal(np.stack(by_codes.ids), np.stack(plain.ids))
                hamming_first += [found[0] for found in plain.ids]
            assert np.mean(np.array(hamming_first) == ids) < 0.9  # ties: Hamming order alone does not find itself first
        port = server.rest.port
        headers = {"Content-Type": "application/json"}
        status, answer = rest_call(port, "POST", "/v1/search", json.dumps({"features": vectors[:3].tolist(), "k": 4}).encode(), headers)
        assert status == 200 and answer["refined"] and [r["ids"][0] for r in answer["results"]] == ids[:3].tolist()
        status, answer = rest_call(port, "POST", "/v1/search", json.dumps({"features": vectors[:3].tolist(), "k": 4, "refine": False}).encode(),
                                   headers)  # fmt: skip
        assert status == 200 and not answer["refined"]
        status, answer = rest_call(port, "POST", "/v1/search", json.dumps({"features": vectors[:3].tolist(), "k": 4, "refine": 1}).encode(),
                                   headers)  # fmt: skip
        assert status == 400 and answer["error"]["message"] == "refine must be true or false, got 1"
    finally:
        server.stop(0)


def test_a_request_is_checked_once_and_encoded_to_the_saved_models_packed_codes(artifacts, monkeypatch):
    """A request parsed into a Query has its features checked once (the encoder and the searcher
    trust them), and the encoder answers with the SavedModel's packed codes."""
    import tfhash.serving.encoders as encoders
    import tfhash.serving.requests as requests

    calls, checked = [], requests.check_features
    counted = lambda features: calls.append(1) or checked(features)  # noqa: E731
    for module in (requests, encoders, searcher_module):  # wherever a layer could look it up
        monkeypatch.setattr(module, "check_features", counted, raising=False)
    searcher = in_process_searcher(artifacts["models"], artifacts["indexes"])
    searcher.refresh()
    vectors = artifacts["vectors"][:5]
    request = search_request(features=vectors, k=4)
    pair, results = searcher.search(requests.query_from_proto(request))
    assert len(calls) == 1 and [len(r.ids) for r in results] == [4] * 5
    packed, expected = reference(os.path.join(artifacts["models"], "1"), os.path.join(artifacts["indexes"], "1", "BFlat"), vectors, 4)
    np.testing.assert_array_equal(pair.encoder.encode_features(vectors.astype(np.float32))[0], packed)
    np.testing.assert_array_equal(np.stack([r.ids for r in results]), expected.ids)


@pytest.mark.server
def test_searches_run_with_the_search_threads_set_on_the_thread_that_makes_them(artifacts):
    """FAISS's OpenMP setting holds for the thread that sets it: the service sets it on the thread
    that makes the joined calls, not only where it was built."""
    import faiss

    searcher = in_process_searcher(artifacts["models"], artifacts["indexes"])
    server = SearchServer(searcher, poll_seconds=60, search_threads=1).start()
    seen, answer = [], searcher.answer
    searcher.answer = lambda *args, **kwargs: seen.append(faiss.omp_get_max_threads()) or answer(*args, **kwargs)
    faiss.omp_set_num_threads(2)  # this thread's, which the service's searches must not follow
    try:
        with SearchClient(server.address) as client:
            assert len(client.search(features=artifacts["vectors"][:2], k=3).ids) == 2
    finally:
        server.stop(0)
    assert seen == [1]


@pytest.mark.server
def test_a_search_server_binds_and_runs_nothing_until_it_starts(artifacts):
    """Constructing a server does no I/O: a port in use is refused by start (BindError naming the
    address), which leaves nothing running; a server never started stops quietly."""
    from tfhash.serving.grpc_server import BindError

    lingering = {t for t in threading.enumerate() if t.name.startswith("tfhash-search")}  # an earlier test's, still ending

    def front_threads():
        return [t.name for t in threading.enumerate() if t.name.startswith("tfhash-search") and t not in lingering]

    searcher = in_process_searcher(artifacts["models"], artifacts["indexes"])
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    try:
        server = SearchServer(searcher, port=port, rest_port=0, poll_seconds=60)
        assert front_threads() == [] and server.rest_port is None and server.address.endswith(f":{port}")
        with pytest.raises(BindError, match=f"cannot bind .*:{port}"):
            server.start()
        assert front_threads() == []
        with pytest.raises(RuntimeError, match="started before"):
            server.start()
    finally:
        taken.close()
    SearchServer(searcher, poll_seconds=60).stop(0)
    assert front_threads() == []


@pytest.mark.server
def test_concurrent_searches_are_joined_and_answered_as_alone(artifacts):
    """Searches that arrive while a call runs wait, and the next calls join those of one kind (k,
    form); each request gets exactly the answer it gets alone, over gRPC, and a request refused
    inside a joined call (codes of a wrong value) fails alone."""
    searcher = in_process_searcher(artifacts["models"], artifacts["indexes"])
    server = SearchServer(searcher, poll_seconds=60).start()
    index, busy, release, calls = searcher.active.index, threading.Event(), threading.Event(), []
    alone = index.search

    def search(packed, k):
        calls.append((k, len(packed)))
        busy.set()
        release.wait(5)  # the first call holds the coalescer until the rest have queued
        return alone(packed, k)

    index.search = search
    codes = load_index(os.path.join(artifacts["indexes"], "1", "BFlat")).codes()[:30]
    signs = np.unpackbits(codes, axis=1).astype(np.int8) * 2 - 1
    requests = [(codes[i : i + 1 + i % 2], 5 if i % 3 else 12) for i in range(24)] + [(signs[i : i + 1], 5) for i in range(24, 30)]
    wrong = signs[:1].copy()
    wrong[0, 0] = 3  # not +-1: refused by the pair, inside a call it shares with the good +-1 requests
    answers, client = {}, SearchClient(server.address)

    def ask(i, query, k):
        try:
            answers[i] = client.search(codes=query, k=k)
        except ServingError as err:
            answers[i] = err

    try:
        queued = [functools.partial(ask, i, *request) for i, request in enumerate(requests)] + [functools.partial(ask, "bad", wrong, 5)]
        queued_behind(lambda: ask(-1, codes[:1], 7), busy, release, queued, lambda: server.coalescer.waiting == len(queued))
    finally:
        client.close()
        server.stop(0)
    assert isinstance(answers["bad"], ServingError) and answers["bad"].code == grpc.StatusCode.INVALID_ARGUMENT
    assert "values other than" in answers["bad"].message or "+-1" in answers["bad"].message, answers["bad"].message
    rows = 1 + sum(len(query) for query, _ in requests)
    assert sum(n for _, n in calls) == rows and len(calls) < len(requests) and {k for k, _ in calls} == {5, 7, 12}
    assert max(n for _, n in calls) <= 64
    for i, (query, k) in enumerate(requests):
        expected = alone(codes[i : i + len(query)], k)
        np.testing.assert_array_equal(np.stack(answers[i].ids), expected.ids)
        np.testing.assert_array_equal(np.stack(answers[i].distances), expected.distances)


def _search_code(client: SearchClient, **request) -> grpc.StatusCode:
    try:
        client.search(**request)
    except ServingError as err:
        assert err.message
        return err.code
    return grpc.StatusCode.OK


def test_search_refuses_bad_input_with_clear_codes(artifacts, search_server):
    INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    vectors = artifacts["vectors"][:2]
    nan_example = vector_example([float("nan")] * DIM)
    stub = search_pb2_grpc.HashSearchStub(grpc.insecure_channel(search_server.address))
    with pytest.raises(grpc.RpcError) as err:
        stub.Search(search_pb2.SearchRequest(k=3), timeout=10)  # no query at all
    assert err.value.code() == INVALID
    with SearchClient(search_server.address) as client:
        cases = {
            "empty examples": (dict(examples=[], k=3), INVALID),
            "malformed example": (dict(examples=[b"\x00garbage"], k=3), INVALID),
            "NaN example": (dict(examples=[nan_example], k=3), INVALID),
            "NaN features": (dict(features=np.full((1, DIM), np.nan), k=3), INVALID),
            "wrong feature width": (dict(features=np.zeros((2, DIM + 1)), k=3), INVALID),
            "k = 0": (dict(features=vectors, k=0), INVALID),
            "k < 0": (dict(features=vectors, k=-4), INVALID),
            "k above the limit": (dict(features=vectors, k=1001), INVALID),
            "k above the database": (dict(features=vectors, k=len(artifacts["ids"]) + 1), INVALID),
            "k = the database": (dict(features=vectors, k=len(artifacts["ids"])), grpc.StatusCode.OK),
            "negative radius": (dict(features=vectors, k=3, radius=-1), INVALID),
            "codes of another width": (dict(codes=np.zeros((1, 4), np.uint8), k=3), INVALID),
            "codes not +-1": (dict(codes=np.zeros((1, BITS), np.int8), k=3), INVALID),
            "too many queries": (dict(features=np.zeros((65, DIM)), k=3), INVALID),
            "unknown model version": (dict(features=vectors, k=3, model_version="99"), NOT_FOUND),
            "request over the size limit": (dict(examples=[b"x" * (2 << 20)], k=3), grpc.StatusCode.RESOURCE_EXHAUSTED),
        }
        got = {name: _search_code(client, **request) for name, (request, _) in cases.items()}
        assert got == {name: code for name, (_, code) in cases.items()}
        # a deadline already past: with a 1 us timeout a warm loopback search once answered in
        # time (a fresh clone's full run, AMD EPYC), so that case depended on the machine's speed
        with pytest.raises(ServingError) as err:
            client.search(features=vectors, k=3, timeout=-1.0)
        assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        bad_packed = search_request(codes=np.zeros((1, 2), np.uint8), k=3)
        bad_packed.codes.packed = b"\x00\x01\x02"  # 3 bytes of 2-byte codes
        with pytest.raises(grpc.RpcError) as err:
            stub.Search(bad_packed, timeout=10)
        assert err.value.code() == INVALID


@pytest.mark.server
def test_mismatched_or_corrupt_pairs_are_never_served(artifacts, tmp_path):
    models, indexes = str(tmp_path / "models"), str(tmp_path / "indexes")
    vectors, ids = artifacts["vectors"], artifacts["ids"]
    searcher = in_process_searcher(models, indexes)
    server = SearchServer(searcher, poll_seconds=60).start()
    try:
        with SearchClient(server.address) as client:
            assert client.health() == "NOT_SERVING" and not client.status().ready
            assert _search_code(client, features=vectors[:1], k=3) == grpc.StatusCode.UNAVAILABLE
            push_version(models, indexes, 1, 0, vectors, ids)
            assert searcher.refresh()
            # version 2: its index folder holds codes of version 1's model (fingerprint mismatch)
            v1_model = os.path.join(models, "1")
            export_version(models, 2, 5)
            build_index(v1_model, str(tmp_path / "elsewhere"), 2, vectors, ids)
            shutil.copytree(str(tmp_path / "elsewhere" / "2"), os.path.join(indexes, "2"))
            # version 3: a corrupt index file
            push_version(models, indexes, 3, 6, vectors, ids)
            with open(os.path.join(indexes, "3", "BFlat", "ids.npy"), "r+b") as handle:
                handle.seek(-1, os.SEEK_END)
                handle.write(b"\x7f")
            # version 4: a model without its index
            export_version(models, 4, 8)
            assert not searcher.refresh()
            assert client.status().model_version == "1"
            assert client.search(features=vectors[:1], k=3).model_version == "1"
    finally:
        server.stop(0)


def _unreachable_uri() -> str:
    import socket

    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def milvus_connections() -> int:
    """The Milvus connections that tfhash indexes of this process hold open."""
    from pymilvus import connections

    return sum(alias.startswith("tfhash-") for alias, _ in connections.list_connections())


@pytest.mark.server
def test_a_bmih_index_is_served_like_bflat_with_its_tables_mapped(artifacts, tmp_path):
    """The service loads BMIH by its kind, maps its arrays (codes and tables), and answers k-NN and
    radius searches exactly as BFlat does on the same version."""
    models, indexes = str(tmp_path / "models"), str(tmp_path / "indexes")
    vectors, ids = artifacts["vectors"], artifacts["ids"]
    model_1, _ = push_version(models, indexes, 1, 0, vectors, ids, "BMIH")
    bflat = build_index(model_1, indexes, 1, vectors, ids, "BFlat")
    server = SearchServer(in_process_searcher(models, indexes, kind="BMIH"), poll_seconds=60).start()
    try:
        with SearchClient(server.address) as client:
            answer = client.search(features=vectors[:20], k=10)
            packed, expected = reference(model_1, bflat, vectors[:20], 10)
            assert answer.index_kind == "binary-mih" and answer.exact and answer.model_version == "1"
            np.testing.assert_array_equal(np.stack(answer.ids), expected.ids)
            np.testing.assert_array_equal(np.stack(answer.distances), expected.distances)
            within = client.search(codes=packed, k=50, radius=3)
            for found, ball in zip(within.ids, load_index(bflat).range_search(packed, 3), strict=True):
                np.testing.assert_array_equal(found, ball.ids[:50])
        mapped = [m.path for m in psutil.Process().memory_maps() if os.path.join(indexes, "1", "BMIH") in m.path]
        assert any(p.endswith("positions.npy") for p in mapped) and any(p.endswith("codes.npy") for p in mapped)
    finally:
        server.stop(0)


@pytest.mark.process
@pytest.mark.server
def test_milvus_pairs_swap_and_an_unreachable_store_keeps_the_old_pair(artifacts, tmp_path):
    """Versions whose index lives in Milvus (Lite) pair and swap like file indexes: answers equal
    BFlat's distances; a new version whose Milvus cannot be reached is not served (the old pair
    stays), and is served once reachable; a store that dies under the active pair answers
    UNAVAILABLE with a message naming no host or path."""
    from milvus_lite.server_manager import server_manager_instance

    models, indexes, lite = str(tmp_path / "models"), str(tmp_path / "indexes"), str(tmp_path / "milvus.db")
    vectors, ids = artifacts["vectors"], artifacts["ids"]
    model_1, _ = push_version(models, indexes, 1, 0, vectors, ids, "Milvus", uri=lite, collection="vectors_v1", timeout=2)
    bflat_1 = build_index(model_1, indexes, 1, vectors, ids, "BFlat")
    searcher = in_process_searcher(models, indexes, kind="Milvus")
    server = SearchServer(searcher, poll_seconds=60).start()
    try:
        with SearchClient(server.address) as client:
            assert client.status().model_version == "1"  # the server paired version 1 on start
            answer = client.search(features=vectors[:20], k=10)
            _, expected = reference(model_1, bflat_1, vectors[:20], 10)
            assert answer.index_kind == "milvus-flat" and not answer.exact
            np.testing.assert_array_equal(np.stack(answer.distances), expected.distances)

            # version 2's index points at a Milvus that does not answer: version 1 keeps serving
            path_2 = push_version(models, indexes, 2, 5, vectors, ids, "Milvus", uri=lite, collection="vectors_v2", timeout=2)[1]
            manifest_file = os.path.join(path_2, "manifest.json")
            good = open(manifest_file).read()
            manifest = json.loads(good)
            manifest["params"].update(uri=_unreachable_uri(), timeout=1)
            with open(manifest_file, "w") as handle:
                json.dump(manifest, handle)
            assert not searcher.refresh()
            assert "IndexUnavailableError: cannot reach Milvus" in searcher.retries.errors()[2]
            assert client.search(features=vectors[:1], k=3).model_version == "1"
            with open(manifest_file, "w") as handle:  # reachable again (the file changed: retried at once)
                handle.write(good)
            assert milvus_connections() == 1  # version 1's
            assert searcher.refresh() and client.search(features=vectors[:1], k=3).model_version == "2"
            gc.collect()
            assert milvus_connections() == 1  # version 2's: the swapped-out index closed its connection

            # the store dies under the served pair: UNAVAILABLE, nothing about where it lives
            server_manager_instance.release_server(lite)
            with pytest.raises(ServingError) as err:
                client.search(features=vectors[:1], k=3)
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
            assert "index of model version 2 did not answer" in err.value.message and lite not in err.value.message
    finally:
        server.stop(0)


def rest_call(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """(status, parsed JSON body) of one HTTP request to the REST front."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def test_rest_front(artifacts, search_server):
    port = search_server.rest.port

    def post(body, raw=None, content_type="application/json"):
        return rest_call(port, "POST", "/v1/search", raw if raw is not None else json.dumps(body).encode(), {"Content-Type": content_type})

    vectors = artifacts["vectors"][:3]
    with SearchClient(search_server.address) as client:
        grpc_answer = client.search(features=vectors, k=4)
    status, answer = post({"features": vectors.tolist(), "k": 4})
    assert status == 200 and answer["model_version"] == "1"
    assert [r["ids"] for r in answer["results"]] == [ids.tolist() for ids in grpc_answer.ids]
    status, by_examples = post({"examples": [base64.b64encode(vector_example(v)).decode() for v in vectors], "k": 4})
    assert status == 200 and by_examples["results"] == answer["results"]
    assert post(None, raw=b"{not json")[0] == 400
    assert post({"features": vectors.tolist(), "k": 0}) == (400, {"error": {"code": "INVALID_ARGUMENT", "message": "k must be an integer in 1..1000, got 0"}})
    assert post({"features": vectors.tolist(), "k": 3, "model_version": "9"})[0] == 404
    assert post({"codes": [[0.5] * BITS], "k": 3})[0] == 400
    assert post({"codes": [["1"] * BITS], "k": 3})[0] == 400  # numbers as strings are not numbers
    assert post({"features": vectors.tolist(), "k": 4}, content_type="text/plain")[0] == 415
    assert post({"features": vectors.tolist(), "k": 4, "radius": 10**40})[0] == 200  # any radius >= K keeps all
    many = artifacts["vectors"][:60]  # a body over 64 KiB (JSON may be padded with whitespace): parsed off the loop, answered the same
    body = b" " * PARSED_ON_THE_LOOP + json.dumps({"features": many.tolist(), "k": 4}).encode()
    assert len(body) > PARSED_ON_THE_LOOP
    with SearchClient(search_server.address) as client:
        status, large = post(None, raw=body)
        assert status == 200 and [r["ids"] for r in large["results"]] == [ids.tolist() for ids in client.search(features=many, k=4).ids]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.putrequest("POST", "/v1/search")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(2 << 20))  # refused on the header, before any body is read
    connection.endheaders()
    assert connection.getresponse().status == 413
    connection.close()
    limit = 1 << 20  # the fixture's max_message_bytes
    for size in (3 * limit, 6 * limit):  # chunked, no declared length: within the discarded share, and past it
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:  # sent whole, paced (a client slower than the server), before the answer is read, as http.client does
            connection.request("POST", "/v1/search", body=(time.sleep(0.002) or b" " * (64 << 10) for _ in range(size >> 16)),
                               headers={"Content-Type": "application/json"}, encode_chunked=True)  # fmt: skip
            response = connection.getresponse()
            if size <= CHUNKED_DISCARD * limit:
                assert response.status == 413 and f"at most {limit} bytes" in json.loads(response.read())["error"]["message"]
            else:
                assert response.status == 400  # Tornado's parser, closing the connection
        except (BrokenPipeError, ConnectionResetError):
            assert size > CHUNKED_DISCARD * limit  # past the discarded share the connection closes mid-body
        finally:
            connection.close()
    chunked = (part for part in (b'{"features": ', json.dumps(vectors.tolist()).encode(), b', "k": 4}'))
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", "/v1/search", body=chunked, headers={"Content-Type": "application/json"}, encode_chunked=True)
    response = connection.getresponse()
    assert response.status == 200 and json.loads(response.read())["results"] == answer["results"]  # under the limit: answered
    connection.close()
    assert rest_call(port, "GET", "/readyz") == (200, {"ready": True})
    status, found = rest_call(port, "GET", "/v1/status")
    assert status == 200 and found["count"] == len(artifacts["ids"]) and found["index_path"] == "1/BFlat"
    assert rest_call(port, "GET", "/nothing")[0] == 404 and rest_call(port, "GET", "/v1/search")[0] == 405


def test_rest_front_refuses_what_it_would_misread(artifacts, search_server):
    """A charset other than UTF-8 (415), a long target (414), large headers (431) and a query
    parameter, which no route reads (400): each answered with a status, never ignored or dropped."""
    port, body = search_server.rest.port, json.dumps({"features": artifacts["vectors"][:1].tolist(), "k": 2}).encode()
    for content_type in ("application/json; charset=utf-16", 'application/json; Charset="latin-1"'):
        status, answer = rest_call(port, "POST", "/v1/search", body, {"Content-Type": content_type})
        assert status == 415 and "UTF-8" in answer["error"]["message"]
    for content_type in ("application/json; charset=UTF-8", 'application/json;charset="utf-8"'):
        assert rest_call(port, "POST", "/v1/search", body, {"Content-Type": content_type})[0] == 200
    status, answer = rest_call(port, "POST", "/v1/search?model_version=1", body, {"Content-Type": "application/json"})
    assert status == 400 and "unknown query parameter 'model_version'" in answer["error"]["message"]
    assert rest_call(port, "GET", "/v1/status?verbose")[0] == 400
    assert rest_call(port, "GET", "/healthz?" + "a" * 20_000)[0] == 414
    status, answer = rest_call(port, "GET", "/v1/status", headers={"X-Padding": "p" * 70_000})
    assert status == 431 and "over the limit of 65536" in answer["error"]["message"]
    assert rest_call(port, "GET", "/readyz") == (200, {"ready": True})  # and the front still serves


@pytest.mark.server
def test_shutdown_drains_in_flight_requests(artifacts):
    searcher = in_process_searcher(artifacts["models"], artifacts["indexes"])
    started, release = threading.Event(), threading.Event()
    answer = searcher.answer

    def slow_answer(*args, **kwargs):  # hold the first call until released; the rest wait behind it
        started.set()
        release.wait(20)
        return answer(*args, **kwargs)

    searcher.answer = slow_answer
    server = SearchServer(searcher).start()
    stub = search_pb2_grpc.HashSearchStub(grpc.insecure_channel(server.address))
    request = search_request(features=artifacts["vectors"][:32], k=10)
    pending = [stub.Search.future(request, timeout=30)]
    assert started.wait(20)
    pending += [stub.Search.future(request, timeout=30) for _ in range(3)]
    assert wait_for(lambda: server.coalescer.waiting == 3, 20)  # all four are inside the service
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 20})
    stopper.start()
    assert wait_for(lambda: server._closing, 20)  # the stop has begun: new requests are turned away
    with pytest.raises(grpc.RpcError) as err:  # a new request during shutdown is refused
        stub.Search(request, timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    release.set()
    assert [len(future.result().results) for future in pending] == [32] * 4  # in-flight ones finish
    stopper.join(30)


@pytest.mark.process
def test_cli_serves_models_and_search_and_stops_on_sigterm(artifacts, tmp_path):
    write_deployment(artifacts["models"], MODEL, str(tmp_path / "tfs"))
    models, address = start_command(["serve", "model", "--model-config-file", str(tmp_path / "tfs" / "models.local.config"),
                                  "--port", "0"], "development model server on ")  # fmt: skip
    try:
        search, search_address = start_command(["serve", "search", "--index-base-dir", artifacts["indexes"], "--model-server",
                                             address, "--model-name", MODEL, "--port", "0"], "search service on ")  # fmt: skip
        try:
            with SearchClient(search_address) as client:
                assert client.search(features=artifacts["vectors"][:2], k=3).model_version == "1"
        finally:
            stop_cli(search)
    finally:
        stop_cli(models)


def test_models_config_round_trips_through_text_format():
    config = models_config([model_config(MODEL, "/models/x", num_versions=3, labels={"canary": 5})])
    parsed = text_format.Parse(text_format.MessageToString(config), model_server_config_pb2.ModelServerConfig())
    assert parsed == config
    with pytest.raises(ValueError):
        model_config("a/b", "/x")
