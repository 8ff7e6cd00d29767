"""How the suite spreads over pytest-xdist's workers (``scripts/run_tests.sh`` runs two, one a
core, with ``--dist loadfile``).

Each test file runs whole on one worker, so that its module fixtures (a trained model, a service)
and the session fixtures only it uses (the small pipeline run of ``test_pipeline.py``) are made
once: a fixture that several files read is defined in one of them, never in ``conftest.py``. The
files go out longest first, by the last recorded run of ``benchmarks/results/test_durations.json``
(``python -m benchmarks.test_suite``), so that the longest file does not start last; without that
file, in the order pytest collects them.
"""

from __future__ import annotations

import json
from pathlib import Path

DURATIONS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "test_durations.json"


def recorded_seconds() -> dict[str, float]:
    """Seconds per test of the last recorded run, by node id (empty when there is none)."""
    try:
        data = json.loads(DURATIONS.read_text())
        return data["runs"][data["latest"]]["tests"]
    except (OSError, ValueError, KeyError):
        return {}


def file_of(item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    if getattr(config.option, "dist", "no") == "no" and not hasattr(config, "workerinput"):
        return  # a run in one process keeps pytest's order
    seconds = recorded_seconds()
    files: dict[str, float] = {}
    for item in items:
        files[file_of(item)] = files.get(file_of(item), 0.0) + seconds.get(item.nodeid, 0.0)
    rank = {name: i for i, name in enumerate(sorted(files, key=lambda name: -files[name]))}  # ties keep pytest's order
    items.sort(key=lambda item: rank[file_of(item)])
