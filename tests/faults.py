"""Faults a deployment meets, measured: the fault campaign.

    python -m tests.faults [--trials 10] [--seed 0] [--name faults]

Every row runs real processes of the ``tfhash`` command on loopback, under load from client
threads (each on a connection of its own) whose every answer is compared with the library's own
search; a row counts what was answered wrongly and what was lost.

* **search_child_killed**: SIGKILL of one of the two serving processes of ``tfhash serve search
  --processes 2``: the failed requests and their codes, the time until the supervisor's new
  process serves (the service reports every process ready), the rate after against before.
* **parent_killed**: SIGKILL of the supervising parent: the time until every child has exited and
  the port can be bound again, the failed requests' codes and the longest a client waited for one,
  and a new service serving on it.
* **model_server_killed**: SIGKILL of ``tfhash serve model`` while a search service encodes through
  it: code queries keep being answered; feature queries fail UNAVAILABLE naming the model server;
  both are answered again once a model server returns on the port.
* **full_disk_index** / **full_disk_push**: an index version saved, and a model pushed by TFX's own
  Pusher executor, onto a filesystem too small for it (a tmpfs the campaign mounts; without the
  privilege, a file-size limit in a child process) while a service serves the version before:
  the error, what is left where a service looks, the service's answers.
* **memory_under_load**: 32 clients each sending the costliest request a default service accepts
  (256 queries, k 1000, over a million items): the service's peak resident memory against the
  bound its limits set.
* **pipeline_killed**: ``tfhash pipeline run`` SIGKILLed (its process group) in Transform, the
  Trainer, the RetrievalEvaluator, the Pusher or the IndexBuilder, then the same command again,
  while a search service watches the run's folders: the rerun's exit, what ML Metadata served
  from its cache, every pushed version's index verified against it, what the service served.
* **strangers**: the access matrix against services with TLS and a token, an expired server
  certificate, and client certificates: each request's outcome, and how many reached a search.
* **two_runs_one_directory**: a second ``tfhash pipeline run`` on a run directory the first holds:
  its exit and message, the first's completion, the versions left.
* **damaged_version**: a newer version published with a flipped byte in its index codes, a
  truncated SavedModel variables file, no index manifest, or an index naming another model
  version: the service keeps the version before, ``tfhash index verify`` exits 2 naming the reason.

Writes ``benchmarks/results/<name>.{json,md}``; ``tests/test_faults.py`` runs one trial of each.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

import numpy as np
from tfhash.serving.processes import start_command

from benchmarks.common import RESULTS_DIR, markdown_table, write_results
from tests.serving_fixtures import database, push_version, reference, wait_for

MODEL = "vectors"
#: Client threads of the load (each with a connection of its own).
CLIENTS = 6


class Load:
    """Client threads searching ``address`` without pause, each on its own connection; every
    outcome is recorded as (start, end, kind, status, right, message, client) where ``right`` says
    whether an answer equals ``expected`` (None for a failure). ``kinds``: the query kinds the threads
    take in turn, ``features`` and ``codes``."""

    def __init__(self, address: str, queries: dict, expected, kinds=("features",), clients: int = CLIENTS):
        self.address, self.queries, self.expected = address, queries, expected
        self.k, self.timeout = 10, 10.0  # each request's k and deadline
        self.outcomes: list[tuple[float, float, str, str, bool | None, str, int]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(kinds[i % len(kinds)], i), daemon=True) for i in range(clients)]

    def _run(self, kind: str, number: int) -> None:
        from tfhash.serving.errors import ServingError
        from tfhash.serving.search_client import SearchClient

        with SearchClient(self.address, timeout=self.timeout, own_connection=True) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    answer = client.search(**{kind: self.queries[kind]}, k=self.k)
                    outcome = ("OK", np.array_equal(np.stack(answer.ids), self.expected.ids), "")
                except ServingError as err:
                    outcome = (err.code.name, None, err.message)
                    time.sleep(0.01)  # a refused client retries, as a client would, without spinning
                self.outcomes.append((started, time.monotonic(), kind, *outcome, number))

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def between(self, start: float, end: float, kind: str | None = None) -> list:
        return [o for o in self.outcomes if start <= o[0] < end and (kind is None or o[2] == kind)]

    def wrong(self) -> int:
        return sum(o[4] is False for o in self.outcomes)

    def interruptions(self) -> Counter:
        """Per client, its runs of consecutive failures: the request a killed process held fails,
        and so do the client's retries while its channel connects again (gRPC fails a call at once
        while the channel is in TRANSIENT_FAILURE); one run is one interruption."""
        runs: Counter = Counter()
        for client in {o[6] for o in self.outcomes}:
            mine = sorted((o for o in self.outcomes if o[6] == client), key=lambda o: o[0])
            runs[client] = sum(o[3] != "OK" and (i == 0 or mine[i - 1][3] == "OK") for i, o in enumerate(mine))
        return runs


def rate(outcomes: list, seconds: float) -> float:
    return round(sum(o[3] == "OK" for o in outcomes) / seconds, 1)


@contextlib.contextmanager
def fixture_versions(root: str):
    """Version 1 of the fixture model and its index under ``root``; yields the folders, the
    queries (8 feature rows and their packed codes) and the library's answer."""
    models, indexes = os.path.join(root, "models"), os.path.join(root, "indexes")
    vectors, ids = database()
    push_version(models, indexes, 1, 0, vectors, ids)
    packed, expected = reference(os.path.join(models, "1"), os.path.join(indexes, "1", "BFlat"), vectors[:8], 10)
    yield {"models": models, "indexes": indexes, "vectors": vectors, "ids": ids, "expected": expected,
           "queries": {"features": vectors[:8], "codes": packed}}  # fmt: skip


