"""Serving under hostile input and real deployments: the evidence run.

    python -m tests.serving_robustness [--seed 0] [--requests 12000] [--trials 10] [--size 1000000]
                                            [--processes 1] [--name serving_robustness]

* **fuzz**: :func:`tests.serving_fuzz.run` against the search service (in-process and remote
  encoding, gRPC and REST) and the development model server, all on loopback;
* **hot swap under load**: client threads search without pause while broken versions are pushed
  (a SavedModel that does not load, an index whose checksum fails) and a good version is copied
  file by file (``saved_model.pb`` and ``manifest.json`` first, data files in two halves), in
  process and through the model server with the pinned ``models.config``; every answer is
  compared with the library's own search of the version that answered;
* **SIGTERM under load**: ``tfhash serve search`` (with REST and an open health Watch stream) and
  ``tfhash serve model`` as processes, signalled while clients send requests; exit code, exit time,
  answers after the signal;
* **the largest request**: ``max_batch`` queries with a radius over a ``size``-code index, searched
  the way the service does now (k nearest, then the radius) and with the range search it used
  before, in the same run.

Writes ``benchmarks/results/serving_robustness.{json,md}``. The scenario functions are also what
``tests/test_serving_robustness.py`` runs, with fewer requests and trials.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

import grpc
import numpy as np
from tfhash.serving.processes import start_command

from benchmarks.common import markdown_table, write_results
from tests.serving_fixtures import (
    BITS,
    DIM,
    cli_rest_port,
    database,
    push_version,
    reference,
    stop_cli,
    vector_example,
)
from tests.serving_fuzz import Target
from tests.serving_fuzz import run as fuzz

MODEL = "vectors"


class ServiceProcesses:
    """``tfhash serve search <args> --processes N`` run as a command (a supervising parent and N
    serving processes on one port), with the :class:`SearchServer` attributes the scenarios use."""

    def __init__(self, args: list[str], processes: int, poll: float):
        self.process, self.address = start_command(["serve", "search", *args, "--port", "0", "--poll-seconds", str(poll),
                                                "--processes", str(processes), "--grace-seconds", "1"],
                                               "search service on ")  # fmt: skip
        self.rest_port = cli_rest_port(self.process)

    def stop(self, grace: float = 0.0) -> None:
        stop_cli(self.process)


def search_service(searcher_args: list[str], make_searcher, processes: int, poll: float, **server_options):
    """The search service over ``make_searcher()`` in this process (``processes`` 1), else
    :class:`ServiceProcesses` given the same searcher as command-line ``searcher_args``."""
    from tfhash.serving.search_service import SearchServer

    if processes == 1:
        return SearchServer(make_searcher(), poll_seconds=poll, **server_options).start()
    return ServiceProcesses(searcher_args, processes, poll)


@contextlib.contextmanager
def serving_stack(root: str, poll: float = 0.5, rest_timeout: float = 1.0, processes: int = 1):
    """Version 1 of the fixture model and its index; the development model server (pinned
    ``models.config``, re-read as it changes, reloads confined to the model folder); a search
    service encoding in process (with REST) and one encoding through the model server, each in
    this process or (``processes`` > 1) as that many processes of one command. Yields
    ``(target, servers)`` where ``target`` describes them for the fuzzer."""
    from tfhash.serving.deployment import read_models_config, write_deployment
    from tfhash.serving.model_server import DevModelServer
    from tfhash.serving.requests import Limits
    from tfhash.serving.search_service import in_process_searcher, remote_searcher

    models, indexes, config = os.path.join(root, "models"), os.path.join(root, "indexes"), os.path.join(root, "tfs", "models.local.config")
    vectors, ids = database()
    push_version(models, indexes, 1, 0, vectors, ids)
    write_deployment(models, MODEL, os.path.dirname(config), index_base_dir=indexes)
    limits = Limits(max_batch=64, max_k=1000)
    model_server = DevModelServer(read_models_config(config), poll_seconds=poll, max_message_bytes=4 << 20, config_file=config,
                                  config_poll_seconds=poll, allowed_root=models, reload_api=True).start()  # fmt: skip
    limit_args = ["--max-batch", "64", "--max-k", "1000", "--max-request-mb", "1"]
    in_process = search_service(["--model-base-dir", models, "--index-base-dir", indexes, "--rest-port", "0", "--rest-timeout",
                                 str(rest_timeout), *limit_args], lambda: in_process_searcher(models, indexes, limits=limits),
                                processes, poll, rest_port=0, max_message_bytes=1 << 20,
                                rest_options={"header_timeout": rest_timeout, "body_timeout": rest_timeout})  # fmt: skip
    remote = search_service(["--model-server", model_server.address, "--model-name", MODEL, "--index-base-dir", indexes,
                             "--model-base-dir", models, *limit_args],
                            lambda: remote_searcher(model_server.address, MODEL, indexes, limits=limits, model_base_dir=models),
                            processes, poll, max_message_bytes=1 << 20)  # fmt: skip
    rest_port = in_process.rest_port
    target = Target(search={"in_process": in_process.address, "remote": remote.address}, rest_port=rest_port,
                    model_server=model_server.address, model_name=MODEL, feature="features", dim=DIM, bits=BITS, count=len(ids),
                    version=1, vectors=vectors, limits=limits, search_max_bytes=1 << 20, model_max_bytes=4 << 20,
                    rest_timeout=rest_timeout)  # fmt: skip
    try:
        yield target, {"model_server": model_server, "in_process": in_process, "remote": remote, "models": models,
                       "indexes": indexes, "config": config}  # fmt: skip
    finally:
        for server in (in_process, remote, model_server):
            server.stop(0)


class Load:
    """``clients`` threads searching ``queries`` (one per request, in turn) without pause; keeps
    every answer and every failure with its time."""

    def __init__(self, address: str, queries: np.ndarray, clients: int = 4, k: int = 5, examples: bool = False):
        self.address, self.queries, self.k, self.examples = address, queries, k, examples
        self.answers, self.failures = [], []
        self._answered = threading.Condition()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, offset: int) -> None:
        from tfhash.serving.errors import ServingError
        from tfhash.serving.search_client import SearchClient

        with SearchClient(self.address, own_connection=True) as client:  # spread over a service's processes
            i = offset
            while not self._stop.is_set():
                q = i % len(self.queries)
                i += 1
                started = time.monotonic()
                try:
                    if self.examples:
                        answer = client.search(examples=[vector_example(self.queries[q])], k=self.k)
                    else:
                        answer = client.search(features=self.queries[q : q + 1], k=self.k)
                    with self._answered:
                        self.answers.append((started, time.monotonic(), q, answer.model_version, answer.ids[0].tolist(),
                                             answer.distances[0].tolist()))  # fmt: skip
                        self._answered.notify_all()
                except ServingError as err:
                    self.failures.append((started, time.monotonic(), err.code.name, err.message))

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def wait_for_answers(self, count: int, version: str | None = None, seconds: float = 60.0) -> None:
        """Until ``count`` answers (of ``version``, if given) came back; an error after ``seconds``."""
        with self._answered:
            if not self._answered.wait_for(lambda: sum(version is None or a[3] == version for a in self.answers) >= count, seconds):
                raise TimeoutError(f"fewer than {count} answers{f' of version {version}' if version else ''} in {seconds:g} s; "
                                   f"failures: {self.failures[-3:]}")  # fmt: skip

    def first_answer_of(self, version: str) -> float | None:
        times = [a[1] for a in self.answers if a[3] == version]
        return min(times) if times else None

    def references(self, models: str, indexes: str) -> dict:
        """version -> the library's own search of the queries with that version's model and index,
        for every version that answered."""
        return {version: reference(os.path.join(models, version), os.path.join(indexes, version, "BFlat"), self.queries, self.k)[1]
                for version in {a[3] for a in self.answers}}  # fmt: skip

    def inconsistent(self, expected: dict) -> int:
        """Answers that differ from ``expected`` (:meth:`references`) of the version that answered."""
        return sum(ids != expected[v].ids[q].tolist() or d != expected[v].distances[q].tolist() for _, _, q, v, ids, d in self.answers)


def _copy_in_halves(source: str, target: str, pause: float) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    data = open(source, "rb").read()
    with open(target, "wb") as handle:
        handle.write(data[: len(data) // 2])
        handle.flush()
        time.sleep(pause)
        handle.write(data[len(data) // 2 :])


def copy_non_atomically(folders: list[tuple[str, str]], pause: float) -> float:
    """Publish ``(source, target)`` folders the wrong way: every ``saved_model.pb`` and
    ``manifest.json`` first, then each other file written in two halves, with ``pause`` seconds
    between steps. Returns the monotonic time the copy completed."""
    files = [(os.path.join(folder, name), os.path.join(target, os.path.relpath(os.path.join(folder, name), source)))
             for source, target in folders for folder, _, names in os.walk(source) for name in sorted(names)]  # fmt: skip
    first = [(source, target) for source, target in files if os.path.basename(source) in ("saved_model.pb", "manifest.json")]
    for source, target in first:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source, target)
    for source, target in files:
        if (source, target) not in first:
            time.sleep(pause)
            _copy_in_halves(source, target, pause)
    return time.monotonic()


def push_broken_versions(models: str, indexes: str, vectors, ids) -> None:
    """Version 2: a SavedModel that does not load (corrupt ``saved_model.pb``) with a good index of
    its own; version 3: a good model whose index fails its checksum."""
    push_version(models, indexes, 2, 11, vectors, ids)
    with open(os.path.join(models, "2", "saved_model.pb"), "r+b") as handle:
        handle.write(b"corrupt!")
    push_version(models, indexes, 3, 12, vectors, ids)
    with open(os.path.join(indexes, "3", "BFlat", "ids.npy"), "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x7f")


def hot_swap_trial(root: str, mode: str, poll: float = 0.5, clients: int = 4, processes: int = 1) -> dict:
    """Version 1 serves under load; broken versions 2 and 3 are pushed (and, remotely, the config
    regenerated); version 4 is copied file by file (then, remotely, published in the config).
    Returns counts, the versions that answered and how long after the copy completed version 4
    answered. ``processes`` > 1: the search service runs as that many processes of one command."""
    from tfhash.serving.deployment import read_models_config, write_deployment
    from tfhash.serving.model_server import DevModelServer
    from tfhash.serving.search_service import in_process_searcher, remote_searcher

    models, indexes, staging, tfs = (os.path.join(root, name) for name in ("models", "indexes", "staging", "tfs"))
    vectors, ids = database()
    push_version(models, indexes, 1, 0, vectors, ids)
    push_version(os.path.join(staging, "models"), os.path.join(staging, "indexes"), 4, 7, vectors, ids)
    model_server = None
    if mode == "remote":
        write_deployment(models, MODEL, tfs, index_base_dir=indexes)
        config = os.path.join(tfs, "models.local.config")
        model_server = DevModelServer(read_models_config(config), poll_seconds=poll, config_file=config, config_poll_seconds=poll).start()
        server = search_service(["--model-server", model_server.address, "--model-name", MODEL, "--index-base-dir", indexes,
                                 "--model-base-dir", models],
                                lambda: remote_searcher(model_server.address, MODEL, indexes, model_base_dir=models), processes, poll)  # fmt: skip
    else:
        server = search_service(["--model-base-dir", models, "--index-base-dir", indexes], lambda: in_process_searcher(models, indexes),
                                processes, poll)  # fmt: skip
    load = Load(server.address, vectors[:8], clients, examples=mode == "remote").start()
    try:
        load.wait_for_answers(20)  # the load runs on version 1
        push_broken_versions(models, indexes, vectors, ids)
        if model_server is not None:
            write_deployment(models, MODEL, tfs, index_base_dir=indexes)  # pins the pairs only: still [1]
        time.sleep(4 * poll)
        on_one_while_broken = {a[3] for a in load.answers} == {"1"}
        completed = copy_non_atomically([(os.path.join(staging, "models", "4"), os.path.join(models, "4")),
                                         (os.path.join(staging, "indexes", "4"), os.path.join(indexes, "4"))], 1.5 * poll)  # fmt: skip
        if model_server is not None:
            write_deployment(models, MODEL, tfs, index_base_dir=indexes)  # publish: [1, 4]
        with contextlib.suppress(TimeoutError):  # a version 4 that never answers is reported below
            load.wait_for_answers(50, "4")
    finally:
        load.stop()
        server.stop(0)
        if model_server is not None:
            model_server.stop(0)
    versions = [a[3] for a in sorted(load.answers)]
    expected = load.references(models, indexes)
    first_four = load.first_answer_of("4")
    # answers by version 1 to requests that started after version 4 first answered (any process)
    old_after_new = 0 if first_four is None else sum(a[3] == "1" and a[0] > first_four for a in load.answers)
    return {"mode": mode, "processes": processes, "poll_seconds": poll, "requests": len(load.answers) + len(load.failures), "failed": len(load.failures),
            "failures": sorted({f"{code}: {message[:120]}" for _, _, code, message in load.failures})[:5],
            "versions_answering": sorted(set(versions)), "stayed_on_1_while_broken": on_one_while_broken,
            "v4_served_after_copy_s": None if first_four is None else round(first_four - completed, 2),
            "flapped_back": old_after_new > 0, "old_after_new": old_after_new, "inconsistent_answers": load.inconsistent(expected),
            # the check above has teeth only if the two versions answer differently
            "versions_differ": len(expected) == 2 and expected["1"].ids.tolist() != expected["4"].ids.tolist()}  # fmt: skip


def sigterm_trial(root: str, kind: str, grace: float = 10.0, clients: int = 8, seconds: float = 1.5, processes: int = 1) -> dict:
    """One ``tfhash serve search`` (``kind="search"``, REST on and a health Watch stream open; with
    ``processes`` serving processes) or ``tfhash serve model`` process under load, sent SIGTERM;
    returns how it ended."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from tfhash.serving.client import ModelClient
    from tfhash.serving.deployment import write_deployment
    from tfhash.serving.errors import ServingError
    from tfhash.serving.search_client import SearchClient

    models, indexes = os.path.join(root, "models"), os.path.join(root, "indexes")
    vectors, ids = database()
    if not os.path.isdir(models):
        push_version(models, indexes, 1, 0, vectors, ids)
        write_deployment(models, MODEL, os.path.join(root, "tfs"), index_base_dir=indexes)
    if kind == "search":
        process, address = start_command(["serve", "search", "--model-base-dir", models, "--index-base-dir", indexes, "--port", "0",
                                       "--rest-port", "0", "--grace-seconds", str(grace), "--processes", str(processes)],
                                      "search service on ")  # fmt: skip
    else:
        process, address = start_command(["serve", "model", "--model-config-file", os.path.join(root, "tfs", "models.local.config"),
                                        "--port", "0", "--grace-seconds", str(grace)], "development model server on ")  # fmt: skip
    results, stop = [], threading.Event()
    watch = {"statuses": [], "ended_ok_at": None}

    def client_loop() -> None:
        client = SearchClient(address, timeout=30, own_connection=True) if kind == "search" else ModelClient(address, MODEL, version=1, timeout=30)
        with client:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    if kind == "search":
                        client.search(features=vectors[:8], k=10)
                    else:
                        client.encode_features(vectors[:8])
                    results.append((started, time.monotonic(), "OK"))
                except ServingError as err:
                    results.append((started, time.monotonic(), err.code.name))

    def watch_health() -> None:
        """Follow the health stream; it must end with OK (not be cut by the process exiting)."""
        name = health_pb2.HealthCheckResponse.ServingStatus.Name
        with grpc.insecure_channel(address) as channel:
            try:
                for response in health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=grace + 30):
                    watch["statuses"].append(name(response.status))
                watch["ended_ok_at"] = time.monotonic()
            except grpc.RpcError:
                pass

    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(clients)]
    if kind == "search":
        threads.append(threading.Thread(target=watch_health, daemon=True))
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(grace + 30)
    except subprocess.TimeoutExpired:
        process.kill()
        code = "killed"
    exited = time.monotonic()
    stop.set()
    for thread in threads:
        thread.join(30)
    before = [r for r in results if r[1] < signalled]
    in_flight = [r for r in results if r[0] < signalled <= r[1]]
    started_after = [r for r in results if r[0] >= signalled + 0.25]  # a quarter second for the signal to be handled
    return {"kind": kind, "processes": processes if kind == "search" else 1, "exit_code": code, "exit_after_s": round(exited - signalled, 2), "grace_s": grace,
            "answered_before": sum(r[2] == "OK" for r in before), "failed_before": sum(r[2] != "OK" for r in before),
            "in_flight_at_signal": len(in_flight), "in_flight_answered": sum(r[2] == "OK" for r in in_flight),
            "in_flight_refused": dict(Counter(r[2] for r in in_flight if r[2] != "OK")),
            "in_flight_started_before_s": round(max((signalled - r[0] for r in in_flight), default=0.0), 3),
            "in_flight_refused_at_s": sorted(round(r[1] - signalled, 3) for r in in_flight if r[2] != "OK"),
            "started_after_signal": len(started_after), "answered_after_signal": sum(r[2] == "OK" for r in started_after),
            # the stream ended with OK, before the process exited, after it said NOT_SERVING
            "health_stream_ended": (watch["ended_ok_at"] is not None and watch["ended_ok_at"] <= exited
                                    and watch["statuses"][-1:] == ["NOT_SERVING"]) if kind == "search" else None}  # fmt: skip


