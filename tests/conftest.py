"""The suite's plugins (tests/tiers.py: the two tiers and their guard; tests/workers.py: how the
tests spread over pytest-xdist's workers) and one scratch folder for the session.

Beam's stager, TFX's module packaging and Milvus Lite's logs write into the temporary folder and
leave their files there; the session points ``TMPDIR`` (inherited by every subprocess and Beam
worker) at a folder of its own and removes it at the end, passed or failed: a full run leaves
gigabytes there, and runs kept after failures once filled a CI disk. ``TFHASH_KEEP_TEST_SCRATCH=1``
keeps it (and prints where) for looking into a failure."""

from __future__ import annotations

import os
import shutil
import tempfile

pytest_plugins = ["tests.tiers", "tests.workers"]

_SCRATCH = {}


def pytest_configure(config):
    _SCRATCH["path"] = tempfile.mkdtemp(prefix="tfhash-tests-")
    _SCRATCH["previous"] = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = _SCRATCH["path"]
    tempfile.tempdir = None  # read TMPDIR again


def pytest_unconfigure(config):
    path = _SCRATCH.pop("path", None)
    if path is None:
        return
    previous = _SCRATCH.pop("previous")
    if previous is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = previous
    tempfile.tempdir = None
    if os.environ.get("TFHASH_KEEP_TEST_SCRATCH") == "1":
        print(f"\ntest scratch kept at {path} (TFHASH_KEEP_TEST_SCRATCH=1)")
    else:
        shutil.rmtree(path, ignore_errors=True)