def _search_command(setup: dict, *extra: str) -> list[str]:
    return ["serve", "search", "--index-base-dir", setup["indexes"], "--poll-seconds", "0.5", "--grace-seconds", "1", *extra]


def _status(address: str) -> dict:
    from tfhash.serving.search_client import SearchClient

    try:
        with SearchClient(address, timeout=2, own_connection=True) as client:
            status = client.status()
        return {"ready": status.ready, "processes_ready": status.processes_ready, "version": status.model_version}
    except Exception:  # noqa: BLE001 - not answering yet
        return {"ready": False, "processes_ready": 0, "version": ""}


def _port_free(port: int) -> bool:
    """Whether a server could bind ``port`` now (with ``SO_REUSEADDR``, as servers bind: the
    clients' connections in TIME_WAIT do not hold it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _kill(process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(process if isinstance(process, int) else process.pid, signal.SIGKILL)


def _end(process) -> None:
    """Stop a :func:`start_command` process that the trial may have killed."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _serving_children(pid: int) -> dict[int, str]:
    """The serving processes of a :class:`~tfhash.serving.processes.ProcessFront` parent: pid ->
    the status file it writes once it serves."""
    import psutil
    from tfhash.serving.shared_status import slot_path

    found = {}
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error, ValueError, IndexError):
            settings = json.loads(child.cmdline()[3])
            found[child.pid] = slot_path(settings["status_dir"], settings["slot"])
    return found


def search_child_killed(setup: dict, rng: random.Random, load_seconds: float = 1.5) -> dict:
    """One trial: SIGKILL one of the two processes of a service under load. Back: the
    supervisor's new process has written its status (it serves, as the service's start counts it)
    and the service reports both processes ready."""
    process, address = start_command(_search_command(setup, "--model-base-dir", setup["models"], "--port", "0", "--processes", "2"),
                                     "search service on ")  # fmt: skip
    try:
        with Load(address, setup["queries"], setup["expected"]) as load:
            time.sleep(load_seconds)
            first = _serving_children(process.pid)
            victim = rng.choice(sorted(first))
            killed = time.monotonic()
            _kill(victim)

            def back() -> bool:
                new = {pid: status for pid, status in _serving_children(process.pid).items() if pid not in first}
                return bool(new) and all(os.path.isfile(status) for status in new.values()) and _status(address)["processes_ready"] == 2

            recovered = wait_for(back, 120)
            back_at = time.monotonic()
            time.sleep(load_seconds)
            end = time.monotonic()
        failures = [o for o in load.outcomes if o[3] != "OK"]
        per_client = Counter(o[6] for o in failures)
        return {"failed": len(failures), "failure_codes": dict(Counter(o[3] for o in failures)), "clients_failed": len(per_client),
                "max_failures_one_client": max(per_client.values(), default=0),
                "max_interruptions_one_client": max(load.interruptions().values(), default=0), "wrong": load.wrong(),
                "answered": sum(o[3] == "OK" for o in load.outcomes), "recovered": recovered, "restart_s": round(back_at - killed, 2),
                "rate_before": rate(load.between(killed - load_seconds, killed), load_seconds),
                "rate_during": rate(load.between(killed, back_at), max(back_at - killed, 1e-3)),
                "rate_after": rate(load.between(back_at, end), end - back_at), "service_alive": process.poll() is None}  # fmt: skip
    finally:
        _end(process)


def parent_killed(setup: dict, rng: random.Random) -> dict:
    """One trial: SIGKILL the supervising parent of a two-process service under load; then a new
    service on the same port."""
    process, address = start_command(_search_command(setup, "--model-base-dir", setup["models"], "--port", "0", "--processes", "2"),
                                     "search service on ")  # fmt: skip
    port, children = int(address.rsplit(":", 1)[1]), sorted(_serving_children(process.pid))
    with Load(address, setup["queries"], setup["expected"]) as load:
        time.sleep(0.5 + rng.random())
        killed = time.monotonic()
        _kill(process)
        process.wait()
        import psutil

        exited = wait_for(lambda: not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in children), 60)
        children_exit_s = time.monotonic() - killed
        freed = wait_for(lambda: _port_free(port), 60)
        port_free_s = time.monotonic() - killed
    again, _ = start_command(_search_command(setup, "--model-base-dir", setup["models"], "--port", str(port), "--processes", "2"),
                             "search service on ")  # fmt: skip
    try:
        with Load(address, setup["queries"], setup["expected"]) as after:
            time.sleep(1.0)
        serves_again = sum(o[3] == "OK" for o in after.outcomes) > 0 and after.wrong() == 0
    finally:
        _end(again)
    failures = [o for o in load.outcomes if o[3] != "OK"]
    longest = max(failures, key=lambda o: o[1] - o[0], default=None)  # the failure a client waited longest for, as it read
    return {"children_exited": exited, "children_exit_s": round(children_exit_s, 2), "port_freed": freed, "port_free_s": round(port_free_s, 2),
            "wrong": load.wrong() + after.wrong(), "failure_codes": dict(Counter(o[3] for o in failures)),
            "longest_failure_s": round(longest[1] - longest[0], 2) if longest else 0.0,
            "longest_failure": f"{longest[3]}: {longest[5][:120]}" if longest else "",
            "new_service_serves": serves_again}  # fmt: skip


