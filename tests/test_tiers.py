"""The suite's tiers (tests/tiers.py) hold: a small suite run by pytest in a new process, where a
test that starts a process, listens on a port or runs a Beam job without its marker fails, a
marked one passes, a fixture's declaration marks its tests, and --fast leaves the marked out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]

SUITE = '''
import socket
import subprocess
import sys

import apache_beam as beam
import pytest

from tests.tiers import starts


def test_unmarked_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.process
def test_marked_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_unmarked_listen():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()


def test_unmarked_beam():
    with beam.Pipeline() as pipeline:
        pipeline | beam.Create([1, 2]) | beam.Map(lambda x: x)


@pytest.mark.beam
def test_marked_beam():
    with beam.Pipeline() as pipeline:
        pipeline | beam.Create([1, 2]) | beam.Map(lambda x: x)


@pytest.fixture(scope="module")
@starts("server")
def listening():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()


def test_through_a_declaring_fixture(listening):
    assert listening[1] > 0


def test_a_caught_start_still_fails():
    try:
        subprocess.run([sys.executable, "-c", "raise SystemExit(3)"], check=True)
    except subprocess.CalledProcessError:
        pass  # the code under test went on: the guard still fails the test


def test_nothing_started():
    assert True
'''


@pytest.fixture
def suite(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    pytester.makeconftest('pytest_plugins = ["tests.tiers"]\n')
    pytester.makepyfile(test_small=SUITE)
    return pytester


@pytest.mark.process
def test_a_start_without_its_marker_fails_the_test_and_names_the_marker(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=4, failed=4)
    failed = {line.split("::")[1].split(" ")[0] for line in result.outlines if line.startswith("FAILED")}
    assert failed == {"test_unmarked_process", "test_unmarked_listen", "test_unmarked_beam", "test_a_caught_start_still_fails"}
    text = result.stdout.str()
    assert "test_unmarked_process starts the process" in text and "but is not marked 'process'" in text
    assert "test_unmarked_listen listens on" in text and "but is not marked 'server'" in text
    assert "test_unmarked_beam runs a Beam job" in text and "@pytest.mark.beam" in text


@pytest.mark.process
def test_the_fast_tier_leaves_out_every_marked_test(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", "--fast", "-v")
    result.assert_outcomes(passed=1, failed=4, deselected=3)
    ran = {line.split("::")[1].split(" ")[0] for line in result.outlines if "::" in line and ("PASSED" in line or "FAILED" in line)}
    assert not ran & {"test_marked_process", "test_marked_beam", "test_through_a_declaring_fixture"}
