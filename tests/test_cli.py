"""The tfhash command line, run as a user would (click's runner, real files)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from tfhash.cli import main


def test_help_lists_commands():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for command in ("quickstart", "evaluate", "data"):
        assert command in result.output


def test_evaluate_writes_metrics_and_plots(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 60)
    codes = np.where(rng.random((60, 16)) < 0.5, -1, 1).astype(np.int8)
    codes[:, 0] = np.where(labels == 0, 1, -1)
    path = tmp_path / "codes.npz"
    np.savez(path, query_codes=codes[:10], db_codes=codes[10:], query_labels=labels[:10], db_labels=labels[10:])
    result = CliRunner().invoke(main, ["evaluate", str(path), "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert 0.0 <= written["metrics"]["mAP@all"] <= 1.0
    for png in ("pr_curve.png", "precision_at_n.png", "tsne.png"):
        assert (tmp_path / "out" / png).read_bytes()[:4] == b"\x89PNG"


def test_evaluate_refuses_bad_files(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an npz")
    result = CliRunner().invoke(main, ["evaluate", str(bad), "--output-dir", str(tmp_path / "o")])
    assert result.exit_code == 2 and "not a readable .npz" in result.output
    partial = tmp_path / "partial.npz"
    np.savez(partial, query_codes=np.ones((2, 8), np.int8))
    result = CliRunner().invoke(main, ["evaluate", str(partial), "--output-dir", str(tmp_path / "o")])
    assert result.exit_code == 2 and "missing arrays" in result.output


def test_missing_data_root_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["data", "info", "mnist", "--data-root", str(tmp_path)])
    assert result.exit_code == 2 and "looked for" in result.output


@pytest.mark.slow
def test_quickstart_end_to_end_on_mnist(tmp_path):
    """README command 1 in small: one epoch at 16 bits on the real MNIST files."""
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["quickstart", "--bits", "16", "--epochs", "1", "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    assert "mAP@all:" in result.output.splitlines()[-1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"]["split"]["train"] == 5000 and summary["seed"] == 0
    assert summary["mAP@all"] > 0.5  # one epoch already separates digits far above chance (0.1)
    with np.load(out / "codes.npz") as codes:
        assert codes["db_codes"].shape == (69000, 2)


def test_index_build_search_info(tmp_path):
    rng = np.random.default_rng(1)
    db = rng.choice(np.array([-1, 1], np.int8), size=(300, 32))
    np.savez(tmp_path / "codes.npz", db_codes=db, query_codes=db[:3], db_ids=np.arange(300) + 1000)
    runner = CliRunner()
    out = tmp_path / "idx"
    built = runner.invoke(main, ["index", "build", str(tmp_path / "codes.npz"), "--ids-array", "db_ids",
                                 "--output", str(out), "--model-version", "4", "--batch-size", "100"])  # fmt: skip
    assert built.exit_code == 0, built.output
    found = runner.invoke(main, ["index", "search", str(out), "--queries", str(tmp_path / "codes.npz"), "-k", "2",
                                 "--expected-model-version", "4"])  # fmt: skip
    assert found.exit_code == 0, found.output
    first = json.loads(found.output.splitlines()[0])
    assert first["ids"][0] == 1000 and first["distances"][0] == 0
    shown = runner.invoke(main, ["index", "info", str(out)])
    assert json.loads(shown.output)["model"]["version"] == "4"
    wrong = runner.invoke(main, ["index", "search", str(out), "--queries", str(tmp_path / "codes.npz"), "-k", "301"])
    assert wrong.exit_code != 0 and "larger than the 300 items" in wrong.output
    stale = runner.invoke(main, ["index", "search", str(out), "--queries", str(tmp_path / "codes.npz"),
                                 "--expected-model-version", "5"])  # fmt: skip
    assert stale.exit_code != 0 and "model version" in stale.output