def largest_request(size: int, bits: int = 64, queries: int = 256, radius: int = 48, k: int = 1000, seed: int = 0) -> list[dict]:
    """The most expensive search a default service accepts (``max_batch`` queries, ``max_k``, a
    wide radius) over ``size`` codes: as the service searches now (k nearest, then the radius)
    and with the range search it used before. Time and peak resident memory above the start."""
    from tfhash.serving.searcher import ServedPair, VersionedSearcher

    from benchmarks.common import clustered_packed
    from tfhash.index import index_factory

    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 256, (64, bits // 8), dtype=np.uint8)
    index = index_factory(bits, "BFlat")
    index.add(clustered_packed(size, centres, rng))
    batch = clustered_packed(queries, centres, rng)
    searcher = VersionedSearcher("", "BFlat", lambda: [], lambda version: None)  # the service's search step alone
    pair = ServedPair(1, None, index, "", None)
    ways = {"k nearest, then radius (now)": lambda: searcher._neighbours(pair.index.search(batch, k), radius, False),
            "range search, then k (before)": lambda: [r.ids[:k] for r in index.range_search(batch, radius)]}  # fmt: skip
    rows = []
    for name, search in ways.items():
        found, seconds, extra = measured(search)
        results = sum(len(r.ids) if hasattr(r, "ids") else len(r) for r in found)
        rows.append({"way": name, "codes": size, "queries": queries, "radius": radius, "k": k, "seconds": round(seconds, 3),
                     "peak_extra_mib": round(extra / 2**20, 1), "results": results})  # fmt: skip
    return rows


def measured(function):
    """``(function(), seconds, peak resident bytes above the start)``, the peak sampled every 2 ms."""
    import psutil

    process, done = psutil.Process(), threading.Event()
    start = peak = process.memory_info().rss

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    result = function()
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    return result, seconds, max(peak - start, 0)


def _seconds_as_text(rows: list[dict]) -> list[dict]:
    """Rows with their ``*_s`` seconds as two-decimal text and dicts as ``key n`` text, for tables."""
    def cell(key, value):
        if key.endswith("_s") and isinstance(value, float):
            return f"{value:.2f}"
        return ", ".join(f"{k} {n}" for k, n in value.items()) or "-" if isinstance(value, dict) else value

    return [{key: cell(key, value) for key, value in row.items()} for row in rows]


def markdown(payload: dict) -> str:
    fuzz_summary = payload["fuzz"]
    trials = payload["sigterm"]
    clean = {kind: sum(t["exit_code"] == 0 and t["exit_after_s"] <= t["grace_s"] for t in trials if t["kind"] == kind)
             for kind in ("search", "model")}  # fmt: skip
    total = {kind: sum(t["kind"] == kind for t in trials) for kind in clean}
    per = [{"target / category": key, "sent": value["sent"], "outcomes": ", ".join(f"{k} {n}" for k, n in sorted(value["outcomes"].items()))}
           for key, value in fuzz_summary["per_category"].items()]  # fmt: skip
    lines = [
        "# Serving robustness",
        "",
        f"`{payload['command']}` (seed {payload['seed']}, {payload['environment']['date']}, "
        f"{payload['environment']['cpus']} CPUs). Every server runs on loopback in the same process as the fuzzer, "
        "except the SIGTERM trials (their own processes)"
        + (f", and except the search services, each run as `tfhash serve search --processes {payload['processes']}` "
           "(a supervising parent and that many serving processes on one port)." if payload.get("processes", 1) > 1 else "."),
        "",
        f"## Fuzz: {fuzz_summary['requests']} requests in {fuzz_summary['seconds']} s",
        "",
        f"Failures: {fuzz_summary['failures'] or 'none'} (fault = INTERNAL / UNKNOWN / 500; hang = no answer and no close "
        "within the deadline; bad input answered OK; valid request refused; unexpected code).",
        "",
        markdown_table(per, ["target / category", "sent", "outcomes"]),
        "",
        "## Hot swap under load",
        "",
        "Broken versions 2 (a SavedModel that does not load) and 3 (an index failing its checksum) are pushed under load, "
        "then version 4 is copied file by file; `v4_served_after_copy_s` counts from the last byte written; "
        "`old_after_new` counts answers by version 1 to requests that started after version 4 first answered "
        "(`flapped_back`: any), on whichever process.",
        "",
        markdown_table(_seconds_as_text(payload["hot_swap"]), ["mode", "processes", "requests", "failed", "versions_answering", "stayed_on_1_while_broken",
                                                               "v4_served_after_copy_s", "poll_seconds", "flapped_back", "old_after_new", "inconsistent_answers", "versions_differ"]),  # fmt: skip
        "",
        "## SIGTERM under load",
        "",
        f"Exit code 0 within the grace period: search service {clean['search']} of {total['search']}, model server "
        f"{clean['model']} of {total['model']}. Requests in flight at the signal were answered (they were in a handler) or "
        "refused UNAVAILABLE before they ran; requests started 0.25 s or more after it: none answered.",
        "",
        markdown_table(_seconds_as_text(trials), ["kind", "processes", "exit_code", "exit_after_s", "grace_s", "answered_before", "failed_before",
                                                  "in_flight_at_signal", "in_flight_answered", "in_flight_refused", "started_after_signal",
                                                  "answered_after_signal", "health_stream_ended"]),  # fmt: skip
        "",
        "## The largest request",
        "",
        "The costliest search the default limits accept, over BFlat, both ways in the same run:",
        "",
        markdown_table(payload["largest_request"], ["way", "codes", "queries", "radius", "k", "seconds", "peak_extra_mib", "results"]),
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--requests", type=int, default=12_000)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--processes", type=int, default=1,
                        help="run the search services as this many processes of one command (tfhash serve search --processes)")
    parser.add_argument("--name", default="serving_robustness", help="results file name")
    args = parser.parse_args(argv)
    command = "python -m tests.serving_robustness " + " ".join(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory() as root:
        with serving_stack(os.path.join(root, "fuzz"), processes=args.processes) as (target, servers):
            tally = fuzz(target, args.requests, args.seed, allowed_root=servers["models"])
        print("fuzz:", tally.summary()["failures"] or "no failures", flush=True)
        swaps = [hot_swap_trial(os.path.join(root, f"swap-{mode}"), mode, processes=args.processes) for mode in ("in_process", "remote")]
        print("hot swap:", swaps, flush=True)
        trials = [sigterm_trial(os.path.join(root, "sigterm"), kind, processes=args.processes) for kind in ("search", "model")
                  for _ in range(args.trials)]  # fmt: skip
        print("sigterm:", [(t["kind"], t["exit_code"], t["exit_after_s"]) for t in trials], flush=True)
    largest = largest_request(args.size, seed=args.seed)
    payload = {"command": command.strip(), "seed": args.seed, "processes": args.processes, "fuzz": tally.summary(), "hot_swap": swaps, "sigterm": trials,
               "largest_request": largest}  # fmt: skip
    from benchmarks.common import environment

    write_results(args.name, payload, markdown({**payload, "environment": environment()}))


if __name__ == "__main__":
    main()
