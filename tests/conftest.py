"""The suite's plugins (tests/tiers.py: the two tiers and their guard; tests/workers.py: how the
tests spread over pytest-xdist's workers) and one scratch folder for the session.

Beam's stager, TFX's module packaging and Milvus Lite's logs write into the temporary folder and
leave their files there; the session points ``TMPDIR`` (inherited by every subprocess and Beam
worker) at a folder of its own and removes it at the end, passed or failed: a full run leaves
gigabytes there, and runs kept after failures once filled a CI disk. The library's cache folder
(``TFHASH_CACHE_DIR``: local copies of remote files) is in it too. ``TFHASH_KEEP_TEST_SCRATCH=1``
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
    # local copies of remote files and the ML Metadata of remote runs (tfhash.storage.cache_dir)
    _SCRATCH["cache"] = os.environ.get("TFHASH_CACHE_DIR")
    os.environ["TFHASH_CACHE_DIR"] = os.path.join(_SCRATCH["path"], "tfhash-cache")


def pytest_unconfigure(config):
    path = _SCRATCH.pop("path", None)
    if path is None:
        return
    for key, previous in (("TMPDIR", _SCRATCH.pop("previous")), ("TFHASH_CACHE_DIR", _SCRATCH.pop("cache"))):
        if previous is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = previous
    tempfile.tempdir = None
    if os.environ.get("TFHASH_KEEP_TEST_SCRATCH") == "1":
        print(f"\ntest scratch kept at {path} (TFHASH_KEEP_TEST_SCRATCH=1)")
    else:
        shutil.rmtree(path, ignore_errors=True)
