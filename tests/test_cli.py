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