def model_server_killed(setup: dict, rng: random.Random, outage_seconds: float = 2.0) -> dict:
    """One trial: SIGKILL the model server a search service encodes through, under load of code and
    feature queries; then a model server on the same port again."""
    from tfhash.serving.deployment import write_deployment

    tfs = os.path.join(os.path.dirname(setup["models"]), "tfs")
    if not os.path.isdir(tfs):
        write_deployment(setup["models"], MODEL, tfs, index_base_dir=setup["indexes"])
    model_args = ["serve", "model", "--model-config-file", os.path.join(tfs, "models.local.config"), "--poll-seconds", "0.5"]
    model, model_address = start_command([*model_args, "--port", "0"], "development model server on ")
    port = int(model_address.rsplit(":", 1)[1])
    search, address = start_command(_search_command(setup, "--model-server", model_address, "--model-name", MODEL, "--port", "0"),
                                    "search service on ")  # fmt: skip
    model_again = None
    try:
        with Load(address, setup["queries"], setup["expected"], kinds=("features", "codes")) as load:
            time.sleep(0.5 + rng.random())
            killed = time.monotonic()
            _kill(model)
            model.wait()
            time.sleep(outage_seconds)
            restarted = time.monotonic()
            model_again, _ = start_command([*model_args, "--port", str(port)], "development model server on ")
            features_back = wait_for(lambda: any(o[2] == "features" and o[3] == "OK" and o[0] > restarted for o in load.outcomes), 60)
            back = time.monotonic()
            time.sleep(0.5)
        outage = load.between(killed + 0.2, restarted)  # a request sent just before the kill may have been answered
        messages = {o[5] for o in outage if o[2] == "features" and o[3] != "OK"}
        return {"codes_answered_in_outage": sum(o[3] == "OK" for o in outage if o[2] == "codes"),
                "codes_failed_in_outage": sum(o[3] != "OK" for o in outage if o[2] == "codes"),
                "features_answered_in_outage": sum(o[3] == "OK" for o in outage if o[2] == "features"),
                "features_failure_codes": dict(Counter(o[3] for o in outage if o[2] == "features" and o[3] != "OK")),
                "features_messages_name_the_model_server": bool(messages) and all(model_address in m for m in messages),
                "a_message": sorted(messages)[0][:160] if messages else "",
                "features_back": features_back, "features_back_s": round(back - restarted, 2), "wrong": load.wrong()}  # fmt: skip
    finally:
        _end(search)
        _end(model)
        if model_again is not None:
            _end(model_again)


@contextlib.contextmanager
def small_filesystem(folder: str, size_bytes: int):
    """A tmpfs of ``size_bytes`` mounted at ``folder`` (yields "tmpfs"), or, without the privilege
    to mount, the folder as it is (yields None: the caller limits file sizes instead)."""
    os.makedirs(folder, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", folder], capture_output=True).returncode == 0
    try:
        yield "tmpfs" if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", folder], check=False)


#: Run in a child process: save an index (or push a model) with the file-size limit of argv[2]
#: bytes (0: none), print the error as JSON. SIGXFSZ is ignored so that a write over the limit
#: fails with EFBIG instead of killing the process.
_CHILD = r"""
import json, resource, signal, sys
limit, what, args = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
if limit:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    if what == "index":
        import numpy as np
        from tfhash.index import index_factory, save_index
        index = index_factory(64, "BFlat")
        index.add(np.random.default_rng(0).integers(0, 256, (args["count"], 8), dtype=np.uint8), np.arange(args["count"]))
        save_index(index, args["path"], model_version=args["version"])
    else:
        from tests.faults import push_with_tfx
        push_with_tfx(args["model"], args["base"], args["pushed"])
    print(json.dumps({"error": None}))
except Exception as err:  # OSError from tfhash; TensorFlow's file errors from TFX's Pusher
    print(json.dumps({"error": str(err), "errno": getattr(err, "errno", None), "type": type(err).__name__}))
"""


def _in_child(limit: int, what: str, **args) -> dict:
    result = subprocess.run([sys.executable, "-c", _CHILD, str(limit), what, json.dumps(args)], capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=600)  # fmt: skip
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"the child failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(lines[-1])


def push_with_tfx(model_dir: str, base_directory: str, pushed_uri: str) -> None:
    """Push the SavedModel ``model_dir`` to ``base_directory`` with TFX's own Pusher executor (a
    blessed model, a filesystem destination), as the pipeline's Pusher does."""
    from tfx.components.pusher import executor
    from tfx.proto import pusher_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    model, blessing, pushed = standard_artifacts.Model(), standard_artifacts.ModelBlessing(), standard_artifacts.PushedModel()
    model.uri, pushed.uri = os.path.dirname(model_dir), pushed_uri  # the Pusher reads <model uri>/Format-Serving
    blessing.uri = tempfile.mkdtemp()
    open(os.path.join(blessing.uri, "BLESSED"), "w").close()
    blessing.set_int_custom_property("blessed", 1)
    destination = pusher_pb2.PushDestination(filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=base_directory))
    executor.Executor().Do({"model": [model], "model_blessing": [blessing]}, {"pushed_model": [pushed]},
                           {"push_destination": proto_utils.proto_to_json(destination)})  # fmt: skip


def _visible_versions(folder: str) -> list[str]:
    """What a service listing ``folder`` would take for versions (names of digits)."""
    return sorted(name for name in os.listdir(folder) if name.isdigit()) if os.path.isdir(folder) else []


def _leftovers(folder: str) -> list[str]:
    """Hidden staging entries (``.<name>.tmp-...``) anywhere under ``folder``."""
    return sorted(os.path.relpath(os.path.join(d, n), folder) for d, dirs, files in os.walk(folder) for n in dirs + files if n.startswith("."))


