"""The suite's two tiers, marked by what a test starts, and the guard that keeps the marks true.

A test that starts a process, listens on a port or runs a Beam job carries the marker of each
(:data:`MARKERS`): on the test itself, on its module (``pytestmark``), or through a fixture it uses
that declares them with :func:`starts`. The fast tier (``scripts/run_tests.sh --fast``) is every
test without any of them; the whole suite runs them all.

The guard is on in both tiers: a test that starts what it is not marked for fails, naming what it
started, where, and the marker to add. (The start itself goes ahead: refused inside a library's
own thread, it would hang the library rather than fail the test.) Fixtures of a wider scope start
their processes while the first test that uses them is being set up, so a test is checked against
the markers of all the fixtures it uses.
"""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import sys
import threading

import pytest

#: marker -> what a test that carries it may start.
MARKERS = {
    "process": "starts a process: a subprocess, a multiprocessing worker, Milvus Lite, a Beam worker",
    "server": "listens on a port: a gRPC server, the REST front, the development model server",
    "beam": "runs a Beam job (every TFX pipeline run does); Beam's runner listens for its workers itself",
}
#: What a marker allows beyond itself: a Beam job's runner serves its workers over gRPC (and TFX's
#: launcher picks free ports by listening on them).
IMPLIED = {"beam": {"server"}}

_FIXTURE_STARTS = "_tfhash_starts"


def starts(*markers: str):
    """Declare what a fixture starts; every test that uses the fixture gets these markers::

        @pytest.fixture(scope="module")
        @starts("server")
        def service(): ...
    """
    unknown = set(markers) - set(MARKERS)
    if unknown:
        raise ValueError(f"unknown tier markers {sorted(unknown)}; use {sorted(MARKERS)}")

    def declare(function):
        setattr(function, _FIXTURE_STARTS, markers)
        return function

    return declare


class _Guard:
    """Which markers the running test carries, and what it started beyond them."""

    def __init__(self):
        self.item = None
        self.allowed: frozenset[str] = frozenset(MARKERS)  # outside a test (collection): anything
        self.violations: list[str] = []
        self.lock = threading.Lock()

    def check(self, marker: str, what: str) -> None:
        if marker in self.allowed or _importing():
            return
        message = (f"{self.item.nodeid} {what}{_where()}, but is not marked '{marker}' ({MARKERS[marker]}): add "
                   f"@pytest.mark.{marker} to the test, or declare it on the fixture that starts it with "
                   f"tests.tiers.starts('{marker}')")  # fmt: skip
        with self.lock:
            self.violations.append(message)


_GUARD = _Guard()


def _where() -> str:
    """`` at <file>:<line>`` of the innermost test-suite frame of the call (empty in a library thread)."""
    frame = sys._getframe(3)
    while frame is not None:
        name = frame.f_code.co_filename
        if os.sep + "tests" + os.sep in name and not name.endswith("tiers.py"):
            return f" at {os.path.relpath(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def _importing() -> bool:
    """Whether a module is being imported: some libraries run a command once at import (NumPy's
    testing module runs ``lscpu``, h5py ``uname -p``); that is not what a test starts."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib."):
            return True
        frame = frame.f_back
    return False


def _wrap(owner, name: str, marker: str, describe) -> None:
    original = getattr(owner, name)

    def guarded(*args, **kwargs):
        _GUARD.check(marker, describe(*args, **kwargs))
        return original(*args, **kwargs)

    guarded.__wrapped__ = original
    setattr(owner, name, guarded)


def _command(args) -> str:
    return " ".join(os.fsdecode(a) for a in args[:4]) + (" ..." if len(args) > 4 else "")


def _install() -> None:
    import apache_beam.pipeline
    import grpc
    import grpc.aio
    from joblib.externals.loky import cpu_count

    # A probe of the machine that a library runs once and keeps (loky counts the physical cores
    # with lscpu for scikit-learn) runs now, not in whichever test needs it first.
    cpu_count(only_physical_cores=True)

    # Every way a Python process starts another: subprocess and multiprocessing's spawn and
    # forkserver go through fork_exec, multiprocessing's fork through os.fork.
    _wrap(_posixsubprocess, "fork_exec", "process", lambda args, *_, **__: f"starts the process '{_command(args)}'")
    for name in ("fork", "forkpty"):
        _wrap(os, name, "process", lambda *_, _name=name, **__: f"calls os.{_name}()")
    for name in ("posix_spawn", "posix_spawnp", "system"):
        _wrap(os, name, "process", lambda first, *_, _name=name, **__: f"starts '{first}' with os.{_name}")
    _wrap(socket.socket, "listen", "server", lambda sock, *_, **__: f"listens on {sock.getsockname()}")
    _wrap(grpc, "server", "server", lambda *_, **__: "creates a gRPC server")
    _wrap(grpc.aio, "server", "server", lambda *_, **__: "creates a gRPC asyncio server")
    _wrap(apache_beam.pipeline.Pipeline, "run", "beam", lambda *_, **__: "runs a Beam job")


def markers_of(item) -> set[str]:
    """The tier markers of a test: its own, its module's and class's, and its fixtures'."""
    found = {mark.name for mark in item.iter_markers() if mark.name in MARKERS}
    info = getattr(item, "_fixtureinfo", None)  # pytest's record of the fixtures a test uses
    for definitions in (info.name2fixturedefs.values() if info is not None else ()):
        for definition in definitions:
            found.update(getattr(definition.func, _FIXTURE_STARTS, ()))
    return found


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help=f"the fast tier: leave out the tests marked {', '.join(MARKERS)} (tests/tiers.py)")  # fmt: skip


def pytest_configure(config):
    for marker, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{marker}: {meaning}")
    _install()


def pytest_collection_modifyitems(config, items):
    for item in items:  # fixtures' declarations become the test's markers, so -m selects by them too
        for marker in markers_of(item) - {mark.name for mark in item.iter_markers()}:
            item.add_marker(marker)
    if config.getoption("fast"):
        slow = [item for item in items if markers_of(item)]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not markers_of(item)]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    markers = markers_of(item)
    _GUARD.item, _GUARD.allowed, _GUARD.violations = item, frozenset(markers.union(*(IMPLIED.get(m, set()) for m in markers))), []
    try:
        return (yield)
    finally:
        _GUARD.item, _GUARD.allowed = None, frozenset(MARKERS)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if _GUARD.violations and report.outcome != "skipped":  # the phase (setup, call, teardown) that started it fails
        text = "\n".join(_GUARD.violations)
        if report.failed:
            report.sections.append(("tier markers", text))
        else:
            report.outcome, report.longrepr = "failed", text
        _GUARD.violations = []  # reported once
    return report