def full_disk(setup: dict, root: str, what: str) -> dict:
    """One trial: an index version (``what="index"``) or a model push (``"push"``) onto a filesystem
    too small for it, while a service serves version 1 from it."""
    from tfhash.index import load_index

    disk = os.path.join(root, f"disk-{what}-{time.time_ns()}")
    with small_filesystem(disk, 2 << 20) as kind:
        models, indexes = os.path.join(disk, "models"), os.path.join(disk, "indexes")
        shutil.copytree(os.path.join(setup["models"], "1"), os.path.join(models, "1"))
        shutil.copytree(os.path.join(setup["indexes"], "1"), os.path.join(indexes, "1"))
        limit = 0 if kind else 1 << 20
        process, address = start_command(["serve", "search", "--index-base-dir", indexes, "--model-base-dir", models, "--port", "0",
                                          "--poll-seconds", "0.5", "--grace-seconds", "1"], "search service on ")  # fmt: skip
        try:
            with Load(address, setup["queries"], setup["expected"]) as load:
                time.sleep(0.5)
                if what == "index":
                    path = os.path.join(indexes, "2", "BFlat")
                    result = _in_child(limit, "index", count=400_000, path=path, version="2")
                    left = {"version_2_index_exists": os.path.isdir(path), "version_2_index_loads": _loads(load_index, path)}
                else:
                    bigger = os.path.join(root, "bigger-model", "Format-Serving")
                    if not os.path.isdir(bigger):
                        shutil.copytree(os.path.join(setup["models"], "1"), bigger)
                        with open(os.path.join(bigger, "variables", "padding.bin"), "wb") as file:  # a model larger than the disk
                            file.write(os.urandom(3 << 20))
                    result = _in_child(limit, "push", model=bigger, base=models, pushed=os.path.join(root, f"pushed-{time.time_ns()}"))
                    partial = [v for v in _visible_versions(models) if v != "1"]
                    left = {"partial_model_versions": len(partial),
                            "partial_has_saved_model_pb": any(os.path.isfile(os.path.join(models, v, "saved_model.pb")) for v in partial)}  # fmt: skip
                time.sleep(1.5)  # a few looks of the service at the folders
                status = _status(address)
            left["hidden_leftovers"] = _leftovers(disk)
        finally:
            _end(process)
    return {"filesystem": kind or f"file-size limit {limit >> 20} MiB", "error": result.get("error"),
            "errno": errno.errorcode.get(result.get("errno"), result.get("errno")), **left,
            "serving_version": status["version"], "answered": sum(o[3] == "OK" for o in load.outcomes),
            "failed": sum(o[3] != "OK" for o in load.outcomes), "wrong": load.wrong()}  # fmt: skip


#: The damages of :func:`damaged_version`: what is done to version 2 once it is published.
DAMAGES = ("flipped byte in index codes", "truncated SavedModel variables", "missing index manifest", "index names another model version")


def _damage(models: str, indexes: str, damage: str, rng: random.Random) -> None:
    index = os.path.join(indexes, "2", "BFlat")
    if damage == DAMAGES[0]:
        path = os.path.join(index, "codes.npy")
        with open(path, "r+b") as file:
            size = os.path.getsize(path)
            file.seek(rng.randrange(128, size))  # past the .npy header: a code's byte
            byte = file.read(1)
            file.seek(-1, os.SEEK_CUR)
            file.write(bytes([byte[0] ^ (1 << rng.randrange(8))]))
    elif damage == DAMAGES[1]:
        variables = os.path.join(models, "2", "variables")
        path = max((os.path.join(variables, n) for n in os.listdir(variables) if n.startswith("variables.data")), key=os.path.getsize)
        os.truncate(path, os.path.getsize(path) // 2)
    elif damage == DAMAGES[2]:
        os.remove(os.path.join(index, "manifest.json"))
    else:
        path = os.path.join(index, "manifest.json")
        with open(path) as file:
            manifest = json.load(file)
        manifest["model"]["version"] = "7"
        with open(path, "w") as file:
            json.dump(manifest, file)


def damaged_version(setup: dict, root: str, damage: str, rng: random.Random, watch_seconds: float = 2.0) -> dict:
    """One trial: version 2 (another model: its answers differ) published whole, then damaged on
    disk before the service looks, while the service serves version 1 under load."""
    here = os.path.join(root, f"damaged-{time.time_ns()}")
    models, indexes, staged = os.path.join(here, "models"), os.path.join(here, "indexes"), os.path.join(here, "staged")
    shutil.copytree(os.path.join(setup["models"], "1"), os.path.join(models, "1"))
    shutil.copytree(os.path.join(setup["indexes"], "1"), os.path.join(indexes, "1"))
    push_version(os.path.join(staged, "models"), os.path.join(staged, "indexes"), 2, 1, setup["vectors"], setup["ids"])
    process, address = start_command(["serve", "search", "--index-base-dir", indexes, "--model-base-dir", models, "--port", "0",
                                      "--poll-seconds", "0.3", "--grace-seconds", "1"], "search service on ")  # fmt: skip
    try:
        with Load(address, setup["queries"], setup["expected"]) as load:
            time.sleep(0.5)
            # published, then damaged at once (the service looks every 0.3 s; a look between the two
            # would serve the whole version 2, which is right and which the answers would show)
            os.rename(os.path.join(staged, "models", "2"), os.path.join(models, "2"))
            os.rename(os.path.join(staged, "indexes", "2"), os.path.join(indexes, "2"))
            _damage(models, indexes, damage, rng)
            time.sleep(watch_seconds)
            status = _status(address)
        verify = subprocess.run([sys.executable, "-m", "tfhash.cli", "index", "verify", os.path.join(indexes, "2"), "--model-dir",
                                 os.path.join(models, "2")], capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})  # fmt: skip
        reason = next((json.loads(line).get("error", "") for line in verify.stdout.splitlines() if line.startswith("{")), "") \
            or verify.stderr.strip().splitlines()[-1]  # fmt: skip
        logged = "".join(process.log)
    finally:
        _end(process)
    versions = Counter(o[3] for o in load.outcomes)
    return {"damage": damage, "serving_version": status["version"], "answered": versions.get("OK", 0),
            "failed": sum(n for code, n in versions.items() if code != "OK"), "wrong": load.wrong(),
            "verify_exit": verify.returncode, "verify_reason": reason[:200],
            "service_logged_the_refusal": "version 2" in logged or "/2/" in logged}  # fmt: skip


def _loads(load, path) -> bool:
    try:
        load(path)
        return True
    except Exception:  # noqa: BLE001 - any refusal counts as not loading
        return False


def memory_under_load(setup: dict, root: str, clients: int = 32, seconds: float = 8.0, size: int = 1_000_000, seed: int = 0) -> dict:
    """``clients`` clients each sending, back to back, the costliest request a default service
    accepts (``--max-batch`` 256 queries of codes with ``--max-k`` 1000) to a service over a
    ``size``-item index of version 1; the service's resident memory sampled every 20 ms against
    the bound its limits set, and every answer compared with the library's search."""
    import psutil

    from tfhash.artifacts import signature_fingerprint
    from tfhash.index import index_factory, load_index

    here = os.path.join(root, f"memory-{time.time_ns()}")
    models, indexes = os.path.join(here, "models"), os.path.join(here, "indexes")
    shutil.copytree(os.path.join(setup["models"], "1"), os.path.join(models, "1"))
    rng = np.random.default_rng(seed)
    index = index_factory(setup["queries"]["codes"].shape[1] * 8, "BFlat")
    index.add(rng.integers(0, 256, (size, index.bits // 8), dtype=np.uint8), np.arange(size, dtype=np.int64))
    index.save(os.path.join(indexes, "1", "BFlat"), model_version="1", signature_fingerprint=signature_fingerprint(os.path.join(models, "1")))
    queries = rng.integers(0, 256, (256, index.bits // 8), dtype=np.uint8)
    expected = load_index(os.path.join(indexes, "1", "BFlat")).search(queries, 1000)
    process, address = start_command(["serve", "search", "--index-base-dir", indexes, "--model-base-dir", models, "--port", "0",
                                      "--grace-seconds", "1"], "search service on ")  # fmt: skip
    try:
        service = psutil.Process(process.pid)
        idle = service.memory_info().rss
        load = Load(address, {"codes": queries}, expected, kinds=("codes",), clients=clients)
        load.k, load.timeout = 1000, 120.0  # queued behind the other clients' requests, not dropped
        peak, stop = idle, time.monotonic() + seconds
        with load:
            while time.monotonic() < stop:
                peak = max(peak, service.memory_info().rss)
                time.sleep(0.02)
        latencies = sorted(o[1] - o[0] for o in load.outcomes if o[3] == "OK")
    finally:
        _end(process)
    max_message, max_rpcs = 8 << 20, 128  # the service's defaults: --max-request-mb 8, max_concurrent_rpcs 128
    answer_bytes = 256 * 1000 * (10 + 5)  # ids (varint, up to 10 bytes) and distances (float) of one answer
    bound = max_rpcs * (max_message + answer_bytes)
    return {"clients": clients, "index_items": size, "answered": sum(o[3] == "OK" for o in load.outcomes),
            "failure_codes": dict(Counter(o[3] for o in load.outcomes if o[3] != "OK")), "wrong": load.wrong(),
            "p50_s": round(latencies[len(latencies) // 2], 3) if latencies else None, "idle_mib": round(idle / 2**20, 1),
            "peak_mib": round(peak / 2**20, 1), "peak_above_idle_mib": round((peak - idle) / 2**20, 1),
            "bound_above_idle_mib": round(bound / 2**20, 1)}  # fmt: skip


#: The stages the pipeline is killed in (an execution of a component type whose name holds one of them).
PIPELINE_STAGES = ("Transform", "Trainer", "RetrievalEvaluator", "Pusher", "IndexBuilder")
#: ML Metadata's execution states (metadata_store.proto).
_RUNNING, _COMPLETE, _CACHED = 2, 3, 5


def executions(metadata: str) -> list[tuple[str, int]]:
    """(component type name, state) of every execution ML Metadata holds, in order; read-only, so
    that a run writing it meanwhile is not disturbed ([] while the file does not exist)."""
    import sqlite3

    if not os.path.isfile(metadata):
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"file:{metadata}?mode=ro", uri=True, timeout=1)) as db:
            return db.execute("SELECT Type.name, Execution.last_known_state FROM Execution JOIN Type ON Type.id = Execution.type_id "
                              "ORDER BY Execution.id").fetchall()  # fmt: skip
    except sqlite3.Error:  # the schema not written yet, or locked for a moment
        return []


def _running(metadata: str) -> str | None:
    return next((name.rsplit(".", 1)[-1] for name, state in reversed(executions(metadata)) if state == _RUNNING), None)


def tiny_pipeline_config(root: str, name: str) -> str:
    """The config file of the suite's small MNIST run (400 examples a split, 16-bit SCDH, 3 epochs)."""
    path = os.path.join(root, f"{name}.json")
    with open(path, "w") as file:
        json.dump({"name": "tiny-mnist", "dataset": "mnist", "limit": 400, "run_dir": os.path.join(root, name),
                   "training": {"method": "scdh", "bits": 16, "epochs": 3, "batch_size": 64}, "map_threshold": 0.2}, file)  # fmt: skip
    return path


def pipeline_killed(root: str, stage: str, rng: random.Random) -> dict:
    """One trial: ``tfhash pipeline run`` on a fresh run directory, SIGKILLed (its whole process
    group) a random 0-1 s (the Pusher: 0-0.05 s) after an execution of ``stage`` starts, then the
    same command again;
    a search service watches the run's push and index folders from before the first run to the end."""
    from tfhash.artifacts import RunLayout, list_versions

    config = tiny_pipeline_config(root, f"run-{time.time_ns()}")
    layout = RunLayout.from_config_file(config)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    service, address = start_command(["serve", "search", "--config", config, "--port", "0", "--poll-seconds", "0.3"], "search service on ")
    served: set[str] = set()
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            version = _status(address)["version"]
            if version:
                served.add(version)
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        started = time.monotonic()
        first = subprocess.Popen([sys.executable, "-m", "tfhash.cli", "pipeline", "run", "--config", config], env=env, start_new_session=True,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + 900
        while first.poll() is None and stage not in (_running(layout.metadata) or "") and time.monotonic() < deadline:
            time.sleep(0.01)
        reached = first.poll() is None and stage in (_running(layout.metadata) or "")
        time.sleep(rng.random() * (0.05 if stage == "Pusher" else 1.0))  # the Pusher's copy of a small model takes a fraction of a second
        killed_in = (_running(layout.metadata) or "between components") if first.poll() is None else "after the run ended"
        with contextlib.suppress(ProcessLookupError):  # the run may have ended meanwhile
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        killed_after = time.monotonic() - started
        before = Counter(state for _, state in executions(layout.metadata))
        rerun_start = time.monotonic()
        again = subprocess.run([sys.executable, "-m", "tfhash.cli", "pipeline", "run", "--config", config], env=env, capture_output=True,
                               text=True, timeout=1800)  # fmt: skip
        rerun_s = time.monotonic() - rerun_start
        after = executions(layout.metadata)[sum(before.values()):]
        models, indexes = list_versions(layout.serving), sorted(n for n in os.listdir(layout.indexes) if n.isdigit()) if os.path.isdir(layout.indexes) else []
        verified = [subprocess.run([sys.executable, "-m", "tfhash.cli", "index", "verify", os.path.join(layout.indexes, str(v)),
                                    "--model-dir", os.path.join(layout.serving, str(v))], capture_output=True, env=env).returncode == 0
                    for v in models]  # fmt: skip
        wait_for(lambda: _status(address)["version"] == (str(models[-1]) if models else ""), 30)
    finally:
        watching.set()
        watcher.join(5)
        _end(service)
    partial = [n for n in os.listdir(layout.serving) if n.isdigit() and int(n) not in models] if os.path.isdir(layout.serving) else []
    return {"stage": stage, "reached": reached, "killed_in": killed_in, "killed_after_s": round(killed_after, 1),
            "rerun_exit": again.returncode, "rerun_s": round(rerun_s, 1), "rerun_cached": sum(state == _CACHED for _, state in after),
            "rerun_executed": sum(state == _COMPLETE for _, state in after), "model_versions": len(models),
            "model_versions_with_verified_index": sum(verified), "index_versions": len(indexes),
            "partial_model_dirs": len(partial), "served_versions": sorted(served),
            "served_only_verified": served <= {str(v) for v, ok in zip(models, verified, strict=True) if ok},
            "serves_newest": bool(models) and str(models[-1]) in served, "rerun_error": again.stderr.strip().splitlines()[-1][:200] if again.returncode else ""}  # fmt: skip


def two_runs_one_directory(root: str) -> dict:
    """``tfhash pipeline run`` started twice on one run directory, the second once the first holds
    it (its ML Metadata has an execution): the second's exit and message, the first's exit, and
    the versions the run leaves (each verified with its index)."""
    from tfhash.artifacts import RunLayout, list_versions

    config = tiny_pipeline_config(root, f"twice-{time.time_ns()}")
    layout = RunLayout.from_config_file(config)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, "-m", "tfhash.cli", "pipeline", "run", "--config", config]
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        holding = wait_for(lambda: first.poll() is None and bool(executions(layout.metadata)), 600)
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        first_exit = first.wait(1800)
    finally:
        _end(first)
    models = list_versions(layout.serving)
    verified = [subprocess.run([sys.executable, "-m", "tfhash.cli", "index", "verify", os.path.join(layout.indexes, str(v)),
                                "--model-dir", os.path.join(layout.serving, str(v))], capture_output=True, env=env).returncode == 0
                for v in models]  # fmt: skip
    return {"second_started_while_first_held": holding, "second_exit": second.returncode,
            "second_names_the_holder": f"pid {first.pid}" in second.stderr, "second_message": second.stderr.strip().splitlines()[-1][:160],
            "first_exit": first_exit, "model_versions": len(models), "model_versions_with_verified_index": sum(verified)}  # fmt: skip


def strangers(setup: dict, root: str) -> dict:
    """The access matrix (:mod:`tfhash.serving.access`) against a service with TLS and a token, one
    with an expired certificate, and one that asks for client certificates: every request's
    outcome, and how many reached a search (only the valid ones may)."""
    from tfhash.serving.access import Access

    from benchmarks.certificates import make_certificates

    pki = make_certificates(os.path.join(root, f"pki-{time.time_ns()}"))
    files = {**setup, **pki}
    token, wrong = (open(pki[name]).read().strip() for name in ("token", "wrong_token"))
    outcomes, reached, valid = {}, 0, 0
    services = {
        "TLS + token": (Access(tls_cert=pki["server"], tls_key=pki["server_key"], token_file=pki["token"]), {
            "valid": (dict(ca_file=pki["ca"], token=token), dict(token=token, ca=pki["ca"])),
            "no token": (dict(ca_file=pki["ca"]), dict(ca=pki["ca"])),
            "wrong token": (dict(ca_file=pki["ca"], token=wrong), dict(token=wrong, ca=pki["ca"])),
            "plaintext": (dict(token=token), dict(token=token, tls=False)),
            "another CA": (dict(ca_file=pki["other_ca"], token=token), dict(token=token, ca=pki["other_ca"]))}),
        "expired server certificate": (Access(tls_cert=pki["expired_server"], tls_key=pki["expired_server_key"], token_file=pki["token"]), {
            "trusting client": (dict(ca_file=pki["ca"], token=token), dict(token=token, ca=pki["ca"]))}),
        "client certificates": (Access(tls_cert=pki["server"], tls_key=pki["server_key"], client_ca=pki["ca"]), {
            "own certificate": (dict(ca_file=pki["ca"], cert_file=pki["client"], key_file=pki["client_key"]),
                                dict(ca=pki["ca"], cert=(pki["client"], pki["client_key"]))),
            "none": (dict(ca_file=pki["ca"]), dict(ca=pki["ca"])),
            "expired": (dict(ca_file=pki["ca"], cert_file=pki["expired_client"], key_file=pki["expired_client_key"]),
                        dict(ca=pki["ca"], cert=(pki["expired_client"], pki["expired_client_key"]))),
            "another CA's": (dict(ca_file=pki["ca"], cert_file=pki["stranger"], key_file=pki["stranger_key"]),
                             dict(ca=pki["ca"], cert=(pki["stranger"], pki["stranger_key"])))}),
    }  # fmt: skip
    for service_name, (access, clients) in services.items():
        server, answered = counted_server(files, access)
        try:
            for client, (grpc_credentials, rest_credentials) in clients.items():
                outcomes[f"{service_name}, {client}, gRPC"] = grpc_outcome(server, files, **grpc_credentials)
                outcomes[f"{service_name}, {client}, REST"] = rest_outcome(server, files, **rest_credentials)
        finally:
            server.stop(0)
        reached += len(answered)
        valid += sum(v == "ok" for k, v in outcomes.items() if k.startswith(service_name))
    refused = {k: v for k, v in outcomes.items() if v != "ok"}
    return {"requests": len(outcomes), "answered": len(outcomes) - len(refused), "refused": len(refused),
            "reached_a_search": reached, "served_without_valid_credentials": reached - valid,
            "refusals": dict(Counter(refused.values())), "answered_by": sorted(k for k, v in outcomes.items() if v == "ok")}  # fmt: skip


def counted_server(files: dict, access):
    """A started search service of ``files``' version whose searches are counted (a refused
    request must never reach one): (server, the sizes of the queries that reached a search)."""
    from tfhash.serving.requests import Limits
    from tfhash.serving.search_service import SearchServer, in_process_searcher

    searcher = in_process_searcher(files["models"], files["indexes"], limits=Limits(max_batch=64, max_k=100))
    answered, answer = [], searcher.answer

    def counting(query, timeout):
        answered.append(query.size)
        return answer(query, timeout)

    searcher.answer = counting
    return SearchServer(searcher, rest_port=0, poll_seconds=60, access=access).start(), answered


def grpc_outcome(server, files: dict, **credentials) -> str:
    """``ok`` (the library's answer) or the gRPC status name of one search over gRPC."""
    from tfhash.serving.access import ClientCredentials
    from tfhash.serving.errors import ServingError
    from tfhash.serving.search_client import SearchClient

    try:
        with SearchClient(f"localhost:{server.port}", timeout=10, credentials=ClientCredentials(**credentials)) as client:
            answer = client.search(features=files["queries"]["features"], k=10)
    except ServingError as err:
        return err.code.name
    return "ok" if np.array_equal(np.stack(answer.ids), files["expected"].ids) else "wrong"


def rest_outcome(server, files: dict, path: str = "/v1/search", token: str | None = None, ca: str | None = None,
                 cert: tuple[str, str] | None = None, tls: bool = True) -> str:  # fmt: skip
    """``ok``, ``wrong``, the HTTP status, or ``handshake`` (the TLS handshake or connection failed)
    of one REST call; a 401 must carry ``WWW-Authenticate: Bearer`` and UNAUTHENTICATED."""
    import http.client
    import ssl

    if tls:
        context = ssl.create_default_context(cafile=ca)
        if cert:
            context.load_cert_chain(*cert)
        connection = http.client.HTTPSConnection("localhost", server.rest_port, timeout=10, context=context)
    else:
        connection = http.client.HTTPConnection("localhost", server.rest_port, timeout=10)
    body = json.dumps({"features": files["queries"]["features"].tolist(), "k": 10}).encode() if path == "/v1/search" else None
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        connection.request("POST" if body else "GET", path, body=body, headers=headers)
        response = connection.getresponse()
        status, payload = response.status, json.loads(response.read() or b"null")
    except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
        return "handshake"
    finally:
        connection.close()
    if status == 401 and not (response.getheader("WWW-Authenticate", "").startswith("Bearer") and payload["error"]["code"] == "UNAUTHENTICATED"):
        return "401 without its Bearer challenge"
    if status != 200:
        return str(status)
    if path == "/v1/search" and not np.array_equal(np.array([r["ids"] for r in payload["results"]]), files["expected"].ids):
        return "wrong"
    return "ok"


def _pooled(trials: list[dict]) -> dict:
    """The trials of one row in one: counts summed, maxima as the largest, times and rates as
    min-max, flags as how many held, the rest as seen."""
    pooled: dict = {}
    for key in trials[0]:
        values = [t[key] for t in trials]
        if all(isinstance(v, bool) for v in values):
            pooled[key] = f"{sum(values)}/{len(values)}"
        elif key.startswith("max_"):
            pooled[key] = max(values)
        elif key.endswith("_exit"):  # exit statuses: the ones seen, never a sum
            pooled[key] = sorted(set(values)) if len(set(values)) > 1 else values[0]
        elif key.endswith("_s") or key.startswith("rate_"):
            pooled[key] = f"{min(values):g}-{max(values):g}"
        elif all(isinstance(v, int) for v in values):
            pooled[key] = sum(values)
        elif all(isinstance(v, dict) for v in values):
            pooled[key] = dict(sum((Counter(v) for v in values), Counter()))
        else:
            pooled[key] = values[0] if len({json.dumps(v) for v in values}) == 1 else [str(v)[:80] for v in values][:3]
    return pooled


def campaign(root: str, trials: int, seed: int, only: tuple[str, ...] = ()) -> list[dict]:
    """Every row (those whose fault names one of ``only``, when given), ``trials`` times (the
    damaged versions and the pipeline stages: ``trials`` spread over them; the full disks, the
    memory, the strangers and the two runs: once each, they are deterministic)."""
    rng = random.Random(seed)
    rows = []
    with fixture_versions(root) as setup:
        plan = [("SIGKILL of one of two search processes under load", lambda: search_child_killed(setup, rng), trials),
                ("SIGKILL of the supervising parent under load", lambda: parent_killed(setup, rng), trials),
                ("SIGKILL of the model server under load", lambda: model_server_killed(setup, rng), trials),
                ("disk full while an index version is saved", lambda: full_disk(setup, root, "index"), 1),
                ("disk full while TFX's Pusher pushes a model", lambda: full_disk(setup, root, "push"), 1),
                ("32 clients sending the costliest accepted request", lambda: memory_under_load(setup, root), 1),
                ("strangers: TLS, a bearer token, client certificates (search gRPC and REST)", lambda: strangers(setup, root), 1)]  # fmt: skip
        plan += [(f"pipeline SIGKILLed in {stage}, then run again", lambda stage=stage: pipeline_killed(root, stage, rng),
                  max(1, trials // len(PIPELINE_STAGES))) for stage in PIPELINE_STAGES]  # fmt: skip
        plan += [("two tfhash pipeline run on one run directory at once", lambda: two_runs_one_directory(root), 1)]
        plan += [(f"damaged version: {damage}", lambda damage=damage: damaged_version(setup, root, damage, rng), max(1, trials // len(DAMAGES)))
                 for damage in DAMAGES]  # fmt: skip
        for fault, run, count in plan:
            if only and not any(word in fault for word in only):
                continue
            started = time.monotonic()
            results = [run() for _ in range(count)]
            rows.append({"fault": fault, "trials": count, "seconds": round(time.monotonic() - started, 1), **_pooled(results)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="+", default=(), help="run only the rows whose fault names one of these words; "
                        "the other rows of the results file are kept")  # fmt: skip
    parser.add_argument("--name", default="faults")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tfhash-faults-") as root:
        rows = campaign(root, args.trials, args.seed, tuple(args.only))
    seconds = round(time.monotonic() - started, 1)
    runs = [{"command": " ".join(["python -m tests.faults", f"--trials {args.trials}", f"--seed {args.seed}",
                                  *([f"--only {' '.join(repr(w) for w in args.only)}"] if args.only else [])]),
             "seconds": seconds, "rows": [r["fault"] for r in rows]}]  # fmt: skip
    previous = RESULTS_DIR / f"{args.name}.json"
    if args.only and previous.is_file():  # the rows not run again stay, in the campaign's order
        kept = json.loads(previous.read_text())
        fresh = {r["fault"]: r for r in rows}
        rows = [fresh.pop(r["fault"], r) for r in kept["rows"]] + list(fresh.values())
        runs = kept.get("runs", [{"command": f"python -m tests.faults --trials {kept['settings']['trials']} --seed {kept['settings']['seed']}",
                                  "seconds": kept["settings"]["seconds"]}]) + runs  # fmt: skip
    table = markdown_table([{"fault": r["fault"], "trials": r["trials"], "answered wrongly": r.get("wrong", 0),
                             "observed": "; ".join(f"{k} {v}" for k, v in r.items() if k not in ("fault", "trials", "wrong"))} for r in rows],
                           ["fault", "trials", "answered wrongly", "observed"])  # fmt: skip
    commands = "; ".join(f"`{run['command']}`: {run['seconds']} s" for run in runs)
    write_results(args.name, {"settings": {"trials": args.trials, "seed": args.seed, "clients": CLIENTS, "seconds": seconds}, "runs": runs,
                              "rows": rows},
                  f"# Fault campaign\n\n{commands}; {CLIENTS} client threads.\n\n{table}\n")  # fmt: skip


if __name__ == "__main__":
    main()
